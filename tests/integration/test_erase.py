"""``shale erase`` with real Kafka, MinIO, Spark and the metastore: a key is erased from a topic ingested into both
groups, with compacted and uncompacted blocks; afterwards an independent reader (pyarrow straight from the bucket)
finds no record of the key and every other record exactly once, verify reports the erased offsets as erased, a
restore of the topic leaves them out and says so, and the receipt's final scan is right. The same with the erasing
worker killed with SIGKILL in the middle of a rewrite: another worker takes its job over once its lease expires. The
topic's Iceberg table gets one snapshot for the erasure; Spark (Iceberg's own runtime) then reads every other record
once and none of the key, no retained snapshot names a file holding the key, and the receipt lists the snapshots
expired."""

from __future__ import annotations

import io
import json
import os
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient
from tests.integration.ingest_helpers import config_of, create_topic, wait_paused, write_config
from tests.producing import CheckedProducer
from tests.waiting import eventually

from shale.block import read_dataset
from shale.block.layout import blocks_prefixes, markers_prefix
from shale.compactor.worker import CompactionWorker
from shale.config import BucketConfig, RetentionConfig, ShaleConfig
from shale.dev.metastore import MetastoreCluster
from shale.erase import ErasureRequest, ReceiptNotReadyError, audit, erase, erasure_status, write_receipt
from shale.errors import NotFoundError
from shale.iceberg import IcebergPublisher, open_catalog, spark_catalog_conf
from shale.iceberg.catalog import SUMMARY_ERASURES, SUMMARY_EXPIRES, identifier
from shale.iceberg.erasure import receipt_check, snapshot_files
from shale.iceberg.files import key_of
from shale.ingest.job import IngestJob
from shale.kafka import describe_topics
from shale.metastore import MetastoreService, open_metastore
from shale.metastore.api.auth import write_private
from shale.metastore.api.maintenance import Maintenance
from shale.objstore import open_bucket
from shale.process import ManagedProcess
from shale.restore import RestoreJob, RestoreRequest
from shale.verify import build_ledger, verify_topic

ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = 3
ERASED = b"customer-42"
BASE_S = int(time.time()) - 1800  # within the broker's retention
Position = tuple[int, int]  # (partition, offset)


def _key(i: int) -> bytes:
    return ERASED if i % 11 == 5 else f"customer-{i % 13}".encode()


def produce(bootstrap: str, topic: str, start: int, count: int) -> None:
    producer = CheckedProducer({"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": True})
    for i in range(start, start + count):
        value = json.dumps({"ts": BASE_S + i, "level": "INFO", "msg": f"event {i}"}).encode()
        if i % 17 == 0:
            value = f"not json {i}".encode()  # quarantined by the partition group's parser
        producer.produce(topic, key=_key(i), value=value, partition=i % PARTITIONS)
    producer.flush(120)


def read_keys(bootstrap: str, topic: str) -> dict[Position, bytes | None]:
    """Every record's key a read_committed consumer sees, by (partition, offset)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4().hex}",
                         "isolation.level": "read_committed", "enable.partition.eof": True,
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, -2) for p in range(PARTITIONS)])
    out: dict[Position, bytes | None] = {}
    ended: set[int] = set()

    def at_the_end() -> bool:
        while (message := consumer.poll(0.5)) is not None:
            error = message.error()
            if error is not None:
                assert error.code() == KafkaError._PARTITION_EOF, error
                ended.add(message.partition() or 0)
                continue
            out[(message.partition() or 0, message.offset() or 0)] = message.key()
        return len(ended) == PARTITIONS

    try:
        eventually(at_the_end, 120, f"reading {topic} to its end")
    finally:
        consumer.close()
    return out


@dataclass
class World:
    topic: str
    file: Path
    config: ShaleConfig
    service: Any
    """The metastore: an embedded ``MetastoreService``, or a client of a Raft cluster (``cluster``)."""
    records: dict[Position, bytes | None]
    """Every record of the topic when the erasure is requested."""

    cluster: MetastoreCluster | None = None

    @property
    def erased(self) -> set[Position]:
        return {p for p, k in self.records.items() if k == ERASED}


def _ingest(world_config: ShaleConfig, spark: Any) -> None:
    for group in ("backup", "partition"):
        IngestJob(world_config, group, spark=spark, metastore=open_metastore(world_config)).run(available_now=True)


def _bucket(minio: Any) -> BucketConfig:
    name = f"e-{uuid.uuid4().hex[:12]}"
    minio.create_bucket(name)
    return BucketConfig(url=f"s3://{name}", endpoint=minio.endpoint, access_key_id=minio.access_key,
                        secret_access_key=minio.secret_key, allow_http=True)


def _world(kafka: Any, spark: Any, tmp_path: Path, bucket: BucketConfig, metastore: dict[str, Any] | None = None,
           cluster: MetastoreCluster | None = None) -> World:
    topic = f"billing-{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap_servers, topic, PARTITIONS)
    file = write_config(tmp_path, kafka.bootstrap_servers, bucket, [topic], metastore=metastore,
                        max_records_per_batch=150)
    with file.open("a") as out:  # a short lease, so a killed worker's job is taken over soon
        out.write("[compaction]\nblocks_per_job = [3]\nmax_level = 1\nlease_duration = 4\npoll_interval = 0.3\n"
                  "slots = 4\n")
    config = config_of(file)
    produce(kafka.bootstrap_servers, topic, 0, 600)
    _ingest(config, spark)
    service = open_metastore(config)
    assert isinstance(service, MetastoreService) == (cluster is None)
    CompactionWorker(service, config.bucket, spark, slots=4, poll_interval=0.3).run(until_idle=True)
    produce(kafka.bootstrap_servers, topic, 600, 300)  # blocks left uncompacted
    _ingest(config, spark)
    levels = Counter((m.group, m.level) for m in service.tenant_blocks("default"))
    assert set(levels) >= {("backup", 0), ("backup", 1), ("partition", 0), ("partition", 1)}, levels
    return World(topic, file, config, service, read_keys(kafka.bootstrap_servers, topic), cluster)


@pytest.fixture
def world(kafka: Any, minio: Any, spark: Any, tmp_path: Path) -> World:
    return _world(kafka, spark, tmp_path, _bucket(minio))


@pytest.fixture
def cluster_world(kafka: Any, minio: Any, spark: Any, tmp_path: Path) -> Iterator[World]:
    """The same topic on a 3-node Raft metastore whose leader runs maintenance every second (replaced blocks
    marked and deleted within seconds, the bucket scanned for unreported outputs)."""
    bucket = _bucket(minio)
    cluster = MetastoreCluster(tmp_path / "ms", 3, bucket=bucket, extra=[
        "compaction.blocks_per_job=[3]", "compaction.max_level=1", "compaction.lease_duration=4",
        "block.sync_delay=0", "block.delete_delay=1s", "bucket_index.max_stale_period=0",
        "metastore.maintenance_interval=1s", "metastore.bucket_scan_interval=2s"]).start()
    try:
        token = tmp_path / "admin.token"
        write_private(token, cluster.admin_token)
        yield _world(kafka, spark, tmp_path, bucket, {"mode": "remote", "addresses": cluster.addresses,
                                                      "token_file": str(token), "client_deadline": 60}, cluster)
    finally:
        cluster.stop()


def _erase(world: World, lagging: Callable[[], None] | None = None) -> str:
    """Erase the key with Kafka's watermarks. ``lagging``: the backup group has not read the last records yet;
    the dry run names what is behind, and the run's first wait runs ``lagging`` (the ingest catching up)."""
    dry = erase(world.service, world.config.bucket, ErasureRequest("default", ERASED, [world.topic]),
                kafka=world.config.kafka, dry_run=True)
    found = {(r["partition"], r["offset"]) for r in dry.records}
    if lagging is None:
        assert found == world.erased
        assert dry.unindexed == []
        holding = [m for m in world.service.tenant_blocks("default") if m.group == "backup" and any(
            r.start <= o < r.end and r.partition == p for r in m.kafka for p, o in world.erased)]
        assert dry.blocks_opened >= len(holding)  # every block holding the key; others only as false positives
        assert dry.blocks_opened <= len(holding) + 1
    else:
        assert found < world.erased
        assert {u["partition"] for u in dry.unindexed} == set(range(PARTITIONS))
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        if lagging is not None and len(waits) == 1:
            lagging()

    report = erase(world.service, world.config.bucket, ErasureRequest("default", ERASED, [world.topic]),
                   kafka=world.config.kafka, dry_run=False, by="the test", sleep=sleep)
    assert len(waits) == (lagging is not None)
    assert report.matches == len(world.erased)
    assert report.jobs
    assert {g for b in report.blocks for g in [b["group"]]} == {"backup", "partition"}
    return report.id


def _bucket_records(world: World) -> dict[str, Counter[Position]]:
    """An independent reader: pyarrow straight from the bucket, every Parquet object of every complete block
    not marked for deletion; per group, each record's copies (none may hold the key)."""
    config = world.config
    fs = pafs.S3FileSystem(endpoint_override=config.bucket.endpoint, scheme="http",
                           access_key=config.bucket.access_key_id,
                           secret_key=config.bucket.secret_access_key.get_secret_value(), region="us-east-1")
    name = config.bucket.url.removeprefix("s3://")
    infos = [i for prefix in blocks_prefixes("default") for i in fs.get_file_info(
        pafs.FileSelector(f"{name}/{prefix.rstrip('/')}", recursive=True, allow_not_found=True))]
    marks = fs.get_file_info(pafs.FileSelector(f"{name}/{markers_prefix('default').rstrip('/')}",
                                               allow_not_found=True))
    marked = {m.base_name.removesuffix("-deletion-mark.json") for m in marks
              if m.base_name.endswith("-deletion-mark.json")}
    complete = {i.path.rsplit("/", 2)[-2] for i in infos if i.path.endswith("/meta.json")} - marked
    seen: dict[str, Counter[Position]] = {"backup": Counter(), "partition": Counter()}
    for info in infos:
        folder = info.path.rsplit("/", 1)[0]
        block = folder.rsplit("/", 1)[-1]
        if not info.path.endswith(".parquet") or block not in complete:
            continue
        with fs.open_input_file(f"{folder}/meta.json") as meta_file:
            meta = json.loads(meta_file.read())
        if meta["tenant"] != "default" or any(r["topic"] != world.topic for r in meta["kafka"]):
            continue
        table = pq.read_table(info.path, filesystem=fs, columns=["partition", "offset", "key"])
        for partition, offset, key in zip(*(table.column(c).to_pylist() for c in ("partition", "offset", "key")),
                                          strict=True):
            assert key != ERASED, (meta["group"], partition, offset)
            seen[meta["group"]][(partition, offset)] += 1
    return seen


def _after(world: World, erasure: str, kafka: Any, spark: Any, tmp_path: Path, iceberg: Any = None,
           publisher: IcebergPublisher | None = None) -> None:
    """Everything a finished erasure must show (``iceberg``: the receipt checks the tables too)."""
    service, config = world.service, world.config
    assert erasure_status(service, erasure).state == "rewritten"
    bucket = open_bucket(config.bucket)
    if world.cluster is None:
        leader = Maintenance(service, bucket, RetentionConfig(), delete_delay=0, is_leader=lambda: True,
                             term=lambda: 1, sync_delay=0)
        leader.scan_bucket()  # marks what a killed worker wrote and never reported
        leader.collect_tombstones()  # the replaced blocks' objects leave the bucket
    else:  # the cluster's leader does both by itself, every second or two
        (row,) = service.erasures(erasure)
        eventually(lambda: not any(list(bucket.list(b["old_prefix"])) for b in row["blocks"]), 120,
                   "the leader to delete the replaced blocks")
    if publisher is not None:
        publisher.sync()  # deletes the copies the erasure's snapshots released

    # An independent reader: pyarrow straight from the bucket, every Parquet object of every complete block.
    kept = Counter({p: 1 for p in world.records if p not in world.erased})
    if world.cluster is None:
        seen = _bucket_records(world)
    else:  # wait for the leader's bucket scan to mark what an attempt cut off by the failover wrote
        def settled() -> dict[str, Counter[Position]] | None:
            try:  # an unreported output (a merge of the key's blocks cut off by the failover) holds the key until
                records = _bucket_records(world)  # the scan marks it: not yet, rather than a failure
            except AssertionError:
                return None
            return records if records["backup"] == kept and records["partition"] == kept else None

        found = eventually(settled, 120, "the leader's bucket scan to mark unreported outputs")
        assert found is not None
        seen = found
    assert seen["backup"] == kept  # every other record exactly once, none of the key
    assert seen["partition"] == kept

    for group in ("backup", "partition"):
        verified = verify_topic(service, bucket, config.kafka, group, 1, world.topic)
        assert verified.missing == 0, verified
        assert verified.duplicated == 0
        assert verified.erased == len(world.erased)
        assert {e for p in verified.partitions for e in p.erasures} == {erasure}
        ledger = build_ledger(service, group, 1, world.topic)  # the completeness ledger: erased, with the id
        assert {w.partition: w.erased for w in ledger.partitions} == {
            p: sum(1 for q, _ in world.erased if q == p) for p in range(PARTITIONS)}
        assert {tuple(w.erasures) for w in ledger.partitions} == {(erasure,)}

    target = f"{world.topic}-restored"
    restored = RestoreJob(open_metastore(config), config.bucket, config.kafka,
                          RestoreRequest(tenant="default", topic=world.topic, target_topic=target), spark,
                          journal=open_metastore(config), by="the test").run()
    assert restored.ok, restored
    assert restored.plan["erased"] == len(world.erased)
    assert any("erased" in w for w in restored.warnings)
    back = read_keys(kafka.bootstrap_servers, target)
    assert len(back) == len(kept)
    assert ERASED not in back.values()

    def receipt_written() -> dict[str, Any] | None:
        try:
            return write_receipt(open_metastore(config), bucket, erasure, kafka=config.kafka, iceberg=iceberg)
        except ReceiptNotReadyError:  # a block the leader marked still holds the key: it deletes it after the delay
            return None

    receipt = eventually(receipt_written, 120, "the receipt's leftover scan to find nothing")
    assert receipt is not None
    if iceberg is not None:
        (table,) = receipt["iceberg"]["tables"]
        assert table["snapshots_expired"]
        assert all(e["gone"] for e in table["snapshots_expired"])
        assert receipt["final_scan"]["iceberg_files"] > 0
    assert receipt["final_scan"]["matches"] == 0
    assert receipt["records"] == len(world.erased)
    assert set(receipt["final_scan"]["block_ids"]) >= {m.id for m in service.tenant_blocks("default")
                                                       if m.group == "backup"}
    assert all(d["gone"] for d in receipt["objects_deleted"])
    (held,) = receipt["not_reachable"]["kafka"]
    assert held["topic"] == world.topic
    assert held["holds_until_ms"] > receipt["requested_at_ms"]
    assert erasure_status(service, erasure).state == "done"
    # The leftover scan read every data object under the tenant's prefixes, and an auditor's run finds nothing.
    assert receipt["leftover_scan"]["leftovers"] == 0
    assert receipt["leftover_scan"]["objects_read"] >= len(service.tenant_blocks("default"))
    assert audit(bucket, receipt).leftovers == []


def test_a_key_is_erased_from_both_groups_and_every_generation_of_blocks(kafka: Any, spark: Any, world: World,
                                                                         tmp_path: Path) -> None:
    """The request is made while the last records (the key among them) are in Kafka only, produced after the
    last ingest: it waits until the backup group has read them (here the wait runs that ingest) and erases them
    too (before 2026-12-02 its scan missed them and the receipt was refused for ever)."""
    produce(kafka.bootstrap_servers, world.topic, 900, 120)
    world.records = read_keys(kafka.bootstrap_servers, world.topic)
    erasure = _erase(world, lagging=lambda: _ingest(world.config, spark))
    again = erase(world.service, world.config.bucket, ErasureRequest("default", ERASED, [world.topic]),
                  kafka=world.config.kafka, dry_run=True)  # made again now: a new erasure, of the same records
    assert (again.previous, again.matches) == (erasure, erasure_status(world.service, erasure).matches)
    assert again.watermarks
    assert all(m["incarnation"] for m in again.watermarks)  # each names the topic's id
    CompactionWorker(world.service, world.config.bucket, spark, slots=4, poll_interval=0.3).run(until_idle=True)
    _after(world, erasure, kafka, spark, tmp_path)


def test_a_topic_recreated_after_the_request_gets_its_receipt(kafka: Any, spark: Any, world: World) -> None:
    """The topic deleted and created again (a new topic id, offsets from 0) after the request, before its receipt,
    and the key produced in it: those records are new data to the erasure (an incarnation it does not name). The
    receipt is written (it was refused for ever: the final scan took them as the erasure's), and the same request
    made again erases them."""
    erasure = _erase(world)
    config = world.config
    old = describe_topics(config.kafka, [world.topic])[world.topic].incarnation
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    for future in admin.delete_topics([world.topic]).values():
        future.result(timeout=30)
    eventually(lambda: world.topic not in admin.list_topics(timeout=5).topics, 60, "the topic to be deleted")
    create_topic(kafka.bootstrap_servers, world.topic, PARTITIONS)
    produce(kafka.bootstrap_servers, world.topic, 0, 60)
    new = describe_topics(config.kafka, [world.topic])[world.topic].incarnation
    assert new != old
    _ingest(config, spark)
    CompactionWorker(world.service, config.bucket, spark, slots=4, poll_interval=0.3).run(until_idle=True)
    assert erasure_status(world.service, erasure).state == "rewritten"
    bucket = open_bucket(config.bucket)
    Maintenance(world.service, bucket, RetentionConfig(), delete_delay=0, is_leader=lambda: True, term=lambda: 1,
                sync_delay=0).collect_tombstones()

    receipt = write_receipt(open_metastore(config), bucket, erasure, kafka=config.kafka)
    assert receipt["final_scan"]["matches"] == 0
    assert receipt["records"] == len(world.erased)
    assert receipt["watermarks"]["unnamed"] == "later"
    assert {m["incarnation"] for m in receipt["watermarks"]["marks"]} == {old}
    later = {position for position, key in read_keys(kafka.bootstrap_servers, world.topic).items() if key == ERASED}
    assert later
    again = erase(world.service, config.bucket, ErasureRequest("default", ERASED, [world.topic]),
                  kafka=config.kafka, dry_run=True)
    assert again.previous == erasure
    assert {(r["partition"], r["offset"], r["incarnation"]) for r in again.records} == {
        (p, o, new) for p, o in later}


def test_the_iceberg_table_gets_one_snapshot_and_keeps_no_snapshot_of_the_key(kafka: Any, spark: Any, world: World,
                                                                              tmp_path: Path) -> None:
    catalog_name = f"erase_{uuid.uuid4().hex[:8]}"
    with world.file.open("a") as toml:
        toml.write(f'[iceberg]\nenabled = true\ncatalog_name = "{catalog_name}"\n'
                   f'catalog_uri = "sqlite:///{tmp_path}/catalog.db"\n')
    config = config_of(world.file)
    bucket = open_bucket(config.bucket)
    publisher = IcebergPublisher(config, world.service.state.reader, world.service.submit, bucket)
    # Merge what is mergeable first, so that the erasure's worker runs erase jobs only (a merge after them would be
    # a snapshot of its own).
    CompactionWorker(world.service, world.config.bucket, spark, slots=4, poll_interval=0.3).run(until_idle=True)
    assert publisher.sync()["snapshots"] >= 2  # the ingests and the merges
    name = identifier("default", world.topic)
    table = open_catalog(config).load_table(name)
    assert ERASED in _iceberg_keys(bucket, config, table)  # the table's snapshots name files holding the key

    erasure = _erase(world)
    CompactionWorker(world.service, world.config.bucket, spark, slots=4, poll_interval=0.3).run(until_idle=True)
    assert erasure_status(world.service, erasure).state == "rewritten"
    assert publisher.sync()["snapshots"] == 1  # one snapshot for the whole erasure
    table = open_catalog(config).load_table(name)
    (mine,) = [s for s in table.snapshots() if erasure in json.loads(
        s.summary.additional_properties.get(SUMMARY_ERASURES, "[]"))]
    expired = json.loads(mine.summary.additional_properties[SUMMARY_EXPIRES])
    assert expired
    assert not set(expired) & {s.snapshot_id for s in table.snapshots()}
    assert ERASED not in _iceberg_keys(bucket, config, table)  # no retained snapshot names a file holding it

    # Spark through Iceberg reads exactly the partition group's records: every other record once, none of the key.
    for key, value in spark_catalog_conf(config).items():
        spark.conf.set(key, value)
    read = spark.sql(f"SELECT partition, offset, key FROM {catalog_name}.default.`{world.topic}`").collect()
    assert ERASED not in {bytes(r.key) for r in read if r.key is not None}
    seen = Counter((r.partition, r.offset) for r in read)
    assert set(seen.values()) == {1}
    stored: Counter[Position] = Counter()
    for meta in world.service.tenant_blocks("default"):
        for d in meta.datasets:
            if meta.group == "partition":
                rows = read_dataset(bucket, meta, d, columns=["partition", "offset"])
                stored.update(zip(rows.column("partition").to_pylist(), rows.column("offset").to_pylist(),
                                  strict=True))
    quarantined = stored - seen
    assert not seen - stored  # Spark reads only stored records
    assert stored == Counter({p: 1 for p in world.records if p not in world.erased})
    assert quarantined
    assert all(p in world.records for p in quarantined)

    _after(world, erasure, kafka, spark, tmp_path, iceberg=receipt_check(config, bucket), publisher=publisher)


def _iceberg_keys(bucket: Any, config: ShaleConfig, table: Any) -> set[bytes]:
    """The keys every data file of every retained snapshot of ``table`` holds (read with pyarrow from the bucket;
    a file already deleted holds none)."""
    cache: dict[str, list[str]] = {}
    keys: set[bytes] = set()
    for uri in {u for s in table.metadata.snapshots for u in snapshot_files(table, s, cache)}:
        try:
            data = bucket.get(key_of(config.bucket, uri))
        except NotFoundError:
            continue
        keys |= set(pq.read_table(io.BytesIO(data), columns=["key"]).column("key").to_pylist())
    return keys


def test_the_erasing_worker_killed_mid_rewrite_is_taken_over(kafka: Any, spark: Any, world: World,
                                                            tmp_path: Path) -> None:
    erasure = _erase(world)
    points = tmp_path / "points"
    env = dict(os.environ, SHALE_FAILPOINTS="erasure.write", SHALE_FAILPOINT_DIR=str(points))
    worker = ManagedProcess("compact", [sys.executable, "-m", "shale.cli", "--config", str(world.file), "compact"],
                            tmp_path / "compact.log", env=env, cwd=ROOT)
    worker.start()
    wait_paused(worker, points, "erasure.write")
    worker.kill9()  # its Spark task had filtered a block's rows and not written the new block
    assert erasure_status(world.service, erasure).state == "rewriting"
    local = CompactionWorker(world.service, world.config.bucket, spark, slots=4, poll_interval=0.3)

    def finished() -> bool:
        local.step()
        return erasure_status(world.service, erasure).state == "rewritten"

    eventually(finished, 300, lambda: f"the erasure to finish: {erasure_status(world.service, erasure)}")
    local.run(until_idle=True)
    _after(world, erasure, kafka, spark, tmp_path)


def test_the_metastore_leader_killed_mid_erasure(kafka: Any, spark: Any, cluster_world: World,
                                                 tmp_path: Path) -> None:
    """kill -9 of the Raft leader while an erase job's task runs: the job's report reaches the new leader (or the
    job is handed out again once its lease expires), the same request again points to the first, and afterwards
    every other record is stored exactly once and the ledger reports the erased offsets as erased, with the id."""
    world = cluster_world
    assert world.cluster is not None
    erasure = _erase(world)
    points = tmp_path / "points"
    env = dict(os.environ, SHALE_FAILPOINTS="erasure.write=sleep-once:8", SHALE_FAILPOINT_DIR=str(points))
    worker = ManagedProcess("compact", [sys.executable, "-m", "shale.cli", "--config", str(world.file), "compact"],
                            tmp_path / "compact.log", env=env, cwd=ROOT)
    worker.start()
    try:
        wait_paused(worker, points, "erasure.write")  # a task has filtered a block's rows; it goes on in 8 s
        old = world.cluster.wait_leader()
        world.cluster.kill9(old)
        again = erase(world.service, world.config.bucket, ErasureRequest("default", ERASED, [world.topic]),
                      kafka=world.config.kafka, dry_run=True)  # answered by the new leader
        assert again.previous == erasure  # the first is past requested: made again, a new erasure
        assert world.cluster.wait_leader() != old

        def finished() -> bool:
            assert worker.alive(), worker.log_path.read_text()[-3000:]
            return erasure_status(world.service, erasure).state == "rewritten"

        eventually(finished, 300, lambda: f"the erasure to finish: {erasure_status(world.service, erasure)}")
    finally:
        worker.stop()
    world.cluster.start_node(old)  # back from its journal; the state it applies is the same
    _after(world, erasure, kafka, spark, tmp_path)


ORDER = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"},
    {"name": "customer", "type": {"type": "record", "name": "Customer", "fields": [
        {"name": "id", "type": "long"}, {"name": "name", "type": "string"}]}},
]}
CUSTOMER = 42


def test_the_records_of_a_typed_columns_value_are_erased_from_both_groups(
        kafka: Any, minio: Any, spark: Any, schema_registry: Any, tmp_path: Path) -> None:
    """``customer.id = 42`` in a registry-typed topic (Avro through Apicurio): the partition group is scanned for
    the value's hash, its records' positions erase the backup group's copies too, and nothing else goes."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from shale.erase import ColumnValueError, column_request

    topic = f"orders-{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap_servers, topic, PARTITIONS)
    serialize = AvroSerializer(SchemaRegistryClient({"url": schema_registry.url}), json.dumps(ORDER),
                               conf={"auto.register.schemas": True})
    context = SerializationContext(topic, MessageField.VALUE)
    producer = CheckedProducer({"bootstrap.servers": kafka.bootstrap_servers, "enable.idempotence": True})
    customers = {}
    for i in range(300):
        customers[i] = CUSTOMER if i % 13 == 4 else i % 40 + 100
        producer.produce(topic, key=str(i).encode(), partition=i % PARTITIONS, value=serialize(
            {"id": i, "customer": {"id": customers[i], "name": f"c{customers[i]}"}}, context))
    producer.flush(120)
    file = write_config(tmp_path, kafka.bootstrap_servers, _bucket(minio), [topic],
                        parsers_override=[{"parser": "avro"}], schema_registry={"url": schema_registry.url},
                        max_records_per_batch=60)
    config = config_of(file)
    _ingest(config, spark)
    service = open_metastore(config)
    records = read_keys(kafka.bootstrap_servers, topic)
    erased = {p for p, k in records.items() if k is not None and customers[int(k)] == CUSTOMER}
    assert len(erased) == sum(1 for c in customers.values() if c == CUSTOMER)

    with pytest.raises(ColumnValueError, match="not a number"):
        column_request(service, "default", "customer.id", "forty-two", [topic])
    request = column_request(service, "default", "customer.id", str(CUSTOMER), [topic])
    dry = erase(service, config.bucket, request, kafka=config.kafka, dry_run=True)
    assert {(r["partition"], r["offset"]) for r in dry.records} == erased
    report = erase(service, config.bucket, request, kafka=config.kafka, dry_run=False, by="the test")
    assert {b["group"] for b in report.blocks} == {"backup", "partition"}
    CompactionWorker(service, config.bucket, spark, slots=4, poll_interval=0.3).run(until_idle=True)
    assert erasure_status(service, report.id).state == "rewritten"
    bucket = open_bucket(config.bucket)
    Maintenance(service, bucket, RetentionConfig(), delete_delay=0, is_leader=lambda: True, term=lambda: 1,
                sync_delay=0).collect_tombstones()

    kept = Counter({p: 1 for p in records if p not in erased})
    seen = _bucket_records(World(topic, file, config, service, records))  # pyarrow straight from the bucket
    assert seen["backup"] == kept
    assert seen["partition"] == kept
    for meta in service.tenant_blocks("default"):
        for d in meta.datasets:
            if meta.group == "partition" and d.kind == "records":
                rows = read_dataset(bucket, meta, d, columns=["customer"]).column("customer").to_pylist()
                assert CUSTOMER not in {r["id"] for r in rows}
    for group in ("backup", "partition"):
        verified = verify_topic(service, bucket, config.kafka, group, 1, topic)
        assert verified.missing == 0, verified
        assert verified.erased == len(erased)
    receipt = write_receipt(open_metastore(config), bucket, report.id, kafka=config.kafka)
    assert receipt["matched_by"] == "column:customer.id"
    assert receipt["final_scan"]["matches"] == 0
    assert receipt["records"] == len(erased)
    assert set(receipt["final_scan"]["block_ids"]) >= {m.id for m in service.tenant_blocks("default")
                                                       if m.group == "partition"}
    assert receipt["leftover_scan"]["leftovers"] == 0
    assert audit(bucket, receipt).leftovers == []  # by the value's hash in every object, and the positions
