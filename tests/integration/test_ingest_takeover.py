"""Issue 30 with real Kafka, MinIO and Spark: several ``shale ingest`` processes of one group. The active driver is
killed with SIGKILL mid-batch (its blocks written, its commit not sent) and the standby takes over; a driver
paused with SIGSTOP mid-batch and resumed after its lease expired cannot commit (fencing); two drivers on two
shards commit side by side and a standby of every shard takes over the one killed; the shard count changes from 1
to 2 while two drivers ingest. Each time ``verify`` finds 0 missing and 0 duplicated."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
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

from shale.metastore import MetastoreService, open_metastore
from shale.metastore.rules.shards import owner, shard_of
from shale.objstore import open_bucket
from shale.verify import verify_topic

STANDBY = "standby: another process holds the ingest lease"
TAKEOVER = "ingest lease taken over"
LOST = "ingest lease lost"
RESHARDED = "ingest shard map changed"
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


# -- shards: several drivers of one group ---------------------------------------------------------------------

SHARDED = 4_000


def _two_shard_topic(kafka) -> str:  # type: ignore[no-untyped-def]
    """A new topic of 4 partitions that both of 2 shards read (the assignment hashes the topic's name)."""
    while True:
        topic = f"shards-{uuid.uuid4().hex[:6]}"
        if {shard_of(topic, p, 2) for p in range(4)} == {0, 1}:
            create_topic(kafka.bootstrap_servers, topic, 4)
            return topic


def _committed(file: Path, shards: int, shard: int | None = None) -> int:
    """Offsets committed of group backup (of one shard's partitions under ``shards``, if ``shard`` is given)."""
    return sum(o.committed_end for o in open_metastore(config_of(file)).offsets("backup", 1)
               if shard is None or shard_of(o.topic, o.partition, shards) == shard)


def _verify_sharded(file: Path, topic: str, records: int, shards: int) -> set[int]:
    """verify's 0 missing, 0 duplicated; every block carries the shard of its partition; the shards seen."""
    config = config_of(file)
    store = open_metastore(config)
    report = verify_topic(store, open_bucket(config.bucket), config.kafka, "backup", 1, topic)
    assert (report.missing, report.duplicated, report.stored) == (0, 0, records), report.as_dict()
    blocks = store.query_blocks([config.ingest.default_tenant], 0, 2**62, "", "backup")
    assert blocks
    for b in blocks:
        assert {shard_of(k.topic, k.partition, shards) for k in b.kafka} == {b.shard}, b
    return {b.shard for b in blocks}


def test_two_drivers_share_a_group_and_a_standby_takes_over_a_shard_killed_mid_batch(
        kafka, minio_bucket, tmp_path: Path) -> None:
    topic = _two_shard_topic(kafka)
    produce_json(kafka.bootstrap_servers, topic, SHARDED)
    file = write_config(tmp_path, kafka.bootstrap_servers, minio_bucket, [topic], max_records_per_batch=1_000,
                        lease_duration="5s", shards=2)
    first = ingest_process(file, "backup", tmp_path / "first.log", shard=0)  # runs on, holding shard 0
    second = ingest_process(file, "backup", tmp_path / "second.log", available_now=True, shard=1)
    points = tmp_path / "failpoints"
    processes = [first, second]
    try:
        finish(second, timeout=600)  # stored shard 1 beside the first driver, and released it
        eventually(lambda: _committed(file, 2) == SHARDED, 600, "both shards to be committed")
        assert _logged(first, "batch committed")
        assert _verify_sharded(file, topic, SHARDED, 2) == {0, 1}
        produce_json(kafka.bootstrap_servers, topic, SHARDED, start=SHARDED, seed=2)
        active = ingest_process(file, "backup", tmp_path / "active.log", failpoints="ingest.before-commit",
                                failpoint_dir=points, shard=1)
        processes.append(active)
        wait_paused(active, points, "ingest.before-commit")  # shard 1's lease held, a batch written, not committed
        standby = ingest_process(file, "backup", tmp_path / "standby.log", available_now=True)  # any free shard
        processes.append(standby)
        eventually(lambda: _logged(standby, STANDBY), 300, "the third driver to wait as a standby of every shard")
        active.kill9()
        finish(standby, timeout=600)
        took = [line for line in standby.log_path.read_text().splitlines() if TAKEOVER in line]
        assert len(took) == 1
        assert " shard=1 " in took[0]  # the killed driver's shard, not shard 0, which the first driver holds
        eventually(lambda: _committed(file, 2) == 2 * SHARDED, 600, "the first driver to store shard 0's new records")
        first.stop()
        assert first.popen is not None
        assert first.popen.returncode == 0, first.log_path.read_text()[-3000:]
    finally:
        for process in processes:
            process.kill9()
    _verify_sharded(file, topic, 2 * SHARDED, 2)


def test_the_shard_count_changes_while_two_drivers_ingest(kafka, minio_bucket, tmp_path: Path) -> None:
    topic = _two_shard_topic(kafka)
    produce_json(kafka.bootstrap_servers, topic, SHARDED)
    file = write_config(tmp_path, kafka.bootstrap_servers, minio_bucket, [topic], max_records_per_batch=1_000,
                        lease_duration="5s")  # ingest.shards: 1, the default
    first = ingest_process(file, "backup", tmp_path / "first.log")
    second = ingest_process(file, "backup", tmp_path / "second.log")
    try:
        eventually(lambda: _logged(first, STANDBY) or _logged(second, STANDBY), 300, "a driver to wait as a standby")
        holder = second if _logged(first, STANDBY) else first  # whichever warmed up first took the one shard
        eventually(lambda: _committed(file, 1) == SHARDED, 600, "the holder to store the records")
        produce_json(kafka.bootstrap_servers, topic, SHARDED, start=SHARDED, seed=2)  # ingest runs on
        changed = subprocess.run([sys.executable, "-m", "shale.cli", "--config", str(file), "shards", "set",
                                  "--group", "backup", "--count", "2"], check=False, capture_output=True, text=True,
                                 timeout=120)
        assert changed.returncode == 0, changed.stderr
        assert "1 -> 2 shard(s)" in changed.stdout
        produce_json(kafka.bootstrap_servers, topic, SHARDED, start=2 * SHARDED, seed=3)
        eventually(lambda: _committed(file, 2) == 3 * SHARDED, 600, "both shards of the new map to be stored")
        assert _logged(holder, RESHARDED)  # the holder's lease of the old map was fenced
        for process in (first, second):
            process.stop()
            assert process.popen is not None
            assert process.popen.returncode == 0, process.log_path.read_text()[-3000:]
    finally:
        first.kill9()
        second.kill9()
    config = config_of(file)
    store = open_metastore(config)
    report = verify_topic(store, open_bucket(config.bucket), config.kafka, "backup", 1, topic)
    assert (report.missing, report.duplicated, report.stored) == (0, 0, 3 * SHARDED), report.as_dict()
    later = [b for b in store.query_blocks([config.ingest.default_tenant], 0, 2**62, "", "backup") if b.shard == 1]
    assert later  # the new shard was written, by whichever driver took it
    assert isinstance(store, MetastoreService)
    conn = store.state.reader.conn
    for b in later:  # the partitions the new map placed on shard 1 (by load when the count changed, else by hash)
        assert {owner(conn, "backup", 1, k.topic, k.partition, 2) for k in b.kafka} == {1}, b
