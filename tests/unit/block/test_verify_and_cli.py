"""`shale bucket` commands and the verifier, on a local-filesystem bucket."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from tests.factories import BASE_MS, backup_table, write_backup_block

from shale.block import (
    BlockFetcher,
    BlockSpec,
    DatasetInput,
    KafkaRange,
    block_file_key,
    deterministic_block_id,
    write_block,
)
from shale.block.verify import verify_tenant
from shale.cli import cli
from shale.objstore import ObstoreBucket, open_bucket_url


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "bucket"


@pytest.fixture
def bucket(root: Path) -> ObstoreBucket:
    return open_bucket_url(f"file://{root}")


def _run(root: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["--set", f"bucket.url=file://{root}", "--set", "block.sync_delay=0",
                                      "--set", "block.delete_delay=0", *args])
    return result.exit_code, result.output


def test_verify_passes_on_healthy_blocks_and_finds_every_problem(root: Path, bucket: ObstoreBucket) -> None:
    good = write_backup_block(bucket, "acme", "app", 0, 0, 10)
    code, out = _run(root, "bucket", "verify")
    assert code == 0, out
    assert "tenant acme: 1 blocks (healthy 1): OK" in out
    # A flipped byte, a block holding offsets another block holds, and a partial upload.
    key = block_file_key("acme", good.id, "records-0.parquet")
    data = bytearray(bucket.get(key))
    data[-20] ^= 1
    bucket.put(key, bytes(data))
    dup = write_block(bucket, BlockSpec(id=deterministic_block_id(BASE_MS, "dup"), tenant="acme", group="backup",
                                        kafka=[KafkaRange(topic="app", partition=0, start=5, end=15)]),
                      [DatasetInput("records", "app", backup_table("app", 0, 5, 10), "timestamp")])
    partial = deterministic_block_id(BASE_MS, "partial")
    bucket.put(block_file_key("acme", partial, "records-0.parquet"), b"x")
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
    assert list(bucket.list("acme/blocks/"))
    code, out = _run(root, "bucket", "cleanup", "--tenant", "acme")
    assert f"delete acme/{meta.id}" in out
    assert list(bucket.list("acme/")) == []


def test_bad_tenant_and_block_names_are_clear_errors(root: Path) -> None:
    code, out = _run(root, "bucket", "ls", "--tenant", "../etc")
    assert code == 1
    assert "tenant '../etc' is not allowed" in out
    code, out = _run(root, "bucket", "inspect", "acme", "nope")
    assert code == 1
    assert "'nope' is not a block id" in out
