"""``shale erase`` on the command line: a dry run by default, ``--yes`` to erase, the same request again pointing
to the first, and ``shale erase status``."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import sys
from pathlib import Path
from unittest import mock

from click.testing import CliRunner
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from tests.factories import BASE_MS
from tests.unit.erase.test_erase import ERASED, _block, _iso

from shale.cli import cli
from shale.cli.erase_cmd import _key
from shale.config import load_config
from shale.metastore import AddBlocks, open_metastore
from shale.objstore import open_bucket


def _sets(tmp_path: Path) -> list[str]:
    return ["--set", f"bucket.url=file://{tmp_path}/bucket", "--set", f"metastore.data_dir={tmp_path}/meta"]


def test_a_dry_run_then_an_erasure_then_its_status(tmp_path: Path) -> None:
    config = load_config(env={}, overrides=[s for s in _sets(tmp_path) if s != "--set"])
    store = open_bucket(config.bucket)
    open_metastore(config).submit(AddBlocks(blocks=[_block(store, "backup", "app", 0, 0, 20),
                                                    _block(store, "partition", "app", 0, 0, 20)]))
    base = [*_sets(tmp_path), "erase", "--tenant", "acme", "--topic", "app", "--no-kafka"]
    dry = CliRunner().invoke(cli, [*base, "--key", ERASED.decode()])
    assert dry.exit_code == 0, dry.output
    assert "dry run, nothing changed" in dry.output
    assert "records: 3" in dry.output  # offsets 3, 10 and 17
    assert "rows to remove: backup group 3, partition group 3" in dry.output
    assert f"record app[0]@3 time {_iso(BASE_MS + 3000)} " in dry.output  # ISO 8601, not epoch milliseconds
    assert "run again with --yes" in dry.output
    done = CliRunner().invoke(cli, [*base, "--key-hex", ERASED.hex(), "--yes", "--json"])
    assert done.exit_code == 0, done.output
    report = json.loads(done.output)
    assert report["state"] == "rewriting"
    assert len(report["jobs"]) == 2
    again = CliRunner().invoke(cli, [*base, "--key-stdin", "--yes"], input=ERASED.decode() + "\n")
    assert f"the same request was made before (erasure {report['id']})" in again.output  # a new erasure
    status = CliRunner().invoke(cli, [*_sets(tmp_path), "erase", "status", report["id"]])
    assert status.exit_code == 3  # the erase jobs wait for a compaction worker
    assert "erase jobs waiting for the compaction workers: 2" in status.output
    assert f"at {_iso(report['requested_at'])}\n" in status.output
    assert report["requested_at_iso"] == _iso(report["requested_at"])
    assert report["rows_to_remove"] == {"backup": 3, "partition": 3}
    short = CliRunner().invoke(cli, [*base, "--key", ERASED.decode(), "--delete-delay", "10m", "--yes"])
    assert short.exit_code == 2  # under bucket_index.max_stale_period (1 h)
    assert "between 3600 s and block.delete_delay (7200 s), not 600 s" in short.output
    shorter = CliRunner().invoke(cli, [*base, "--key", "other", "--delete-delay", "1h", "--yes"])
    assert shorter.exit_code == 0, shorter.output
    assert "deleted 3600 s after their rewrite" in shorter.output
    both = CliRunner().invoke(cli, [*base, "--key", "x", "--key-hex", "78"])
    assert both.exit_code == 2
    assert "give the key once" in both.output


def test_an_erasure_by_a_typed_columns_value(tmp_path: Path) -> None:
    from tests.unit.erase.test_erase_column import TARGET, _blocks

    config = load_config(env={}, overrides=[s for s in _sets(tmp_path) if s != "--set"])
    open_metastore(config).submit(AddBlocks(blocks=_blocks(open_bucket(config.bucket), "orders", 0, 0,
                                                           [1, TARGET, 2, TARGET])))
    base = [*_sets(tmp_path), "erase", "--tenant", "acme", "--no-kafka", "--column", "customer.id"]
    dry = CliRunner().invoke(cli, [*base, "--value", str(TARGET)])
    assert dry.exit_code == 0, dry.output
    assert "records: 2" in dry.output
    bad = CliRunner().invoke(cli, [*base, "--value", "forty-two"])
    assert bad.exit_code == 1
    assert "'forty-two' is not a number (the column is int64)" in bad.output
    both = CliRunner().invoke(cli, [*base, "--value", "42", "--key", "x"])
    assert both.exit_code == 2
    assert "not both" in both.output
    done = CliRunner().invoke(cli, [*base, "--value-stdin", "--yes", "--json"], input=f"{TARGET}\n")
    assert done.exit_code == 0, done.output
    report = json.loads(done.output)
    assert report["matches"] == 2
    assert len(report["jobs"]) == 2
    row = open_metastore(config).erasures(report["id"])[0]
    assert row["key_sha256"] == hashlib.sha256(b"number:42").hexdigest()  # the hash, never the value


@settings(max_examples=200)
@given(key=st.binary(max_size=64), newline=st.booleans())
@example(key=ERASED + b"\n", newline=True)  # a key ending in 0x0A lost it, and matched ERASED's records instead
@example(key=b"\n\n", newline=True)
def test_key_stdin_drops_exactly_one_trailing_newline(key: bytes, newline: bool) -> None:
    """``--key-stdin`` reads the key's bytes: one trailing newline (as ``echo`` adds) is dropped, nothing else."""
    assume(newline or not key.endswith(b"\n"))  # without one, a key's own last 0x0A is the one dropped
    given = key + (b"\n" if newline else b"")
    with mock.patch.object(sys, "stdin", io.TextIOWrapper(io.BytesIO(given))):
        assert _key(None, None, None, True) == key


def test_an_auditor_runs_the_leftover_scan_again_against_a_receipt(tmp_path: Path) -> None:
    """``shale erase audit ID``: no key, no metastore; exit 1 naming the object that holds a record of the erasure,
    never the key."""
    from shale.block import erasure_receipt_key, restore_dead_letter_key

    config = load_config(env={}, overrides=[s for s in _sets(tmp_path) if s != "--set"])
    store = open_bucket(config.bucket)
    _block(store, "backup", "app", 0, 0, 20)  # the key at offsets 3, 10 and 17: produced after the request
    erasure = "0123456789abcdef"
    store.put(erasure_receipt_key("acme", erasure), json.dumps({
        "erasure": erasure, "tenant": "acme", "key_sha256": hashlib.sha256(ERASED).hexdigest(), "matched_by": "key",
        "topics": ["app"], "watermarks": [{"topic": "app", "partition": 0, "end": 3}], "positions": []}).encode())
    audit = [*_sets(tmp_path), "erase", "audit", erasure, "--tenant", "acme"]
    clean = CliRunner().invoke(cli, audit)
    assert clean.exit_code == 0, clean.output
    assert "nothing left" in clean.output
    letter = restore_dead_letter_key("acme", "r1", 0, 2)
    store.put(letter, json.dumps({"topic": "app", "partition": 0, "offset": 2, "key": base64.b64encode(ERASED)
                                  .decode(), "value": None}).encode())
    found = CliRunner().invoke(cli, audit)
    assert found.exit_code == 1, found.output
    assert f"LEFT {letter} (restore-dead-letter)" in found.output
    assert ERASED.decode() not in found.output
    as_json = CliRunner().invoke(cli, [*audit, "--json"])
    assert as_json.exit_code == 1
    assert [f["object"] for f in json.loads(as_json.output)["found"]] == [letter]


def test_the_receipt_waits_with_exit_3_while_an_orphan_holds_the_key(tmp_path: Path) -> None:
    """``shale erase status ID --receipt``: exit 3 and the orphan's object named (never the key) while a block
    the index does not know holds a record of the erasure; the receipt once it is gone."""
    from tests.unit.compactor.test_worker import ThreadRunner

    from shale.compactor.worker import CompactionWorker
    from shale.config import RetentionConfig
    from shale.metastore import MetastoreService
    from shale.metastore.api.maintenance import Maintenance

    config = load_config(env={}, overrides=[s for s in _sets(tmp_path) if s != "--set"])
    store = open_bucket(config.bucket)
    service = open_metastore(config)
    assert isinstance(service, MetastoreService)
    service.submit(AddBlocks(blocks=[_block(store, "backup", "app", 0, 0, 20)]))
    done = CliRunner().invoke(cli, [*_sets(tmp_path), "erase", "--tenant", "acme", "--topic", "app", "--no-kafka",
                                    "--key", ERASED.decode(), "--yes", "--json"])
    assert done.exit_code == 0, done.output
    erasure = json.loads(done.output)["id"]
    CompactionWorker(service, config.bucket, None, slots=4, poll_interval=0.01,
                     runner=ThreadRunner(config.bucket)).run(until_idle=True)
    Maintenance(service, store, RetentionConfig(), delete_delay=0, is_leader=lambda: True, term=lambda: 1,
                sync_delay=0).collect_tombstones()
    orphan = _block(store, "backup", "app", 0, 0, 20, generation=5)  # a lost lease's output
    receipt = [*_sets(tmp_path), "erase", "status", erasure, "--receipt"]
    waiting = CliRunner().invoke(cli, receipt)
    assert waiting.exit_code == 3, waiting.output
    assert "no receipt yet" in waiting.output
    assert f"group=backup/tenant=acme/{orphan.id}/" in waiting.output
    assert ERASED.decode() not in waiting.output
    for item in list(store.list(f"group=backup/tenant=acme/{orphan.id}/")):
        store.delete(item.key)
    written = CliRunner().invoke(cli, receipt)
    assert written.exit_code == 0, written.output
    assert json.loads(written.output)["leftover_scan"]["leftovers"] == 0
