"""Issue 54, point 15, with real Kafka, MinIO and Spark: the partition group's driver is killed with SIGKILL after
its batch's blocks are written and before its commit, a standby takes the lease over and commits the same records in
blocks of its own. Right after that first commit (the standby paused there), a reader of the bucket alone (a bucket
index built from a bucket scan that trusts every complete block at once) reads every committed record once: the
lost batch's blocks are already marked, without the leader's bucket scan."""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path

from tests.integration.ingest_helpers import (
    config_of,
    create_topic,
    finish,
    ingest_process,
    produce_json,
    wait_paused,
    write_config,
)
from tests.waiting import eventually

from shale.block import BlockFetcher, BlockState, read_dataset
from shale.bucketindex import live_blocks, scan_index
from shale.metastore import open_metastore
from shale.objstore import Bucket, open_bucket
from shale.verify import verify_topic

RECORDS = 12_000
STANDBY = "standby: another process holds the ingest lease"


def _bucket_reads(bucket: Bucket) -> Counter[tuple[int, int]]:
    """(partition, offset) of every record a bucket-only reader reads (records datasets of the live blocks)."""
    seen: Counter[tuple[int, int]] = Counter()
    for tenant in BlockFetcher(bucket, 0).tenants():
        for meta in live_blocks(scan_index(bucket, tenant, 0, deltas=False)):
            for dataset in meta.datasets:
                if dataset.kind == "records" and meta.group == "partition":
                    table = read_dataset(bucket, meta, dataset, columns=["partition", "offset"])
                    seen.update(zip(table["partition"].to_pylist(), table["offset"].to_pylist(), strict=True))
    return seen


def test_a_bucket_only_reader_reads_each_record_once_right_after_a_takeover_from_a_killed_driver(
        kafka, minio_bucket, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    topic = f"lost-{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap_servers, topic, 4)
    produce_json(kafka.bootstrap_servers, topic, RECORDS // 2)
    file = write_config(tmp_path, kafka.bootstrap_servers, minio_bucket, [topic], max_records_per_batch=3_000,
                        lease_duration="5s")
    finish(ingest_process(file, "partition", tmp_path / "first.log", available_now=True), timeout=600)
    produce_json(kafka.bootstrap_servers, topic, RECORDS // 2, start=RECORDS // 2, seed=2)
    killed_at, standby_at = tmp_path / "killed-points", tmp_path / "standby-points"
    active = ingest_process(file, "partition", tmp_path / "active.log", failpoints="ingest.before-commit",
                            failpoint_dir=killed_at)
    processes = [active]
    config = config_of(file)
    bucket = open_bucket(config.bucket)
    try:
        wait_paused(active, killed_at, "ingest.before-commit")  # the lease held, a batch written, not committed
        standby = ingest_process(file, "partition", tmp_path / "standby.log", failpoints="ingest.after-commit",
                                 failpoint_dir=standby_at)
        processes.append(standby)
        eventually(lambda: STANDBY in standby.log_path.read_text(), 300, "the second driver to wait as a standby")
        fetcher = BlockFetcher(bucket, 0)
        before = {v.id for t in fetcher.tenants() for v in fetcher.sync(t).blocks.values()}
        active.kill9()
        wait_paused(standby, standby_at, "ingest.after-commit", timeout=600)  # its first commit made, nothing more
        committed = {o.partition: o.committed_end for o in open_metastore(config).offsets("partition", 1)}
        seen = _bucket_reads(bucket)
        indexed = {b.id for t in open_metastore(config).tenants() for b in open_metastore(config).tenant_blocks(t)}
        states = {v.id: v for t in fetcher.tenants() for v in fetcher.sync(t).blocks.values()}
    finally:
        for process in processes:
            process.kill9()
    twice = sorted(key for key, n in seen.items() if n > 1)
    assert twice == [], f"{len(twice)} of {len(seen)} records read twice from the bucket, e.g. {twice[:5]}"
    assert sorted(seen) == sorted((p, o) for p, end in committed.items() for o in range(end))
    lost = before - indexed
    assert lost  # the killed driver's batch: complete blocks no commit holds
    assert {states[b].state for b in lost} == {BlockState.MARKED_FOR_DELETION}
    finish(ingest_process(file, "partition", tmp_path / "last.log", available_now=True), timeout=600)
    report = verify_topic(open_metastore(config), bucket, config.kafka, "partition", 1, topic)
    assert (report.missing, report.duplicated, report.stored) == (0, 0, RECORDS), report.as_dict()
