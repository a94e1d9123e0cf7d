"""Faults of a Spark cluster under Shale's applications (a master and two one-core workers on loopback, each
worker on its own address, so Spark sees two hosts):

* a worker with its executor and Python workers killed with SIGKILL while a task of an ingest batch runs, and
  while a compaction merge runs: Spark reruns the task on the other worker, every record is stored exactly once
  and the compaction completes;
* speculative execution with one task made slow on purpose after it uploaded its data objects: the duplicate
  attempt writes the same keys, so no record is stored twice.

Records are counted from the bucket alone (healthy blocks, as a bucket scanner reads them)."""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path

from tests.factories import write_backup_block
from tests.integration.cluster_helpers import (
    Record,
    bucket_records,
    executor_lost,
    finished,
    healthy_blocks,
    offsets,
    shale_process,
)
from tests.integration.ingest_helpers import config_of, create_topic, produce_json, write_config
from tests.waiting import eventually

from shale.config import BucketConfig
from shale.dev import SparkStandalone, driver_conf
from shale.failpoints import paused, paused_pid
from shale.metastore import AddBlocks, open_metastore
from shale.objstore import open_bucket
from shale.process import ManagedProcess
from shale.verify import verify_topic

RECORDS = 20_000
SLOW_SECONDS = 60
"""How long the slow attempt sleeps. Spark starts the speculative one once the slow attempt has run 4 s (the
threshold below) and 1.5 times as long as the stage's finished tasks, checking every 200 ms: on a loaded machine
the other ingest task took 29 s, so a 12 s sleep ended before 1.5 x 29 s and no copy was started. The copy does not
sleep, and the stage ends with it, so a long sleep costs nothing when speculation works."""
COMPACTION = '\n[compaction]\nblocks_per_job = [10]\nmax_level = 1\npoll_interval = "0.3s"\nlease_duration = "20s"\n'
SPECULATION = {
    "spark.speculation": "true",
    "spark.speculation.interval": "200ms",
    "spark.speculation.multiplier": "1.5",
    "spark.speculation.quantile": "0.5",
    "spark.speculation.efficiency.enabled": "false",  # judge by duration alone: the slow task is slow on purpose
    "spark.speculation.task.duration.threshold": "4s",  # one-task stages too (a compaction job is one task)
}


def _config(tmp_path: Path, kafka_bootstrap: str, bucket: BucketConfig, master: str, topics: list[str],
            conf: dict[str, str] | None = None) -> Path:
    file = write_config(tmp_path, kafka_bootstrap, bucket, topics, max_records_per_batch=RECORDS,
                        spark={"master": master, "conf": {**driver_conf(), **(conf or {})}})
    with file.open("a") as f:
        f.write(COMPACTION)
    return file


def _event_log(tmp_path: Path) -> dict[str, str]:
    """Spark's event log, to see which task attempts ran (the speculative ones are marked)."""
    events = tmp_path / "events"
    events.mkdir()
    return {"spark.eventLog.enabled": "true", "spark.eventLog.dir": events.as_uri(),
            "spark.eventLog.compress": "false", "spark.eventLog.rolling.enabled": "false"}


def _speculative_attempts(tmp_path: Path) -> int:
    logs = [f for f in (tmp_path / "events").rglob("*") if f.is_file() and not f.name.startswith(".")]
    assert logs, "Spark wrote no event log"
    return sum(f.read_text().count('"Speculative":true') for f in logs)


def _kill_the_paused_worker(cluster: SparkStandalone, process: ManagedProcess, points: Path, name: str) -> None:
    """Wait until one task of ``process`` pauses at failpoint ``name``; SIGKILL the worker running it."""
    eventually(lambda: paused(points, name) or not process.alive(), 300,
               lambda: f"a task to reach {name}:\n{process.log_path.read_text()[-3000:]}")
    assert process.alive(), process.log_path.read_text()[-3000:]
    (pause,) = paused(points, name)
    worker = cluster.worker_of(paused_pid(pause))
    assert worker is not None, "the paused task does not run under a worker of the cluster"
    cluster.kill9_worker(worker)


def _ingested_once(config_file: Path, topic: str, group: str = "backup") -> None:
    config = config_of(config_file)
    stored = offsets(bucket_records(config.bucket, group))
    assert len(stored) == RECORDS  # every record ...
    assert set(stored.values()) == {1}  # ... exactly once, from the bucket alone
    report = verify_topic(open_metastore(config), open_bucket(config.bucket), config.kafka, group, 1, topic)
    assert (report.missing, report.duplicated, report.stored) == (0, 0, RECORDS), report.as_dict()


def _topic(bootstrap: str) -> str:
    topic = f"cluster-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, topic, 4)
    produce_json(bootstrap, topic, RECORDS)
    return topic


def _blocks_to_compact(bucket_config: BucketConfig, config_file: Path) -> Counter[Record]:
    """40 level-0 backup blocks (4 jobs of 10), indexed in the metastore; returns their records."""
    bucket = open_bucket(bucket_config)
    metas = [write_backup_block(bucket, "acme", "app", i % 2, (i // 2) * 50, 50) for i in range(40)]
    assert open_metastore(config_of(config_file)).submit(AddBlocks(blocks=metas)).ok
    return bucket_records(bucket_config, "backup")


def _compacted(bucket_config: BucketConfig, config_file: Path, before: Counter[Record]) -> None:
    assert bucket_records(bucket_config, "backup") == before  # the same records, none twice
    assert Counter(m.level for m in healthy_blocks(bucket_config)) == {1: 4}
    assert open_metastore(config_of(config_file)).compaction_jobs() == []  # every job completed


def test_worker_killed_in_the_middle_of_an_ingest_batch(kafka, minio_bucket, spark_cluster: SparkStandalone,
                                                        tmp_path: Path) -> None:
    topic = _topic(kafka.bootstrap_servers)
    file = _config(tmp_path, kafka.bootstrap_servers, minio_bucket, spark_cluster.master_url, [topic])
    points = tmp_path / "points"
    process = shale_process(file, ["ingest", "--group", "backup", "--available-now"], tmp_path / "ingest.log",
                            failpoints="ingest.task=pause-once", failpoint_dir=points)
    try:
        _kill_the_paused_worker(spark_cluster, process, points, "ingest.task")
        assert executor_lost(finished(process))  # the driver lost the executor and reran its task elsewhere
    finally:
        process.stop()
        spark_cluster.ensure_workers()
    _ingested_once(file, topic)


def test_worker_killed_in_the_middle_of_a_compaction_job(kafka, minio_bucket, spark_cluster: SparkStandalone,
                                                         tmp_path: Path) -> None:
    file = _config(tmp_path, kafka.bootstrap_servers, minio_bucket, spark_cluster.master_url, ["unused"])
    before = _blocks_to_compact(minio_bucket, file)
    points = tmp_path / "points"
    process = shale_process(file, ["compact", "--until-idle"], tmp_path / "compact.log",
                            failpoints="compaction.merge=pause-once", failpoint_dir=points)
    try:
        _kill_the_paused_worker(spark_cluster, process, points, "compaction.merge")
        assert executor_lost(finished(process))
    finally:
        process.stop()
        spark_cluster.ensure_workers()
    _compacted(minio_bucket, file, before)


def test_speculative_attempts_write_no_duplicate_data(kafka, minio, minio_bucket, spark_cluster: SparkStandalone,
                                                      tmp_path: Path) -> None:
    """One ingest task and one compaction task each sleep after uploading their data objects and before meta.json;
    Spark starts a second attempt of each on the other worker."""
    topic = _topic(kafka.bootstrap_servers)
    (tmp_path / "ingest").mkdir()
    file = _config(tmp_path / "ingest", kafka.bootstrap_servers, minio_bucket, spark_cluster.master_url, [topic],
                   {**SPECULATION, **_event_log(tmp_path / "ingest")})
    points = tmp_path / "ingest" / "points"
    process = shale_process(file, ["ingest", "--group", "backup", "--available-now"], tmp_path / "ingest.log",
                            failpoints=f"block.before-meta=sleep-once:{SLOW_SECONDS}", failpoint_dir=points)
    finished(process)
    assert paused(points, "block.before-meta")  # one attempt was slow ...
    assert _speculative_attempts(tmp_path / "ingest") >= 1  # ... and Spark started another
    _ingested_once(file, topic)

    (tmp_path / "compact").mkdir()
    name = f"t-{uuid.uuid4().hex[:12]}"
    minio.create_bucket(name)
    bucket = minio_bucket.model_copy(update={"url": f"s3://{name}"})
    file = _config(tmp_path / "compact", kafka.bootstrap_servers, bucket, spark_cluster.master_url, ["unused"],
                   {**SPECULATION, **_event_log(tmp_path / "compact")})
    before = _blocks_to_compact(bucket, file)
    points = tmp_path / "compact" / "points"
    process = shale_process(file, ["compact", "--until-idle"], tmp_path / "compact.log",
                            failpoints=f"block.before-meta=sleep-once:{SLOW_SECONDS}", failpoint_dir=points)
    finished(process)
    assert paused(points, "block.before-meta")
    assert _speculative_attempts(tmp_path / "compact") >= 1
    _compacted(bucket, file, before)
