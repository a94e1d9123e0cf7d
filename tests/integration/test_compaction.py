"""Compaction on MinIO with Spark workers and a metastore: 2,000 small blocks compacted through the levels
with the same records before and after; a worker killed with SIGKILL mid-job loses its lease and its late
report is refused; a job that always crashes is excluded while the others complete; a worker rides out a
metastore process killed with SIGKILL and restarted."""

from __future__ import annotations

import os
import sys
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.factories import write_backup_block
from tests.waiting import eventually

from shale.block import BlockFetcher, BlockMeta, block_file_key, read_dataset
from shale.compaction.messages import PollRequest
from shale.compactor.worker import CompactionWorker
from shale.config import BucketConfig, CompactionConfig, ShaleConfig
from shale.dev.metastore import MetastoreCluster
from shale.failpoints import paused
from shale.metastore import AddBlocks, MetastoreService, open_metastore
from shale.objstore import ObstoreBucket, open_bucket
from shale.process import ManagedProcess

ROOT = Path(__file__).resolve().parents[2]


def _records(service: MetastoreService, bucket: ObstoreBucket) -> tuple[Counter[tuple[object, ...]], int]:
    metas = service.query_blocks(["acme"], 0, 2**62)

    def rows(meta: BlockMeta) -> list[tuple[object, ...]]:
        table = read_dataset(bucket, meta, meta.datasets[0], columns=["topic", "partition", "offset", "value"])
        return list(zip(*(table.column(c).to_pylist() for c in table.column_names), strict=True))

    with ThreadPoolExecutor(16) as pool:
        return Counter(r for batch in pool.map(rows, metas) for r in batch), len(metas)


def _config(tmp_path: Path, bucket: BucketConfig, **compaction: object) -> ShaleConfig:
    return ShaleConfig(bucket=bucket, metastore={"data_dir": str(tmp_path / "ms")},  # type: ignore[arg-type]
                       compaction=CompactionConfig(**compaction))  # type: ignore[arg-type]


def test_two_thousand_blocks_compact_through_the_levels(minio_bucket, spark, tmp_path: Path) -> None:
    config = _config(tmp_path, minio_bucket, blocks_per_job=[50, 10], max_level=2, poll_interval=0.2)
    service = open_metastore(config)
    assert isinstance(service, MetastoreService)
    bucket = open_bucket(minio_bucket)
    with ThreadPoolExecutor(16) as pool:
        metas = list(pool.map(lambda i: write_backup_block(bucket, "acme", "app", i % 2, (i // 2) * 5, 5),
                              range(2000)))
    service.submit(AddBlocks(blocks=metas))
    before, objects_before = _records(service, bucket)
    assert sum(before.values()) == 10_000
    assert objects_before == 2000

    CompactionWorker(service, minio_bucket, spark, slots=2, poll_interval=0.2).run(until_idle=True)

    after, objects_after = _records(service, bucket)
    assert after == before  # the same multiset: nothing lost, nothing twice
    assert max(after.values()) == 1
    assert objects_after == 4  # 2,000 -> 40 (level 1) -> 4 (level 2)
    levels = Counter(m.level for m in service.query_blocks(["acme"], 0, 2**62))
    assert levels == {2: 4}
    assert len(service.tombstones(limit=10_000)) == 2000 + 40


def test_killed_worker_loses_its_job_and_a_crashing_job_is_excluded(minio_bucket, spark, tmp_path: Path) -> None:
    config = _config(tmp_path, minio_bucket, blocks_per_job=[10], max_level=1, lease_duration=3,
                     poll_interval=0.3)
    service = open_metastore(config)
    assert isinstance(service, MetastoreService)
    bucket = open_bucket(minio_bucket)
    metas = [write_backup_block(bucket, "acme", "app", 0, i * 5, 5) for i in range(40)]
    # Poison one block: its data no longer matches its checksum, so every merge of its job fails.
    poisoned = metas[35]
    key = block_file_key(poisoned, "records-0.parquet")
    data = bytearray(bucket.get(key))
    data[40] ^= 0xFF
    bucket.put(key, bytes(data))
    service.submit(AddBlocks(blocks=metas))

    # A worker process that pauses right before reporting success; then kill -9.
    config_file = tmp_path / "shale.toml"
    config_file.write_text(f'[bucket]\nurl = "{minio_bucket.url}"\nendpoint = "{minio_bucket.endpoint}"\n'
                           f'access_key_id = "{minio_bucket.access_key_id}"\n'
                           f'secret_access_key = "{minio_bucket.secret_access_key.get_secret_value()}"\n'
                           'allow_http = true\n'
                           f'[metastore]\ndata_dir = "{tmp_path / "ms"}"\n[spark]\nmaster = "local[1]"\n'
                           '[compaction]\nblocks_per_job = [10]\nmax_level = 1\nlease_duration = 3\n'
                           "poll_interval = 0.3\nslots = 1\n")
    points, reports = tmp_path / "points", tmp_path / "reports"
    env = dict(os.environ, SHALE_FAILPOINTS="compaction.before-report", SHALE_FAILPOINT_DIR=str(points))
    worker = ManagedProcess("compact", [sys.executable, "-m", "shale.cli", "--config", str(config_file), "compact",
                                        "--save-reports", str(reports)], tmp_path / "compact.log", env=env, cwd=ROOT)
    worker.start()

    def merged() -> bool:
        assert worker.alive(), worker.log_path.read_text()[-3000:]
        return paused(points, "compaction.before-report")

    eventually(merged, 180, "the worker to finish a merge")
    worker.kill9()
    (saved,) = list(reports.glob("*.json"))
    stale = PollRequest.model_validate_json(saved.read_text())
    (stale_update,) = [u for u in stale.updates if u.status == "success"]

    # Its lease expires; another worker gets the job (once no unassigned job is left) with a higher token.
    local = CompactionWorker(service, minio_bucket, spark, slots=1, poll_interval=0.3)

    def reassigned() -> bool:
        local.step()
        return stale_update.job in local.running

    eventually(reassigned, 120, "the expired job to be reassigned")
    assert local.running[stale_update.job].job.token > stale_update.token
    replay = service.poll_compaction(stale)  # the killed worker's late report, replayed
    assert replay.updates[stale_update.job] in ("lost", "unknown-job")
    stale_output = stale_update.outputs[0].id
    assert service.get_block(stale_output) is None

    def settled() -> bool:
        jobs = service.compaction_jobs()
        if len(jobs) == 1 and jobs[0]["status"] == "excluded":
            return True
        local.step()  # the poisoned job fails each time; its lease expires; it is reassigned, until excluded
        return False

    eventually(settled, 180, lambda: f"the jobs to settle: {service.compaction_jobs()}")
    jobs = {j["name"]: j for j in service.compaction_jobs()}
    assert len(jobs) == 1  # only the poisoned job is left ...
    (bad,) = jobs.values()
    assert bad["status"] == "excluded"
    assert bad["failures"] == 3
    levels = Counter(m.level for m in service.query_blocks(["acme"], 0, 2**62))
    assert levels == {1: 3, 0: 10}  # ... the other three jobs completed; the stale output was never committed
    assert stale_output not in {m.id for m in service.query_blocks(["acme"], 0, 2**62)}


def test_the_worker_rides_out_a_metastore_outage_longer_than_its_client_deadline(minio_bucket, spark,
                                                                                  tmp_path: Path) -> None:
    cluster = MetastoreCluster(tmp_path / "ms", 1, bucket=minio_bucket, extra=[
        "compaction.blocks_per_job=[10]", "compaction.max_level=1", "compaction.lease_duration=5"]).start()
    client = cluster.client(timeout=2, deadline=3)
    stop = threading.Event()
    try:
        bucket = open_bucket(minio_bucket)
        metas = [write_backup_block(bucket, "acme", "app", i % 2, (i // 2) * 5, 5) for i in range(40)]
        assert client.submit(AddBlocks(blocks=metas)).ok
        worker = CompactionWorker(client, minio_bucket, spark, slots=2, poll_interval=0.3)
        loop = threading.Thread(target=worker.run, args=(stop,))
        loop.start()
        eventually(lambda: len(worker.running) == 2, 120, "the worker to get two jobs")

        cluster.kill9(0)  # SIGKILL the metastore while both merges run
        # The outage outlasts the client's deadline three times over; merges finish meanwhile.
        eventually(lambda: worker.unanswered_polls >= 3, 120, "the worker to notice the outage")
        eventually(lambda: all(r.future.done() for r in list(worker.running.values())), 120, "the merges to finish")
        assert loop.is_alive()
        assert worker.unanswered is not None
        cluster.start_node(0)

        def compacted() -> bool:
            levels = Counter(m.level for m in client.query_blocks(["acme"], 0, 2**62))
            return levels == {1: 4} and client.compaction_jobs() == []

        eventually(compacted, 180, "compaction to complete after the metastore came back")
        stop.set()
        loop.join(timeout=60)
        assert not loop.is_alive()
        assert worker.unanswered is None

        # Every record once, read from the bucket: the indexed blocks' data, and the blocks a bucket scan
        # trusts (no committed output was marked; every source is overlapped by its output).
        indexed = client.query_blocks(["acme"], 0, 2**62)
        records = Counter(r for meta in indexed for r in zip(*(
            read_dataset(bucket, meta, meta.datasets[0], columns=["topic", "partition", "offset"]).column(c)
            .to_pylist() for c in ("topic", "partition", "offset")), strict=True))
        assert records == Counter(("app", i % 2, (i // 2) * 5 + k) for i in range(40) for k in range(5))
        readable = {v.id for v in BlockFetcher(bucket, 0).sync("acme").blocks.values() if v.readable}
        assert readable == {m.id for m in indexed}
    finally:
        stop.set()
        client.close()
        cluster.stop()
