"""``shale bucket repair``: a dry run by default (a table, or JSON), --group, and --apply only with the metastore."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner
from tests.factories import write_backup_block

from shale.block import BlockFetcher, BlockState
from shale.cli import cli
from shale.metastore import AddBlocks, encode
from shale.metastore.rules.fsm import Entry, StateMachine
from shale.objstore import open_bucket_url


def _run(root: Path, *args: str) -> tuple[int, str]:
    """Exit code and output; with --json, standard output only (the log goes to standard error)."""
    result = CliRunner().invoke(cli, ["--set", f"bucket.url=file://{root}", "--set", "block.sync_delay=0",
                                      "--set", f"metastore.data_dir={root.parent / 'metastore'}", *args])
    return result.exit_code, result.stdout if "--json" in args else result.output


def test_dry_run_then_apply_with_the_metastore(tmp_path: Path) -> None:
    root = tmp_path / "bucket"
    bucket = open_bucket_url(f"file://{root}")
    whole = write_backup_block(bucket, "acme", "app", 0, 0, 100)
    inner = write_backup_block(bucket, "acme", "app", 0, 10, 10)
    listing = [(o.key, o.size, o.etag) for o in bucket.list("")]

    # Without the metastore: the bucket's view alone, and nothing may be applied.
    code, out = _run(root, "bucket", "repair", "--tenant", "acme")
    assert code == 0, out
    assert "WITHOUT the metastore" in out
    assert "dry run: nothing changed" in out
    assert "drop" in out
    assert inner.id in out
    assert f"its records are all in {whole.id}" in out
    code, out = _run(root, "bucket", "repair", "--tenant", "acme", "--json")
    plan = json.loads(out)
    assert [(s["action"], s["blocks"], s["evidence"]["held_by"]) for s in plan["steps"]] == [
        ("drop", [inner.id], [whole.id])]
    assert plan["metastore"] is False
    assert plan["applied"] is None
    code, out = _run(root, "bucket", "repair", "--tenant", "acme", "--apply")
    assert code == 1
    assert "nothing was applied: the metastore cannot be reached" in out
    assert "shale metastore rebuild --from-bucket" in out
    assert [(o.key, o.size, o.etag) for o in bucket.list("")] == listing

    # With the embedded metastore indexing both blocks (an old bug): --group filters, --apply drops the inner one.
    state = StateMachine(root.parent / "metastore" / "state.db")
    assert state.apply(Entry(1, 1, 0), encode(AddBlocks(blocks=[whole, inner]))).ok
    state.close()
    code, out = _run(root, "bucket", "repair", "--tenant", "acme", "--group", "partition", "--json")
    assert json.loads(out)["steps"] == []
    code, out = _run(root, "bucket", "repair", "--tenant", "acme", "--apply", "--json")
    assert code == 0, out
    applied = json.loads(out)
    assert applied["steps"][0]["indexed"] == [inner.id]
    assert applied["applied"]["done"] == [[inner.id]]
    assert applied["applied"]["failed"] == []
    views = BlockFetcher(bucket, 0).sync("acme").blocks
    assert views[inner.id].state is BlockState.MARKED_FOR_DELETION
    assert views[whole.id].state is BlockState.HEALTHY
    state = StateMachine(root.parent / "metastore" / "state.db")
    assert {m.id for m in state.reader.tenant_blocks("acme")} == {whole.id}
    assert [t.block_id for t in state.reader.tombstones()] == [inner.id]
    state.close()
    code, out = _run(root, "bucket", "repair", "--tenant", "acme")
    assert code == 0, out
    assert "nothing to repair" in out
