"""`shale bucket ls` and `shale tombstones` say what a newcomer needs (issue 29, case 10): a header, the topic and
kind of each block (quarantine blocks apart from data blocks), times with their zone, what "fresh" means, and the
tombstone that `shale trace` points to."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
from click.testing import CliRunner
from tests.factories import BASE_MS, backup_table

from shale.cli import cli
from shale.config import BucketConfig, IngestConfig, ParserRule, load_config
from shale.encoder.chunks import Chunk, GroupSpec, write_chunk
from shale.metastore import AddBlocks, ReplaceBlocks, open_metastore
from shale.objstore import open_bucket


def _sets(tmp_path: Path, sync_delay: str) -> list[str]:
    return ["--set", f"bucket.url=file://{tmp_path}/bucket", "--set", f"metastore.data_dir={tmp_path}/meta",
            "--set", f"block.sync_delay={sync_delay}"]


def _write(tmp_path: Path) -> list[str]:
    """A chunk of 4 records of topic app, 2 not JSON: one records block and one quarantine block."""
    bucket = BucketConfig(url=f"file://{tmp_path}/bucket")
    table = backup_table("app", 0, 0, 4)
    values = [b"not json", b"{", json.dumps({"ts": "2026-11-25T07:36:05Z"}).encode(),
              json.dumps({"ts": "2026-11-25T07:36:06Z"}).encode()]
    table = table.set_column(table.schema.get_field_index("value"), "value", pa.array(values, pa.binary()))
    ingest = IngestConfig(default_tenant="acme", parsers=[ParserRule(parser="json", options={"time_field": "ts"})])
    written = write_chunk(GroupSpec("partition", 1, bucket, ingest), open_bucket(bucket), table,
                          Chunk("app", 0, "", 0, 4, BASE_MS + 3650 * 86_400_000))
    config = load_config(env={}, overrides=[s for s in _sets(tmp_path, "0") if s != "--set"])
    metastore = open_metastore(config)
    metastore.submit(AddBlocks(blocks=written.blocks)).raise_for_rejection()
    return [m.id for m in written.blocks]


def test_bucket_ls_has_a_header_topic_kind_zoned_times_and_explains_fresh(tmp_path: Path) -> None:
    ids = _write(tmp_path)
    out = CliRunner().invoke(cli, [*_sets(tmp_path, "1h"), "bucket", "ls", "--tenant", "acme"]).output
    lines = out.splitlines()
    assert lines[0].split()[:6] == ["BLOCK", "STATE", "LEVEL", "GROUP", "KIND", "TOPIC"]
    rows = {line.split()[0]: line.split() for line in lines[1:] if line.split()[0] in ids}
    assert sorted(r[4] for r in rows.values()) == ["quarantine", "records"]
    assert all(r[5] == "app" and r[1] == "fresh" for r in rows.values())
    assert all(r[-1].endswith("Z") and r[-2].endswith("Z") for r in rows.values())
    assert lines[-1].startswith("fresh: younger than block.sync_delay (3600s)")
    rows_json = [json.loads(line) for line in CliRunner().invoke(
        cli, [*_sets(tmp_path, "0"), "bucket", "ls", "--tenant", "acme", "--json"]).output.splitlines()]
    assert {r["kind"] for r in rows_json} == {"records", "quarantine"}


def test_tombstones_list_what_trace_cannot_find(tmp_path: Path) -> None:
    ids = _write(tmp_path)
    config = load_config(env={}, overrides=[s for s in _sets(tmp_path, "0") if s != "--set"])
    open_metastore(config).submit(ReplaceBlocks(tenant="acme", sources=[ids[0]], blocks=[],
                                                reason="compacted")).raise_for_rejection()
    runner = CliRunner()
    trace = runner.invoke(cli, [*_sets(tmp_path, "0"), "trace", ids[0]])
    assert f"shale tombstones --block {ids[0]}" in trace.output
    listed = runner.invoke(cli, [*_sets(tmp_path, "0"), "tombstones", "--block", ids[0]])
    assert listed.exit_code == 0, listed.output
    header, row = listed.output.splitlines()
    assert header.split() == ["BLOCK", "TENANT", "REMOVED", "(UTC)", "FILES", "REASON"]
    assert row.split()[:2] == [ids[0], "acme"]
    assert row.split()[2].endswith("Z")
    assert row.split()[-1] == "compacted"
    missing = runner.invoke(cli, [*_sets(tmp_path, "0"), "tombstones", "--block", ids[1]])
    assert missing.exit_code == 1
    assert "it is live" in missing.output


def test_bucket_ls_says_which_fresh_blocks_a_newer_block_already_holds(tmp_path: Path) -> None:
    from tests.factories import write_backup_block

    from shale.block import BlockSpec, DatasetInput, write_block
    from shale.block.ids import deterministic_block_id

    bucket = open_bucket(BucketConfig(url=f"file://{tmp_path}/bucket"))
    a = write_backup_block(bucket, "acme", "app", 0, 0, 10)
    b = write_backup_block(bucket, "acme", "app", 0, 10, 10)
    merged = write_block(bucket, BlockSpec(id=deterministic_block_id(BASE_MS, "ab"), tenant="acme", group="backup",
                                           level=1, sources=[a.id, b.id], parents=[a.id, b.id]),
                         [DatasetInput("records", "app", backup_table("app", 0, 0, 20), "timestamp")])
    out = CliRunner().invoke(cli, [*_sets(tmp_path, "1h"), "bucket", "ls", "--tenant", "acme"]).output
    states = {line.split()[0]: line.split()[1:4] for line in out.splitlines()[1:] if line.split()}
    assert states[a.id][:3] == ["fresh", "(in", f"{merged.id})"]
    assert states[b.id][:3] == ["fresh", "(in", f"{merged.id})"]
    assert states[merged.id][:2] == ["fresh", "L1"]
    assert "'fresh (in X)': its records are in the newer block X too" in out
