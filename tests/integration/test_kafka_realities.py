"""Kafka as it is, against a real broker, MinIO and Spark, each asserting the exact multiset of stored
(partition, offset) per group: a compacted topic read from its start; a topic deleted and recreated with fewer
records than the old committed end; offsets deleted by retention before they were read (reported with the exact
range, the other partitions go on, an operator's command lets the partition continue); records with bad
timestamps and a topic whose tenant rule gives no valid tenant (nothing halts); 5 MB records within a task's
memory bound."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
from tests.integration.ingest_helpers import ROOT, config_of, write_config
from tests.integration.kafka_world import create_topic, json_value, stored
from tests.waiting import eventually

from shale.block import read_dataset
from shale.compactor.worker import CompactionWorker
from shale.index import OffsetRow
from shale.ingest.committer import IngestConflictError
from shale.ingest.job import IngestJob
from shale.ingest.plan import Loss
from shale.kafka import delete_records_before, describe_topics, existing_offsets, offset_bounds
from shale.metastore import CommitIngestBatch, OffsetRange, open_metastore
from shale.objstore import open_bucket
from shale.query import Query, run_query
from shale.verify import group_blocks, verify_topic

GROUPS = ("backup", "partition")


def _produce(bootstrap: str, topic: str, values: list[bytes], partition: int | None = None,
             keys: list[bytes] | None = None, timestamps: list[int] | None = None, **config: object) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **config})
    errors: list[str] = []

    def delivered(err: object, _: object) -> None:
        if err is not None:
            errors.append(str(err))

    for i, value in enumerate(values):
        extra: dict[str, object] = {}
        if partition is not None:
            extra["partition"] = partition
        if keys is not None:
            extra["key"] = keys[i]
        if timestamps is not None:
            extra["timestamp"] = timestamps[i]
        while True:
            try:
                producer.produce(topic, value=value, on_delivery=delivered, **extra)
                break
            except BufferError:
                producer.poll(0.5)
        producer.poll(0)
    assert producer.flush(120) == 0
    assert not errors, errors[:3]


def _ingest(config, spark, metastore, groups=GROUPS) -> list[IngestJob]:  # type: ignore[no-untyped-def]
    jobs = [IngestJob(config, group, spark=spark, metastore=metastore) for group in groups]
    for job in jobs:
        job.run(available_now=True)
    return jobs


def test_compacted_topic_is_read_from_its_start(kafka, minio_bucket, spark, tmp_path: Path) -> None:
    topic = f"accounts-{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap_servers, topic, 1, **{"cleanup.policy": "compact", "segment.ms": "100",
                                                       "min.cleanable.dirty.ratio": "0.01",
                                                       "delete.retention.ms": "100", "min.compaction.lag.ms": "0"})
    # Every key updated six times, in segments that roll: the rounds' record times are a second apart, and Kafka
    # rolls a segment once a record's time is segment.ms past the segment's first record (no waiting needed).
    first = int(time.time() * 1000) - 60_000
    for round_ in range(6):
        _produce(kafka.bootstrap_servers, topic, [json_value(round_ * 50 + k) for k in range(50)],
                 keys=[f"account-{k}".encode() for k in range(50)], timestamps=[first + round_ * 1000] * 50)
    file = write_config(tmp_path, kafka.bootstrap_servers, minio_bucket, [topic])
    config = config_of(file)

    def compacted() -> bool:
        _produce(kafka.bootstrap_servers, topic, [json_value(999)], keys=[b"roll"])  # rolls the active segment
        return len(existing_offsets(config.kafka, topic, 0, 0, 300)) < 300

    eventually(compacted, 120, "Kafka's log cleaner to compact the topic")
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})  # stop the cleaner: the log holds still
    resource = ConfigResource("topic", topic, incremental_configs=[
        ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("retention.ms", "-1", incremental_operation=AlterConfigOpType.SET)])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)
    _, end = offset_bounds(config.kafka, [(topic, 0)])[(topic, 0)]

    def settled() -> set[tuple[int, int]]:  # a cleaning pass already under way has ended: two reads agree
        first = {(0, o) for o in existing_offsets(config.kafka, topic, 0, 0, end)}
        return first if first == {(0, o) for o in existing_offsets(config.kafka, topic, 0, 0, end)} else set()

    visible = eventually(settled, 60, "the compacted log to hold still")
    assert len(visible) < end  # compaction left gaps
    metastore = open_metastore(config)
    _ingest(config, spark, metastore)
    bucket = open_bucket(config.bucket)
    for group in GROUPS:
        records = stored(metastore, bucket, group, topic)
        assert set(records) == visible
        assert max(records.values()) == 1
        report = verify_topic(metastore, bucket, config.kafka, group, 1, topic)
        assert report.ok, report.as_dict()
        assert report.partitions[0].committed_end == end
        assert report.partitions[0].skipped == end - len(visible)


def test_recreated_topic_is_a_new_incarnation(kafka, minio_bucket, spark, tmp_path: Path) -> None:
    topic = f"orders-{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap_servers, topic, 1)
    _produce(kafka.bootstrap_servers, topic, [json_value(i) for i in range(500)])
    file = write_config(tmp_path, kafka.bootstrap_servers, minio_bucket, [topic])
    config = config_of(file)
    metastore = open_metastore(config)
    _ingest(config, spark, metastore)
    old = describe_topics(config.kafka, [topic])[topic].incarnation

    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    for future in admin.delete_topics([topic]).values():
        future.result(timeout=30)
    eventually(lambda: topic not in admin.list_topics(timeout=5).topics, 60, "the topic to be deleted")
    create_topic(kafka.bootstrap_servers, topic, 1)
    _produce(kafka.bootstrap_servers, topic, [json_value(1_000 + i) for i in range(100)])
    new = describe_topics(config.kafka, [topic])[topic].incarnation
    assert new != old
    _ingest(config, spark, metastore)

    bucket = open_bucket(config.bucket)
    for group in GROUPS:
        assert stored(metastore, bucket, group, topic, new) == {(0, o): 1 for o in range(100)}
        assert sum(stored(metastore, bucket, group, topic).values()) == 600  # the old incarnation's 500 are kept
        report = verify_topic(metastore, bucket, config.kafka, group, 1, topic)
        assert report.ok, report.as_dict()
        assert (report.stored, report.partitions[0].committed_end, report.partitions[0].incarnation) == (100, 100,
                                                                                                         new)
        [row] = [o for o in metastore.offsets(group, 1) if o.topic == topic]
        assert (row.committed_end, row.incarnation) == (100, new)
        past, _ = metastore.offset_history(group, 1)
        assert [(i.incarnation, i.committed_end) for i in past if i.topic == topic] == [(old, 500)]
        lineage = {r.incarnation for m in group_blocks(metastore, group, 1, topic) for r in m.kafka}
        assert lineage == {old, new}
    # A query across both incarnations returns all 600 records: offsets 0-99 of each are other records (issue 26).
    rows = run_query(Query("default", 0, 2**62, f'{{topic="{topic}"}}', group="backup"), metastore,
                     bucket).read_all()
    assert sorted(rows.column("offset").to_pylist()) == sorted([*range(500), *range(100)])


def test_a_topic_recreated_while_both_groups_and_compaction_run(kafka, minio_bucket, spark, tmp_path: Path) -> None:
    """Issue 26: the topic is deleted and recreated under running ingestion (both groups, continuous) and a running
    compaction worker; every record of both incarnations is stored once per group and a query across both
    returns each of them once, also after compaction merged blocks of the two incarnations."""
    topic = f"recreated-{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap_servers, topic, 2)
    _produce(kafka.bootstrap_servers, topic, [json_value(i) for i in range(400)])
    file = write_config(tmp_path, kafka.bootstrap_servers, minio_bucket, [topic], max_records_per_batch=100)
    with file.open("a") as f:
        f.write('[compaction]\nblocks_per_job = [4]\nmax_level = 1\n')
    config = config_of(file)
    metastore = open_metastore(config)
    stop = threading.Event()
    jobs = [IngestJob(config, group, spark=spark, metastore=metastore) for group in GROUPS]
    worker = CompactionWorker(metastore, config.bucket, spark, slots=1, poll_interval=0.5)  # type: ignore[arg-type]
    threads = [threading.Thread(target=job.run, kwargs={"stop": stop}, name=f"ingest-{job.group}") for job in jobs]
    threads.append(threading.Thread(target=worker.run, kwargs={"stop": stop}, name="compaction"))

    def committed(group: str) -> int:
        return sum(o.committed_end for o in metastore.offsets(group, 1) if o.topic == topic)

    for thread in threads:
        thread.start()
    try:
        eventually(lambda: all(committed(g) == 400 for g in GROUPS), 300, "both groups to commit the first 400")
        old = describe_topics(config.kafka, [topic])[topic].incarnation
        admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
        for future in admin.delete_topics([topic]).values():
            future.result(timeout=30)
        eventually(lambda: topic not in admin.list_topics(timeout=5).topics, 60, "the topic to be deleted")
        create_topic(kafka.bootstrap_servers, topic, 2)
        _produce(kafka.bootstrap_servers, topic, [json_value(1_000 + i) for i in range(200)])
        new = describe_topics(config.kafka, [topic])[topic].incarnation
        assert new != old

        def rows() -> list[tuple[str, OffsetRow]]:
            return [(g, o) for g in GROUPS for o in metastore.offsets(g, 1) if o.topic == topic]

        def caught_up() -> bool:
            return all(o.incarnation == new for _, o in rows()) and all(committed(g) == 200 for g in GROUPS)

        def state() -> str:  # what each group committed, for a failure's message (a stall seen once, 2026-12-04)
            held = [(g, o.partition, o.committed_end, "new" if o.incarnation == new else o.incarnation)
                    for g, o in rows()]
            return (f"both groups to commit the new incarnation's 200 (incarnation {new}, before {old}); committed "
                    f"(group, partition, end, incarnation): {held}; threads alive: "
                    f"{[t.name for t in threads if t.is_alive()]}")

        eventually(caught_up, 300, state)
    finally:
        stop.set()
        for thread in threads:
            thread.join(300)
    assert not any(t.is_alive() for t in threads), "a group or the worker did not stop"
    CompactionWorker(metastore, config.bucket, spark, slots=2, poll_interval=0.2).run(  # type: ignore[arg-type]
        until_idle=True)

    bucket = open_bucket(config.bucket)
    past, _ = metastore.offset_history("backup", 1)
    ends = {(i.partition, old): i.committed_end for i in past if i.topic == topic}
    assert sum(ends.values()) == 400
    ends |= {(o.partition, new): o.committed_end for o in metastore.offsets("backup", 1) if o.topic == topic}
    expected = sorted(o for (_, _), end in ends.items() for o in range(end))
    for group in GROUPS:
        assert sum(stored(metastore, bucket, group, topic).values()) == 600, group  # each record once
        rows = run_query(Query("default", 0, 2**62, f'{{topic="{topic}"}}', group=group), metastore,
                         bucket).read_all()
        assert sorted(rows.column("offset").to_pylist()) == expected, group
        assert rows.num_rows == 600
        report = verify_topic(metastore, bucket, config.kafka, group, 1, topic)
        assert report.ok, report.as_dict()
    merged = [m for m in metastore.query_blocks(["default"], 0, 2**62) if m.level == 1]
    assert merged, "compaction did not run"
    print(f"level-1 blocks: {len(merged)}; holding both incarnations: "
          f"{sum(len({r.incarnation for r in m.kafka}) > 1 for m in merged)}")


def test_offsets_deleted_before_they_were_read(kafka, minio_bucket, spark, tmp_path: Path) -> None:
    topic = f"events-{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap_servers, topic, 2)
    for partition in (0, 1):
        _produce(kafka.bootstrap_servers, topic, [json_value(i) for i in range(500)], partition=partition)
    file = write_config(tmp_path, kafka.bootstrap_servers, minio_bucket, [topic])
    config = config_of(file)
    metastore = open_metastore(config)
    _ingest(config, spark, metastore, ["backup"])
    for partition in (0, 1):
        _produce(kafka.bootstrap_servers, topic, [json_value(500 + i) for i in range(500)], partition=partition)
    delete_records_before(config.kafka, topic, 0, 800)  # retention ran before ingestion read [500, 800)

    job = IngestJob(config, "backup", spark=spark, metastore=metastore)
    job.committer.load()
    incarnation = describe_topics(config.kafka, [topic])[topic].incarnation
    assert job.plan().losses == [Loss(topic, 0, incarnation, 500, 800)]  # the exact range, per partition
    with pytest.raises(IngestConflictError, match=rf"blocked: {topic}\[0\]"):
        job.run(available_now=True)
    committed = {o.partition: o.committed_end for o in metastore.offsets("backup", 1) if o.topic == topic}
    assert committed == {0: 500, 1: 1000}  # the other partition went on

    # `shale verify` tells the lost offsets from those still to come: [500, 800) will never be stored.
    verify = subprocess.run([sys.executable, "-m", "shale.cli", "--config", str(file), "verify", "--group", "backup",
                             "--topic", topic], capture_output=True, text=True, cwd=ROOT, check=False)
    assert verify.returncode == 5, verify.stdout + verify.stderr
    assert "lost [500,800): Kafka's retention deleted these 300 offsets" in verify.stdout
    assert (f"shale offsets acknowledge-loss --group backup --generation 1 --topic {topic} --partition 0 --to 800"
            in verify.stdout)
    assert verify.stdout.rstrip().endswith("300 lost, 200 not yet ingested, 0 not in Kafka: LOST"), verify.stdout

    command = [sys.executable, "-m", "shale.cli", "--config", str(file), "offsets", "acknowledge-loss", "--group",
               "backup", "--topic", topic, "--partition", "0", "--to", "800", "--reason",
               "retention ran while ingestion was down"]
    # A dead-lettered commit set aside on replay holds [600, 700): its blocks are the only copy of those records,
    # so the loss is not acknowledged over it (case 12); once it is gone, the loss is.
    copy = f"_shale/dlq-rejected/ingest-backup-g1/{uuid.uuid4().hex}.json"
    bucket = open_bucket(config.bucket)
    bucket.put(copy, CommitIngestBatch(group="backup", lease=1, blocks=[], ranges=[OffsetRange(
        topic=topic, partition=0, start=600, end=700, incarnation=incarnation)]).model_dump_json().encode()
        + b'\n{"ok": false, "reason": "stale-lease"}')
    refused = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=False)
    assert refused.returncode != 0
    assert copy in refused.stderr, refused.stderr
    assert "only copy" in refused.stderr
    assert {o.partition: o.committed_end for o in metastore.offsets("backup", 1) if o.topic == topic}[0] == 500
    bucket.delete(copy)
    ack = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=False)
    assert ack.returncode == 0, ack.stderr
    assert "offsets [500,800) acknowledged as lost" in ack.stdout
    _ingest(config, spark, metastore, ["backup"])
    bucket = open_bucket(config.bucket)
    expected = {(0, o): 1 for o in [*range(500), *range(800, 1000)]} | {(1, o): 1 for o in range(1000)}
    assert stored(metastore, bucket, "backup", topic) == expected
    report = verify_topic(metastore, bucket, config.kafka, "backup", 1, topic)
    assert report.status == "OK", report.as_dict()  # the loss acknowledged: nothing lost, nothing still to come
    _, losses = metastore.offset_history("backup", 1)
    assert [(x.partition, x.start, x.end, x.reason) for x in losses] == [
        (0, 500, 800, "retention ran while ingestion was down")]


def test_bad_timestamps_and_a_bad_tenant_never_stop_a_group(kafka, minio_bucket, spark, tmp_path: Path) -> None:
    run = uuid.uuid4().hex[:6]
    stamps, good, bad_tenant = f"stamps{run}.x", f"billing{run}.events", f"Billing{run}.events"
    for topic in (stamps, good, bad_tenant):
        create_topic(kafka.bootstrap_servers, topic, 1, **{"message.timestamp.after.max.ms": str(2**63 - 1)})
    now_ms = int(time.time() * 1000)
    times = [-1, now_ms * 1000, now_ms + 5 * 365 * 86_400_000, now_ms]  # none, microseconds, far future, fine
    values = [json.dumps({"ts": t // 1000 if t > 0 else 1_795_000_000, "level": "INFO", "msg": "x"}).encode()
              for t in times]
    _produce(kafka.bootstrap_servers, stamps, values, timestamps=times)
    _produce(kafka.bootstrap_servers, good, [json_value(i) for i in range(10)])
    _produce(kafka.bootstrap_servers, bad_tenant, [json_value(i) for i in range(10)])
    file = write_config(tmp_path, kafka.bootstrap_servers, minio_bucket, [stamps, good, bad_tenant],
                        tenants=[{"topic_pattern": r"(?P<team>[A-Za-z0-9]+)\.events", "tenant": "{team}"}],
                        parsers_override=[{"parser": "json", "options": {"time_field": "ts",
                                                                          "time_format": "epoch_s"}}])
    config = config_of(file)
    metastore = open_metastore(config)
    _ingest(config, spark, metastore)  # nothing halts
    bucket = open_bucket(config.bucket)
    for group in GROUPS:
        assert stored(metastore, bucket, group, stamps) == {(0, o): 1 for o in range(4)}
        assert stored(metastore, bucket, group, good) == {(0, o): 1 for o in range(10)}
        assert stored(metastore, bucket, group, bad_tenant) == {(0, o): 1 for o in range(10)}
        blocks = group_blocks(metastore, group, 1, stamps)
        assert all(0 <= b.min_time <= b.max_time <= b.time_ms + 86_400_000 for b in blocks)  # bounded times
        assert {b.tenant for b in group_blocks(metastore, group, 1, good)} == {f"billing{run}"}
        [quarantine] = group_blocks(metastore, group, 1, bad_tenant)
        assert (quarantine.tenant, quarantine.datasets[0].kind) == ("default", "quarantine")
        reason = read_dataset(bucket, quarantine, quarantine.datasets[0]).column("reason")[0].as_py()
        assert f"gives no valid tenant for topic '{bad_tenant}'" in reason
    backup = next(b for b in group_blocks(metastore, "backup", 1, stamps) if b.datasets[0].kind == "records")
    kept = read_dataset(bucket, backup, backup.datasets[0]).column("timestamp")
    assert kept.cast(pa.timestamp("ms", tz="UTC")).cast(pa.int64()).to_pylist() == times  # stored as they are
    # The partition group parsed the event time from the value; the far-future record went to quarantine.
    partition_records = stored(metastore, bucket, "partition", stamps)
    assert sum(partition_records.values()) == 4


def test_large_records_stay_within_the_task_memory_bound(kafka, minio_bucket, spark, tmp_path: Path) -> None:
    topic = f"blobs-{uuid.uuid4().hex[:6]}"
    mib = 2**20
    create_topic(kafka.bootstrap_servers, topic, 1, **{"max.message.bytes": str(16 * mib)})
    payload = "x" * (5 * mib)
    values = [json.dumps({"ts": 1_795_000_000 + i, "level": "INFO", "msg": payload}).encode() for i in range(40)]
    _produce(kafka.bootstrap_servers, topic, values, **{"message.max.bytes": 16 * mib, "batch.size": 16 * mib})
    bound = 384 * mib
    file = write_config(tmp_path, kafka.bootstrap_servers, minio_bucket, [topic], max_task_bytes=bound)
    config = config_of(file)
    metastore = open_metastore(config)
    jobs = _ingest(config, spark, metastore)
    bucket = open_bucket(config.bucket)
    for job in jobs:
        records = stored(metastore, bucket, job.group, topic)
        assert records == {(0, o): 1 for o in range(40)}
        print(f"{job.group}: peak task memory {job.report.peak_task_rss / mib:.0f} MiB of {bound / mib:.0f} MiB, "
              f"{len(group_blocks(metastore, job.group, 1, topic))} blocks")
        assert 0 < job.report.peak_task_rss <= bound


def test_a_partition_never_read_is_sized_from_its_first_records(kafka, minio_bucket, spark, tmp_path: Path) -> None:
    """No probe batch: the first plan samples the partition's first records and keeps to ``max_batch_bytes``."""
    topic = f"sized-{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap_servers, topic, 1)
    _produce(kafka.bootstrap_servers, topic, [json_value(i, msg="y" * 10_000) for i in range(300)])
    file = write_config(tmp_path, kafka.bootstrap_servers, minio_bucket, [topic], max_batch_bytes="1MiB")
    config = config_of(file)
    job = IngestJob(config, "backup", spark=spark, metastore=open_metastore(config))
    job.committer.load()
    sampled = job.plan().ranges[0]
    assert sampled.start == 0
    assert job.record_bytes[(topic, 0)] > 10_000
    assert 90 <= sampled.end <= 105  # about 1 MiB of 10 kB values (a probe would have read all 300 at once)
    job.run(available_now=True)
    assert job.batches == 3
    assert stored(job.metastore, open_bucket(config.bucket), "backup", topic) == {(0, o): 1 for o in range(300)}
