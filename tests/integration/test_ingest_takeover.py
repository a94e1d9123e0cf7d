"""Issue 30 with real Kafka, MinIO and Spark: two ``shale ingest`` processes of one group. The active driver is
killed with SIGKILL mid-batch (its blocks written, its commit not sent) and the standby takes over; a driver
paused with SIGSTOP mid-batch and resumed after its lease expired cannot commit (fencing). Each time ``verify``
finds 0 missing and 0 duplicated."""

from __future__ import annotations

import os
import signal
import uuid
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

from shale.ingest.verify import verify_topic
from shale.metastore import open_metastore
from shale.objstore import open_bucket

STANDBY = "standby: another process holds the ingest lease"
TAKEOVER = "ingest lease taken over"
LOST = "ingest lease lost"
RECORDS = 20_000


def _setup(kafka, minio_bucket, tmp_path: Path) -> tuple[str, Path]:  # type: ignore[no-untyped-def]
    topic = f"takeover-{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap_servers, topic, 4)
    produce_json(kafka.bootstrap_servers, topic, RECORDS)
    return topic, write_config(tmp_path, kafka.bootstrap_servers, minio_bucket, [topic], max_records_per_batch=5_000,
                               lease_duration="5s")


def _verify(file: Path, topic: str) -> None:
    config = config_of(file)
    report = verify_topic(open_metastore(config), open_bucket(config.bucket), config.kafka, "backup", 1, topic)
    assert (report.missing, report.duplicated, report.stored) == (0, 0, RECORDS), report.as_dict()


def _logged(process, text: str) -> bool:  # type: ignore[no-untyped-def]
    return text in process.log_path.read_text()


def test_the_standby_takes_over_from_a_driver_killed_mid_batch(kafka, minio_bucket, tmp_path: Path) -> None:
    topic, file = _setup(kafka, minio_bucket, tmp_path)
    points = tmp_path / "failpoints"
    active = ingest_process(file, "backup", tmp_path / "active.log", failpoints="ingest.before-commit",
                            failpoint_dir=points)
    wait_paused(active, points, "ingest.before-commit")  # holding the lease, one batch written, not committed
    standby = ingest_process(file, "backup", tmp_path / "standby.log", available_now=True)
    try:
        eventually(lambda: _logged(standby, STANDBY), 300, "the second driver to wait as a standby")
        assert not _logged(standby, TAKEOVER)  # the active driver's heartbeat holds the lease while it is stuck
        active.kill9()
        finish(standby, timeout=600)
    finally:
        active.kill9()
        standby.kill9()
    assert _logged(standby, TAKEOVER)
    _verify(file, topic)


def test_a_driver_resumed_after_its_lease_expired_cannot_commit(kafka, minio_bucket, tmp_path: Path) -> None:
    topic, file = _setup(kafka, minio_bucket, tmp_path)
    points = tmp_path / "failpoints"
    paused = ingest_process(file, "backup", tmp_path / "paused.log", failpoints="ingest.before-commit=sleep-once:20",
                            failpoint_dir=points)
    wait_paused(paused, points, "ingest.before-commit")  # its first batch written, the commit 20 s away
    os.killpg(paused.pid, signal.SIGSTOP)  # the machine freezes: driver, heartbeat and Spark alike
    standby = ingest_process(file, "backup", tmp_path / "standby.log", available_now=True)
    try:
        finish(standby, timeout=600)  # took over once the lease expired, stored everything, released the lease
        store = open_metastore(config_of(file))
        before = {(o.topic, o.partition): o.committed_end for o in store.offsets("backup", 1)}
        assert sum(before.values()) == RECORDS
        os.killpg(paused.pid, signal.SIGCONT)
        assert paused.popen is not None
        code = paused.popen.wait(timeout=300)  # it wakes up, tries to commit its batch, is fenced and stops
        assert code != 0
        assert LOST in paused.log_path.read_text()
        assert {(o.topic, o.partition): o.committed_end for o in store.offsets("backup", 1)} == before
    finally:
        paused.kill9()
        standby.kill9()
    _verify(file, topic)
