"""Restore from the backup group into real Kafka: a deleted topic comes back record for record (key, value,
headers, CreateTime timestamp, partition, order); a restore killed with SIGKILL mid-transaction, twice, and run
again sends each record exactly once; ``--until`` stops at the named time (into a second Kafka cluster); a target
with another partition count gets each keyed record where Kafka's Java producer would put it; a gap is reported
before anything is sent and stops only its partition; a consumer group resumes from translated offsets."""

from __future__ import annotations

import base64
import json
import os
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient
from prometheus_client import REGISTRY
from tests.integration.ingest_helpers import config_of, create_topic, wait_paused, write_config
from tests.integration.kafka_world import create_topic as create_topic_with
from tests.producing import CheckedProducer
from tests.waiting import eventually

from shale.config import KafkaConfig, ShaleConfig
from shale.dev.kafka import KafkaBroker
from shale.ingest.job import IngestJob
from shale.metastore import open_index_view, open_metastore
from shale.objstore import open_bucket
from shale.process import ManagedProcess
from shale.restore import RestoreJob, RestoreRange, RestoreRequest, java_partition
from shale.restore.offsets import set_offsets, translate
from shale.restore.progress import ProgressLine, read_anchors
from shale.restore.task import record_size

ROOT = Path(__file__).resolve().parents[2]
T0 = (int(time.time()) - 3600) * 1000  # within the broker's retention (7 days by default)
PARTITIONS = 3
"""Partitions the test records are produced to."""
SOURCE_PARTITIONS = PARTITIONS + 1
"""The source topic's partitions: its last one never holds a record."""
COUNT = 3000
Record = tuple[bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...], int]


@dataclass
class BackedUp:
    topic: str
    file: Path
    config: ShaleConfig
    records: dict[int, list[Record]]
    """Per source partition, the records in offset order as a read_committed consumer read them."""


def read_topic(bootstrap: str, topic: str, partitions: int) -> dict[int, list[Record]]:
    """Every record a read_committed consumer sees, per partition in offset order."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4().hex}",
                         "isolation.level": "read_committed", "enable.partition.eof": True,
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, -2) for p in range(partitions)])
    out: dict[int, list[Record]] = {p: [] for p in range(partitions)}
    ended: set[int] = set()

    def at_the_end() -> bool:
        while (message := consumer.poll(0.5)) is not None:
            error = message.error()
            if error is not None:
                assert error.code() == KafkaError._PARTITION_EOF, error
                ended.add(message.partition() or 0)
                continue
            kind, stamp = message.timestamp()
            assert kind == 1  # CreateTime
            headers = tuple((k, v) for k, v in message.headers() or [])
            out[message.partition() or 0].append((message.key(), message.value(), headers, stamp))
        return len(ended) == partitions

    try:
        eventually(at_the_end, 120, f"reading {topic} to its end")
    finally:
        consumer.close()
    return out


def produce(bootstrap: str, topic: str) -> None:
    producer = CheckedProducer({"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": True})
    for i in range(COUNT):
        key = None if i % 7 == 0 else f"user-{i % 97}".encode()
        headers: list[tuple[str, bytes | None]] = [("trace", f"t{i}".encode())]
        if i % 5 == 0:
            headers.append(("empty", None))
        producer.produce(topic, key=key, value=bytes([i % 256]) + f"value {i}".encode(), headers=headers,
                         partition=i % PARTITIONS, timestamp=T0 + i * 1000)
    producer.flush(120)


@pytest.fixture(scope="module")
def backed_up(kafka: Any, minio: Any, spark: Any, tmp_path_factory: pytest.TempPathFactory) -> BackedUp:
    from shale.config import BucketConfig

    name = f"t-{uuid.uuid4().hex[:12]}"
    minio.create_bucket(name)
    bucket = BucketConfig(url=f"s3://{name}", endpoint=minio.endpoint, access_key_id=minio.access_key,
                          secret_access_key=minio.secret_key, allow_http=True)
    topic = f"orders-{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap_servers, topic, SOURCE_PARTITIONS)
    produce(kafka.bootstrap_servers, topic)
    records = read_topic(kafka.bootstrap_servers, topic, PARTITIONS)
    assert sum(len(r) for r in records.values()) == COUNT
    file = write_config(tmp_path_factory.mktemp("restore"), kafka.bootstrap_servers, bucket, [topic],
                        max_records_per_batch=1000)
    config = config_of(file)
    IngestJob(config, "backup", spark=spark, metastore=open_metastore(config)).run(available_now=True)
    return BackedUp(topic, file, config, records)


def restore_job(backed_up: BackedUp, spark: Any, target: str, **request: Any) -> RestoreJob:
    journal = open_metastore(backed_up.config)
    return RestoreJob(journal, backed_up.config.bucket, backed_up.config.kafka,
                      RestoreRequest(tenant="default", topic=backed_up.topic, target_topic=target, **request), spark,
                      journal=journal, by="the test")


def journal_of(backed_up: BackedUp, job: str) -> list[dict[str, Any]]:
    """The job's runs in the metastore's restore journal, oldest first."""
    return [r for r in reversed(open_index_view(backed_up.config).restores()) if r["job"] == job]


def restore(backed_up: BackedUp, spark: Any, target: str, **request: Any) -> Any:
    return restore_job(backed_up, spark, target, **request).run()


def test_a_deleted_topic_is_restored_record_for_record(kafka: Any, spark: Any, backed_up: BackedUp) -> None:
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    for future in admin.delete_topics([backed_up.topic]).values():
        future.result(timeout=30)
    eventually(lambda: backed_up.topic not in admin.list_topics(timeout=5).topics, 60, "the topic to be deleted")

    report = restore(backed_up, spark, backed_up.topic, commit_every=700)
    assert report.ok, report
    assert report.plan["records"] == COUNT
    # The source is gone: its partition count is what ingestion committed, the last one that never held a record
    # included (issue 54, point 14: it was missed), so the recreated topic has every partition it had.
    assert (report.plan["source_partitions"], report.plan["source_partitions_from"]) == (SOURCE_PARTITIONS, "metastore")
    assert len(admin.list_topics(backed_up.topic, timeout=10).topics[backed_up.topic].partitions) == SOURCE_PARTITIONS
    assert report.warnings == []
    assert [g for p in report.plan["partitions"] for g in p["gaps"]] == []
    assert read_topic(kafka.bootstrap_servers, backed_up.topic, PARTITIONS) == backed_up.records

    again = restore(backed_up, spark, backed_up.topic, commit_every=700)  # the same job: nothing left to send
    assert again.resumed
    assert sum(p.sent_now for p in again.partitions) == 0
    assert read_topic(kafka.bootstrap_servers, backed_up.topic, PARTITIONS) == backed_up.records


def test_a_restore_killed_mid_transaction_twice_sends_each_record_once(kafka: Any, backed_up: BackedUp,
                                                                       tmp_path: Path) -> None:
    target = f"{backed_up.topic}-killed"
    command = [sys.executable, "-m", "shale.cli", "--config", str(backed_up.file), "restore", "--tenant",
               "default", "--topic", backed_up.topic, "--target-topic", target, "--commit-every", "200"]
    # Killed with records sent and not committed, then with the progress record sent and not committed.
    for attempt, point in enumerate(("restore.mid-transaction", "restore.before-commit")):
        points = tmp_path / f"points-{attempt}"
        env = dict(os.environ, SHALE_FAILPOINTS=point, SHALE_FAILPOINT_DIR=str(points))
        run = ManagedProcess("restore", command, tmp_path / f"restore-{attempt}.log", env=env, cwd=ROOT)
        run.start()
        wait_paused(run, points, point, timeout=400)
        run.kill9()  # the driver, its JVM and the Python workers with their open transactions
        seen = read_topic(kafka.bootstrap_servers, target, PARTITIONS)
        restored = sum(len(r) for r in seen.values())
        assert 0 < restored < COUNT
        for partition, records in seen.items():  # a prefix of each partition: committed in order, none twice
            assert records == backed_up.records[partition][:len(records)]
    final = ManagedProcess("restore", command, tmp_path / "restore-3.log", cwd=ROOT)
    final.start()
    assert final.popen is not None
    assert final.popen.wait(timeout=600) == 0, final.log_path.read_text()[-3000:]
    assert read_topic(kafka.bootstrap_servers, target, PARTITIONS) == backed_up.records
    # The journal: the two killed runs ended as interrupted by the next start, the last one done; who ran them is
    # the local user (embedded metastore).
    runs = [r for r in reversed(open_index_view(backed_up.config).restores()) if r["target"].endswith(f" {target}")]
    assert [r["state"] for r in runs] == ["interrupted", "interrupted", "done"]
    assert runs[-1]["records"] == COUNT
    assert len({r["job"] for r in runs}) == 1
    assert all(r["by"] and r["by"] != "the test" for r in runs)


@pytest.fixture(scope="module")
def target_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """A second Kafka cluster: the restore's target."""
    broker = KafkaBroker(tmp_path_factory.mktemp("target-kafka"), heap="384m").start()
    yield broker
    broker.stop()


def test_until_stops_each_partition_at_the_named_time_in_another_cluster(spark: Any, backed_up: BackedUp,
                                                                        target_cluster: KafkaBroker) -> None:
    until = T0 + 1234 * 1000  # records 0..1233 are stamped before it
    target = f"{backed_up.topic}-until"
    job = RestoreJob(open_index_view(backed_up.config), backed_up.config.bucket,
                     KafkaConfig(bootstrap_servers=target_cluster.bootstrap_servers),
                     RestoreRequest(tenant="default", topic=backed_up.topic, target_topic=target,
                                    range=RestoreRange(until_ms=until)), spark)
    report = job.run()
    assert report.ok, report
    expected = {p: [r for r in records if r[3] < until] for p, records in backed_up.records.items()}
    assert sum(len(r) for r in expected.values()) == 1234
    assert read_topic(target_cluster.bootstrap_servers, target, PARTITIONS) == expected


def test_a_target_with_another_partition_count_gets_records_by_key_hash(kafka: Any, spark: Any,
                                                                        backed_up: BackedUp) -> None:
    target = f"{backed_up.topic}-wide"
    create_topic(kafka.bootstrap_servers, target, 5)
    report = restore(backed_up, spark, target)
    assert report.ok, report
    assert "murmur2" in report.plan["mapping"]
    got = read_topic(kafka.bootstrap_servers, target, 5)
    expected: dict[int, list[Record]] = {p: [] for p in range(5)}
    for source, records in backed_up.records.items():
        for record in records:
            key = record[0]
            expected[source % 5 if key is None else java_partition(key, 5)].append(record)
    # Each source partition's records keep their order within every target partition (so each key's order holds).
    for partition in range(5):
        assert sorted(got[partition], key=repr) == sorted(expected[partition], key=repr)
        for source in range(PARTITIONS):
            mine = [r for r in got[partition] if source_of(r) == source]
            assert mine == [r for r in expected[partition] if source_of(r) == source]


def source_of(record: Record) -> int:
    """The source partition a test record was produced to (its value says its number)."""
    assert record[1] is not None
    return int(record[1][1:].decode().split()[1]) % PARTITIONS


def test_a_gap_is_reported_before_anything_is_sent_and_stops_only_its_partition(kafka: Any, spark: Any,
                                                                               backed_up: BackedUp) -> None:
    held = len(backed_up.records[0])  # partition 0's backed-up offsets are [0, held)
    target = f"{backed_up.topic}-gap"
    wanted = RestoreRange(offsets={0: (0, held + 500), 1: (0, 200)})
    plan = restore_job(backed_up, spark, target, range=wanted).run(dry_run=True)
    assert not plan.executed
    gaps = [(p["partition"], g["start"], g["end"]) for p in plan.plan["partitions"] for g in p["gaps"]]
    assert gaps == [(0, held, held + 500)]
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    assert target not in admin.list_topics(timeout=10).topics  # the dry run sent nothing, created nothing

    report = restore_job(backed_up, spark, target, range=wanted).run()
    assert not report.ok
    first, second = report.partitions
    assert f"[{held}, {held + 500})" in first.error
    assert second.error == ""
    got = read_topic(kafka.bootstrap_servers, target, PARTITIONS)
    assert got == {0: backed_up.records[0], 1: backed_up.records[1][:200], 2: []}
    [run] = journal_of(backed_up, report.job)  # the dry run is not in the journal; the run is, stopped, with why
    assert (run["state"], run["by"], run["records"]) == ("stopped", "the test", held + 200)
    assert f"[{held}, {held + 500})" in run["message"]
    assert run["range"].startswith("offsets 0:0-")

    # A dry run into a target that holds records says so, for people too.
    from shale.cli.restore_cmd import report_text

    again = restore_job(backed_up, spark, target, range=wanted).run(dry_run=True)
    assert plan.warnings == []
    assert again.warnings == [f"the target topic {target} already holds records: a restore adds to them only with "
                              "--into-existing (a consumer would read both)"]
    text = report_text(again)
    assert f"-> {target} (exists, {SOURCE_PARTITIONS} partitions)" in text
    assert f"[{held},{held + 500}) " in text
    assert text.splitlines()[-1].startswith("warning: the target topic")


def test_a_consumer_group_resumes_from_translated_offsets(kafka: Any, spark: Any, backed_up: BackedUp) -> None:
    target = f"{backed_up.topic}-offsets"
    report = restore(backed_up, spark, target, commit_every=100)  # transaction markers move the target's offsets
    assert report.ok, report
    client = {"bootstrap.servers": kafka.bootstrap_servers}
    held = {p: len(r) for p, r in backed_up.records.items()}
    source = {0: held[0] // 2, 1: 0, 2: held[2]}  # the group's position on the deleted topic
    plan = restore_job(backed_up, spark, target).plan()
    anchors = read_anchors(client, report.job)  # where the restore's own records landed
    assert sorted(anchors) == list(range(PARTITIONS))
    translated = translate(plan, backed_up.config.bucket, client, target, source, anchors=anchors)
    assert translated[0] > source[0]  # the markers of the transactions before it
    counted = translate(plan, backed_up.config.bucket, client, target, source)  # restored alone: as counted
    assert (translated[0], translated[1]) == (counted[0], counted[1])  # at the end: before or after the last marker
    set_offsets(client, "billing", target, translated)

    consumer = Consumer({**client, "group.id": "billing", "isolation.level": "read_committed",
                         "enable.partition.eof": True, "enable.auto.commit": False, "auto.offset.reset": "latest"})
    consumer.subscribe([target])
    got: dict[int, list[Record]] = {p: [] for p in range(PARTITIONS)}
    ended: set[int] = set()

    def at_the_end() -> bool:
        while (message := consumer.poll(0.5)) is not None:
            if message.error() is not None:
                ended.add(message.partition() or 0)
                continue
            got[message.partition() or 0].append((message.key(), message.value(),
                                                  tuple(message.headers() or []), message.timestamp()[1]))
        return len(ended) == PARTITIONS

    try:
        eventually(at_the_end, 120, "the group to reach the end")
    finally:
        consumer.close()
    assert got == {p: backed_up.records[p][source[p]:] for p in range(PARTITIONS)}


def _sizes(backed_up: BackedUp) -> dict[int, list[int]]:
    return {p: [record_size(k, v, list(h)) for k, v, h, _ in records] for p, records in backed_up.records.items()}


def test_a_record_over_the_target_s_max_message_bytes_stops_its_partition_there(kafka: Any, spark: Any,
                                                                               backed_up: BackedUp) -> None:
    """The target's limit is one byte below the largest records: each partition is restored up to its first such
    record and stops naming it; every record of exactly the limit's size is accepted (the size is Kafka's own), and
    batches of many small records are never refused whole (the producer's batch is bounded by the limit)."""
    sizes = _sizes(backed_up)
    limit = max(max(s) for s in sizes.values()) - 1
    assert any(limit in s for s in sizes.values())  # some records are exactly at the limit
    target = f"{backed_up.topic}-small"
    create_topic_with(kafka.bootstrap_servers, target, SOURCE_PARTITIONS, **{"max.message.bytes": str(limit)})
    report = restore(backed_up, spark, target, commit_every=300)
    assert not report.ok
    got = read_topic(kafka.bootstrap_servers, target, PARTITIONS)
    for outcome in report.partitions:
        first_over = next(i for i, size in enumerate(sizes[outcome.partition]) if size > limit)
        assert got[outcome.partition] == backed_up.records[outcome.partition][:first_over]
        assert f"source offset {first_over} is {limit + 1} bytes" in outcome.error, outcome.error
        assert "--oversized dead-letter" in outcome.error
        assert outcome.next == first_over  # a rerun after raising the limit resumes at it


def test_oversized_records_go_to_the_bucket_when_asked_and_progress_is_reported(kafka: Any, spark: Any,
                                                                               backed_up: BackedUp) -> None:
    sizes = _sizes(backed_up)
    limit = max(max(s) for s in sizes.values()) - 1
    target = f"{backed_up.topic}-dead"
    create_topic_with(kafka.bootstrap_servers, target, SOURCE_PARTITIONS, **{"max.message.bytes": str(limit)})
    lines: list[ProgressLine] = []
    job = restore_job(backed_up, spark, target, dead_letter=True)
    job.on_progress, job.progress_interval = (lambda _, line: lines.append(line)), 0.5
    report = job.run()
    assert report.ok, report
    got = read_topic(kafka.bootstrap_servers, target, PARTITIONS)
    bucket = open_bucket(backed_up.config.bucket)
    for outcome in report.partitions:
        p = outcome.partition
        over = [i for i, size in enumerate(sizes[p]) if size > limit]
        assert got[p] == [r for i, r in enumerate(backed_up.records[p]) if i not in set(over)]
        assert outcome.dead_lettered == [f"default/restore-dead-letters/{report.job}/{p}-{i:020d}.json"
                                         for i in over]
        for i, key in zip(over, outcome.dead_lettered, strict=True):  # each one whole, to be replayed later
            letter = json.loads(bucket.get(key))
            k, v, headers, stamp = backed_up.records[p][i]
            assert (letter["offset"], letter["size"], letter["timestamp_ms"]) == (i, sizes[p][i], stamp)
            assert base64.b64decode(letter["value"]) == v
            assert base64.b64decode(letter["key"]) == k
            assert [(n, None if d is None else base64.b64decode(d)) for n, d in letter["headers"]] == list(headers)
    # The last progress report is the committed truth: every planned record restored (or dead-lettered).
    assert lines
    assert lines[-1].restored == lines[-1].planned == COUNT
    assert lines[-1].eta_seconds == 0
    for p in range(PARTITIONS):
        assert REGISTRY.get_sample_value("shale_restore_records_restored",
                                         {"job": report.job, "partition": str(p)}) == len(backed_up.records[p])
    assert REGISTRY.get_sample_value("shale_restore_dead_lettered_total", {"job": report.job}) == sum(
        len(o.dead_lettered) for o in report.partitions) > 0


def test_a_log_append_time_target_is_refused_before_anything_is_sent(kafka: Any, spark: Any,
                                                                      backed_up: BackedUp) -> None:
    target = f"{backed_up.topic}-appendtime"
    create_topic_with(kafka.bootstrap_servers, target, SOURCE_PARTITIONS, **{"message.timestamp.type": "LogAppendTime"})
    report = restore(backed_up, spark, target)
    assert not report.executed
    assert "LogAppendTime" in report.why_not
    assert read_topic(kafka.bootstrap_servers, target, PARTITIONS) == {p: [] for p in range(PARTITIONS)}
