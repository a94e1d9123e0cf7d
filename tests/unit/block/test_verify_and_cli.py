"""`shale bucket` commands and the verifier, on a local-filesystem bucket."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner
from tests.factories import BASE_MS, backup_table, write_backup_block

from shale.block import (
    BlockFetcher,
    BlockSpec,
    DatasetInput,
    KafkaRange,
    Place,
    block_file_key,
    deterministic_block_id,
    write_block,
    write_quarantine_mark,
)
from shale.block.verify import verify_tenant
from shale.cli import cli
from shale.metastore import AddBlocks, encode
from shale.metastore.rules.fsm import Entry, StateMachine
from shale.objstore import ObstoreBucket, open_bucket_url


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "bucket"


@pytest.fixture
def bucket(root: Path) -> ObstoreBucket:
    return open_bucket_url(f"file://{root}")


def _run(root: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["--set", f"bucket.url=file://{root}", "--set", "block.sync_delay=0",
                                      "--set", "block.delete_delay=0",
                                      "--set", "bucket_index.max_stale_period=0",
                                      "--set", f"metastore.data_dir={root.parent / 'metastore'}", *args])
    return result.exit_code, result.output


def test_verify_passes_on_healthy_blocks_and_finds_every_problem(root: Path, bucket: ObstoreBucket) -> None:
    good = write_backup_block(bucket, "acme", "app", 0, 0, 10)
    code, out = _run(root, "bucket", "verify")
    assert code == 0, out
    assert "tenant acme: 1 blocks (healthy 1): OK" in out
    # A flipped byte, a block holding offsets another block holds, and a partial upload.
    key = block_file_key(good, "records-0.parquet")
    data = bytearray(bucket.get(key))
    data[-20] ^= 1
    bucket.put(key, bytes(data))
    dup = write_block(bucket, BlockSpec(id=deterministic_block_id(BASE_MS, "dup"), tenant="acme", group="backup",
                                        kafka=[KafkaRange(topic="app", partition=0, start=5, end=15)]),
                      [DatasetInput("records", "app", backup_table("app", 0, 5, 10), "timestamp")])
    partial = deterministic_block_id(BASE_MS, "partial")
    bucket.put(block_file_key(Place("acme", partial), "records-0.parquet"), b"x")
    code, out = _run(root, "bucket", "verify", "--json")
    assert code == 1
    report = json.loads(out)
    kinds = {(p["kind"], p["block_id"]) for p in report["problems"]}
    assert ("checksum-mismatch", good.id) in kinds
    assert ("kafka-overlap", dup.id) in kinds
    assert ("partial", partial) in kinds
    assert report["ok"] is False


def test_overlap_detection_sees_spans_covered_by_an_earlier_long_block(bucket: ObstoreBucket) -> None:
    write_backup_block(bucket, "acme", "app", 0, 0, 100)
    inner = write_backup_block(bucket, "acme", "app", 0, 40, 10)
    later = write_backup_block(bucket, "acme", "app", 0, 60, 10)
    report = verify_tenant(bucket, BlockFetcher(bucket, 0).sync("acme"), check_data=False)
    assert {p.block_id for p in report.problems if p.kind == "kafka-overlap"} == {inner.id, later.id}


def test_a_quarantined_block_is_a_note_not_a_failure(bucket: ObstoreBucket) -> None:
    good = write_backup_block(bucket, "acme", "app", 0, 0, 10)
    key = block_file_key(good, "records-0.parquet")
    bucket.put(key, b"truncated")
    assert not verify_tenant(bucket, BlockFetcher(bucket, 0).sync("acme")).ok
    write_quarantine_mark(bucket, "acme", good.id, 0, ["size-mismatch: records-0.parquet"], "records nowhere else")
    report = verify_tenant(bucket, BlockFetcher(bucket, 0).sync("acme"))
    assert report.ok
    assert [(p.kind, p.severe) for p in report.problems] == [("quarantined", False)]
    assert "records nowhere else" in report.problems[0].detail


def test_ls_inspect_mark_delete_and_cleanup(root: Path, bucket: ObstoreBucket) -> None:
    meta = write_backup_block(bucket, "acme", "app", 0, 0, 10)
    write_backup_block(bucket, "beta", "app", 0, 0, 10)
    code, out = _run(root, "bucket", "ls")
    assert (code, out.split()) == (0, ["acme", "beta"])
    code, out = _run(root, "bucket", "ls", "--tenant", "acme", "--json")
    assert json.loads(out)["id"] == meta.id
    assert json.loads(out)["state"] == "healthy"
    code, out = _run(root, "bucket", "inspect", "acme", meta.id)
    assert json.loads(out)["meta"]["kafka"] == [{"topic": "app", "partition": 0, "start": 0, "end": 10,
                                                 "incarnation": ""}]
    code, out = _run(root, "bucket", "mark-delete", "acme", meta.id, "--reason", "test")
    assert code == 0, out
    code, out = _run(root, "bucket", "cleanup", "--tenant", "acme", "--dry-run")
    assert f"would delete acme/{meta.id}" in out
    assert list(bucket.list("group=backup/tenant=acme/"))
    code, out = _run(root, "bucket", "cleanup", "--tenant", "acme")
    assert f"delete acme/{meta.id}" in out
    assert list(bucket.list("group=backup/tenant=acme/")) == []


def test_bad_tenant_and_block_names_are_clear_errors(root: Path) -> None:
    code, out = _run(root, "bucket", "ls", "--tenant", "../etc")
    assert code == 1
    assert "tenant '../etc' is not allowed" in out
    code, out = _run(root, "bucket", "inspect", "acme", "nope")
    assert code == 1
    assert "'nope' is not a block id" in out


def test_cleanup_asks_the_metastore_and_refuses_overlap_marks_without_it(root: Path, bucket: ObstoreBucket) -> None:
    a = write_backup_block(bucket, "acme", "app", 0, 0, 10)
    b = write_backup_block(bucket, "acme", "app", 0, 10, 10)
    merged = write_block(bucket, BlockSpec(id=deterministic_block_id(BASE_MS, "ab"), tenant="acme", group="backup",
                                           level=1, sources=[a.id, b.id], parents=[a.id, b.id]),
                         [DatasetInput("records", "app", backup_table("app", 0, 0, 20), "timestamp")])
    # No metastore state: the overlapped sources are not marked, and the output says why.
    code, out = _run(root, "bucket", "cleanup")
    assert code == 0, out
    assert "metastore not reachable" in out
    assert f"refused to mark acme/{a.id}: overlapped by {merged.id}" in out
    assert "mark acme/" not in out.replace("refused to mark", "")
    # The embedded metastore indexes the sources (the merge was never committed): they are kept.
    state = StateMachine(root.parent / "metastore" / "state.db")
    assert state.apply(Entry(1, 1, BASE_MS), encode(AddBlocks(blocks=[a, b]))).ok
    state.close()
    code, out = _run(root, "bucket", "cleanup")
    assert code == 0, out
    assert f"kept acme/{a.id}: the metastore indexes it" in out
    assert "refused" not in out
    assert BlockFetcher(bucket, 0).sync("acme").blocks[a.id].mark is None
    # --force without the metastore marks them (what the operator asked for).
    (root.parent / "metastore" / "state.db").rename(root.parent / "moved.db")
    code, out = _run(root, "bucket", "cleanup", "--force")
    assert f"mark acme/{a.id}: overlapped by {merged.id}" in out


def test_blocks_that_share_a_range_but_no_record_are_not_overlaps(bucket: ObstoreBucket) -> None:
    """A records block and a quarantine block of one chunk, and blocks of two days of one chunk, share their Kafka
    range and no record; a block holding records another holds is an overlap, found by comparing records."""
    from shale.block.fetcher import BlockFetcher

    table = backup_table("app", 0, 0, 10)
    kafka = [KafkaRange(topic="app", partition=0, start=0, end=10)]
    records = write_block(bucket, BlockSpec(id=deterministic_block_id(BASE_MS, "r"), tenant="acme", group="backup",
                                            kafka=kafka),
                          [DatasetInput("records", "app", table.slice(0, 7), "timestamp")])
    write_block(bucket, BlockSpec(id=deterministic_block_id(BASE_MS, "q"), tenant="acme", group="backup", kafka=kafka),
                [DatasetInput("quarantine", "app", table.slice(7, 3).append_column("reason", pa.array(["x"] * 3))
                              .append_column("parser", pa.array(["-"] * 3)), "timestamp")])
    fetcher = BlockFetcher(bucket, 0)
    assert verify_tenant(bucket, fetcher.sync("acme")).ok
    write_block(bucket, BlockSpec(id=deterministic_block_id(BASE_MS, "again"), tenant="acme", group="backup",
                                  kafka=[KafkaRange(topic="app", partition=0, start=5, end=7)]),
                [DatasetInput("records", "app", table.slice(5, 2), "timestamp")])
    report = verify_tenant(bucket, fetcher.sync("acme"))
    overlaps = [p for p in report.problems if p.kind == "kafka-overlap"]
    assert len(overlaps) == 1
    assert "2 records" in overlaps[0].detail
    assert records.id in overlaps[0].detail
