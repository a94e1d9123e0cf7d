"""Fault injection with real processes: the ingest process killed with SIGKILL at each dangerous moment of the
commit protocol, the Kafka broker restarted mid-stream, and the metastore stopped (commits go to the dead
letter queue and are recovered when it returns). Every time, verify finds 0 missing and 0 duplicated."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import httpx
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

from shale.config import load_config
from shale.dev import KafkaBroker
from shale.dev.metastore import MetastoreCluster
from shale.metastore import open_metastore
from shale.metastore.api.auth import write_private
from shale.objstore import open_bucket
from shale.verify import verify_topic


def _verify(file: Path, topic: str, group: str, expected: int) -> None:
    config = config_of(file)
    report = verify_topic(open_metastore(config), open_bucket(config.bucket), config.kafka, group, 1, topic)
    assert (report.missing, report.duplicated, report.stored) == (0, 0, expected), report.as_dict()


def test_kill_9_at_each_step_of_the_commit_protocol(kafka, minio_bucket, tmp_path: Path) -> None:
    topic = f"faults-{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap_servers, topic, 4)
    produce_json(kafka.bootstrap_servers, topic, 30_000)
    file = write_config(tmp_path, kafka.bootstrap_servers, minio_bucket, [topic], max_records_per_batch=10_000)
    points = tmp_path / "failpoints"
    steps = [("block.before-meta", "data uploaded, meta.json not yet"),
             ("ingest.before-commit", "meta.json written, the commit not yet sent"),
             ("ingest.after-commit", "committed, the next batch not yet planned")]
    for i, (failpoint, _) in enumerate(steps):
        process = ingest_process(file, "backup", tmp_path / f"ingest-{i}.log", failpoints=failpoint,
                                 failpoint_dir=points)
        wait_paused(process, points, failpoint)
        process.kill9()
    store = open_metastore(config_of(file))
    before = sum(o.committed_end for o in store.offsets("backup", 1))
    assert 0 < before < 30_000  # the after-commit crash committed one batch; the others committed nothing
    finish(ingest_process(file, "backup", tmp_path / "ingest-final.log", available_now=True))
    _verify(file, topic, "backup", 30_000)


OUTAGE = "Kafka did not answer; retrying"
"""What the ingest process logs when a plan finds no broker (``shale.ingest.job``)."""


def test_broker_restart_during_ingest(minio_bucket, tmp_path: Path) -> None:
    broker = KafkaBroker(tmp_path / "kafka").start()
    try:
        topic = "restart"
        create_topic(broker.bootstrap_servers, topic, 2)
        produce_json(broker.bootstrap_servers, topic, 5_000)
        file = write_config(tmp_path, broker.bootstrap_servers, minio_bucket, [topic])
        process = ingest_process(file, "backup", tmp_path / "ingest.log")
        store = open_metastore(config_of(file))
        _wait_committed(store, 5_000, process)
        noticed = process.log_path.read_text().count(OUTAGE)
        broker.stop()
        eventually(lambda: process.log_path.read_text().count(OUTAGE) > noticed, 180,
                   "the ingest process to notice the broker is gone")
        broker.start()  # same ports, same log directory
        produce_json(broker.bootstrap_servers, topic, 5_000, start=5_000)
        _wait_committed(store, 10_000, process)
        process.stop()
        _verify(file, topic, "backup", 10_000)
    finally:
        broker.stop()


def _wait_committed(store, total: int, process, timeout: float = 240) -> None:  # type: ignore[no-untyped-def]
    def committed() -> bool:
        assert process.alive(), process.log_path.read_text()[-3000:]
        return sum(o.committed_end for o in store.offsets("backup", 1)) >= total

    eventually(committed, timeout, lambda: f"{total} records committed:\n{process.log_path.read_text()[-3000:]}")


def test_metastore_outage_goes_to_the_dead_letter_queue_and_recovers(kafka, minio_bucket, tmp_path: Path) -> None:
    cluster = MetastoreCluster(tmp_path / "ms", 1, bucket=minio_bucket,
                               extra=["metastore.dlq_interval=1s", "metastore.maintenance_interval=1s"]).start()
    try:
        topic = f"outage-{uuid.uuid4().hex[:6]}"
        create_topic(kafka.bootstrap_servers, topic, 2)
        produce_json(kafka.bootstrap_servers, topic, 4_000)
        token_file = tmp_path / "ingest.token"
        write_private(token_file, cluster.issue_token("ingest-backup", "ingest", groups=["backup"]))
        file = write_config(tmp_path, kafka.bootstrap_servers, minio_bucket, [topic], metastore={
            "mode": "remote", "addresses": cluster.addresses, "client_deadline": 3, "request_timeout": 2,
            "token_file": str(token_file)})
        config = load_config(file, env={})
        assert config.metastore.mode == "remote"
        process = ingest_process(file, "backup", tmp_path / "ingest.log")
        client = cluster.client(deadline=5)
        _wait_committed(client, 4_000, process)

        cluster.kill9(0)
        produce_json(kafka.bootstrap_servers, topic, 4_000, start=4_000)
        bucket = open_bucket(minio_bucket)

        def queued() -> bool:
            assert process.alive(), process.log_path.read_text()[-3000:]
            return bool(list(bucket.list("_shale/dlq/")))

        eventually(queued, 120, "a commit to reach the dead letter queue")

        cluster.start_node(0)  # same data directory and port; the leader replays the queue
        _wait_committed(client, 8_000, process)
        eventually(lambda: not list(bucket.list("_shale/dlq/")), 60, "the dead letter queue to drain")
        assert not list(bucket.list("_shale/dlq-rejected/"))
        process.stop()
        report = verify_topic(client, bucket, config.kafka, "backup", 1, topic)
        assert (report.missing, report.duplicated, report.stored) == (0, 0, 8_000), report.as_dict()
        metrics = httpx.get(cluster.addresses[0] + "/metrics").text
        assert "shale_metastore_dlq_events_total" in metrics
    finally:
        cluster.stop()


def test_case12_a_metastore_outage_longer_than_the_lease_delays_commits_and_discards_nothing(
        kafka, minio_bucket, tmp_path: Path) -> None:
    """The metastore is down for 20 s (four 5 s leases) while records keep arriving: the driver dead-letters its
    commits and keeps its lease, since nobody took its shard, and a standby waiting beside it does not take the shard
    when the metastore returns (the outage does not count against the lease). Every queued commit is accepted (none
    set aside), and the bucket holds each record once; the same driver process ran throughout (one start, one lease,
    no lease lost)."""
    cluster = MetastoreCluster(tmp_path / "ms", 1, bucket=minio_bucket,
                               extra=["metastore.dlq_interval=1s", "metastore.maintenance_interval=1s"]).start()
    drivers = []
    try:
        topic = f"long-outage-{uuid.uuid4().hex[:6]}"
        create_topic(kafka.bootstrap_servers, topic, 2)
        produce_json(kafka.bootstrap_servers, topic, 2_000)
        token_file = tmp_path / "ingest.token"
        write_private(token_file, cluster.issue_token("ingest-backup", "ingest", groups=["backup"]))
        file = write_config(tmp_path, kafka.bootstrap_servers, minio_bucket, [topic], metastore={
            "mode": "remote", "addresses": cluster.addresses, "client_deadline": 3, "request_timeout": 2,
            "token_file": str(token_file)}, lease_duration="5s")
        config = load_config(file, env={})
        assert config.ingest.lease_duration == 5.0
        process = ingest_process(file, "backup", tmp_path / "ingest.log")
        drivers.append(process)
        assert process.popen is not None
        pid = process.popen.pid
        client = cluster.client(deadline=5)
        _wait_committed(client, 2_000, process)
        standby = ingest_process(file, "backup", tmp_path / "standby.log")
        drivers.append(standby)
        eventually(lambda: "standby: another process holds the ingest lease" in standby.log_path.read_text(), 240,
                   "the second driver to wait as a standby")

        cluster.kill9(0)
        bucket = open_bucket(minio_bucket)
        down = time.monotonic()
        produced = 2_000

        rounds = [down - 2.0]  # when the last 200 records were produced

        def load_a_round() -> bool:  # load through the whole outage: 200 records every 2 s until 20 s have passed
            nonlocal produced
            if time.monotonic() - rounds[-1] >= 2:
                produce_json(kafka.bootstrap_servers, topic, 200, start=produced)
                produced += 200
                rounds.append(time.monotonic())
            assert process.alive(), process.log_path.read_text()[-3000:]
            return time.monotonic() - down >= 20

        eventually(load_a_round, 120, "20 s of load through the metastore outage")
        assert list(bucket.list("_shale/dlq/")), "no commit reached the dead letter queue during the outage"

        cluster.start_node(0)  # same data directory and port; the leader replays the queue
        _wait_committed(client, produced, process)
        eventually(lambda: not list(bucket.list("_shale/dlq/")), 60, "the dead letter queue to drain")
        assert not list(bucket.list("_shale/dlq-rejected/"))
        assert process.alive()
        assert process.popen.pid == pid
        text = process.log_path.read_text()
        assert "ingest lease lost" not in text, text[-3000:]
        assert text.count("ingest started") == 1, text[-3000:]
        assert text.count("ingest lease acquired") == 1, text[-3000:]
        assert standby.alive()
        assert "ingest started" not in standby.log_path.read_text(), standby.log_path.read_text()[-3000:]
        standby.stop()
        process.stop()
        report = verify_topic(client, bucket, config.kafka, "backup", 1, topic)
        assert (report.missing, report.duplicated, report.stored) == (0, 0, produced), report.as_dict()
    finally:
        for driver in drivers:
            if driver.alive():
                driver.stop()
        cluster.stop()
