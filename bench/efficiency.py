"""Efficiency: MB and records per second per busy core, Kafka to committed blocks in both ingest groups, for JSON,
Avro and Protobuf records of about 130 bytes and about 1 KB; and the same per-core figure for the Apache Iceberg
Kafka Connect sink and for Spark's Kafka-to-Parquet file sink, on the same broker, MinIO and topics in the same run.

Records are log lines: ``ts`` (event time, epoch milliseconds; Avro ``timestamp-millis``, Protobuf
``google.protobuf.Timestamp``), ``level``, ``host`` and ``msg``, where ``msg`` is real Loghub text (Apache, HDFS,
OpenSSH, Spark, Zookeeper and Linux samples, cycled; ``shale.demo.loghub_lines``): for the ~130-byte records one
line cut so that the JSON value is at most 130 bytes, for the ~1 KB ones consecutive lines joined by line ends up
to 1,024 bytes of JSON. The Avro and Protobuf values hold the same fields in their binary encodings through the
real registry (Apicurio; confluent-kafka's ``AvroSerializer`` and ``ProtobufSerializer``), so they are smaller;
MB are the topic's value bytes, each format's own. Topics have 4 partitions.

Shale runs as ``shale run`` (the freshness benchmark's deployment: the metastore, both ingest groups and a
compaction worker, each a process and a Spark application in local mode), every setting at its default but
``ingest.backup_trigger_interval`` at the partition group's 5 s (from 30 s: the backup group then reads each case
when the partition group does, as under steady load, instead of idling up to 30 s inside the measured window), and
its processes are set to nice 0 (``shale run`` starts the backup group and the compactor at nice 10: on this
shared machine the backup group then waited minutes behind other engineers' work; CPU seconds do not depend on
it). It warms up first on small topics of each format (the JVMs started, the Python workers forked, the writer schemas
fetched). Then each case's records are produced in one Kafka transaction: the groups plan up to the last stable
offset, so they see nothing until the commit and then the whole case at once. The window runs from just before
the commit to the moment both groups' committed offsets (the metastore's, polled every 0.5 s) reach the topic's
end. Shale's CPU seconds in the window are those of ``shale run``'s whole process tree from /proc
(``bench.efficiency_cpu``): its drivers, Spark JVMs, Python workers (those that exited in the window too, through
the process that reaped them) and services; the broker's, MinIO's and the registry's are counted apart.
``mb_per_s_per_core_<format>_<size>`` = value MB / Shale's CPU seconds, ``records_per_s_per_core_...`` likewise:
both groups' work on the same records counts once, as a user pays it. ``shale_idle_cores`` is what the warm
deployment uses with nothing to read (inside every window too).

The peers read the JSON topics after Shale is stopped, each started cold on the full topic:

* the Iceberg Kafka Connect sink (``bench/connect.py``, the peers benchmark's worker and settings: one task,
  commit interval 1 s): its JVM's CPU from its "Kafka Connect started" log line (the worker and plugins loaded;
  the task's start, consumer group join and table creation are inside) until its table holds every record;
* Spark's file sink (an ``availableNow`` Structured Streaming query, Kafka source to Parquet on MinIO through S3A,
  as ``bench/ingest.py`` runs it) in this process's warm local SparkSession (``local[2]``): the CPU of this
  process and its Spark JVM and Python workers. It stores the raw Kafka record (no parsing): a floor, not a
  decoder.

The JSON 1 KB case runs once more, unmeasured, under py-spy (``bench.efficiency_profile``: 50 samples a second,
``--nonblocking``) on each ingest group's process tree: the profile of where the Python time goes, beside the
/proc split of each case's CPU between Spark JVMs, Python workers and drivers. This machine (2 cores) was shared
with other engineers' work while this ran: the busy cores of the whole machine in each window are in the result's
details; the per-core figures count only the CPU of the processes named.

``python -m bench efficiency`` runs it in full; ``python -m bench.efficiency --quick`` with few records (a few
minutes, for development; it writes the result too, marked quick).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from tests.integration.ingest_helpers import create_topic

from bench import efficiency_cpu as cpu
from bench.common import progress, write_result
from bench.efficiency_profile import start_recording, summarize
from bench.efficiency_shale import PARTITIONS, CaseRun, Deployment, ServiceRoots
from bench.services import kafka_broker, minio_bucket
from shale.config import BucketConfig
from shale.demo import LOGHUB_FORMATS, loghub_lines
from shale.dev import SchemaRegistry

QUICK = os.environ.get("EFFICIENCY_QUICK", "") == "1"

FORMATS = ("json", "avro", "protobuf")
SIZES = {"130": 130, "1k": 1024}
RECORDS = {"130": 20_000, "1k": 8_000} if QUICK else {"130": 300_000, "1k": 100_000}
PARTIAL = Path(os.environ.get("EFFICIENCY_PARTIAL", Path(tempfile.gettempdir()) / "shale-bench-efficiency.json"))
WARM_RECORDS = 2_000 if QUICK else 10_000
BASE_MS = 1_764_633_600_000  # 2025-12-02T00:00:00Z
LEVELS = (b"ERROR", b"WARN", b"INFO", b"DEBUG", b"FATAL")
AVRO_SCHEMA = {"type": "record", "name": "LogLine", "namespace": "bench", "fields": [
    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "level", "type": "string"}, {"name": "host", "type": "string"}, {"name": "msg", "type": "string"}]}
PROTO = """syntax = "proto3";
package bench;
import "google/protobuf/timestamp.proto";
message LogLine {
  google.protobuf.Timestamp ts = 1;
  string level = 2;
  string host = 3;
  string msg = 4;
}
"""


# -- records ------------------------------------------------------------------------------------------------------

def log_records(size: int, count: int) -> Iterator[dict[str, Any]]:
    """``count`` log records whose JSON value is at most ``size`` bytes (as close as whole characters allow)."""
    lines = [(name, line.decode(errors="replace")) for name in LOGHUB_FORMATS
             for line in loghub_lines(name) if line.strip()]
    for i in range(count):
        name, line = lines[i % len(lines)]
        level = next((lv.decode() for lv in LEVELS if lv.decode() in line), "INFO")
        record: dict[str, Any] = {"ts": BASE_MS + i, "level": level, "host": f"{name.lower()}-{i % 16}", "msg": ""}
        room = size - len(json_value(record))
        msg, j = line, i + 1
        while len(msg.encode()) < room:  # the ~1 KB records: the lines that follow in the same sample
            msg += "\n" + lines[j % len(lines)][1]
            j += 1
        record["msg"] = msg[:room]
        while len(json_value(record)) > size:  # escapes and multi-byte characters take more than one byte
            record["msg"] = record["msg"][:-4]
        yield record


def json_value(record: dict[str, Any]) -> bytes:
    return json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode()


def serializer(fmt: str, registry_url: str, topic: str) -> Callable[[dict[str, Any]], bytes]:
    """The value bytes of a record in ``fmt`` (Avro and Protobuf in the Confluent wire format, the schema
    registered on the first call)."""
    if fmt == "json":
        return json_value
    client = SchemaRegistryClient({"url": registry_url})
    context = SerializationContext(topic, MessageField.VALUE)
    if fmt == "avro":
        avro = AvroSerializer(client, json.dumps(AVRO_SCHEMA))
        return lambda r: bytes(avro(r, context) or b"")
    from google.protobuf import message_factory

    from shale.schemas.protobuf import ProtoFile, compile_text

    cls = message_factory.GetMessageClass(ProtoFile(compile_text(PROTO, "bench/logline.proto", []), []).message([0]))
    proto = ProtobufSerializer(cls, client, {"use.deprecated.format": False})

    def encode(r: dict[str, Any]) -> bytes:
        message = cls(level=r["level"], host=r["host"], msg=r["msg"])
        message.ts.FromMilliseconds(r["ts"])
        return bytes(proto(message, context) or b"")

    return encode


def produce(bootstrap: str, topic: str, values: list[bytes], transactional: bool) -> Producer:
    """``values`` round-robin over the partitions; in one open transaction if ``transactional`` (the caller
    commits it with ``commit_transaction()``), else flushed."""
    config = {"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.size": 1_000_000, "compression.type": "lz4",
              "queue.buffering.max.messages": 500_000}
    if transactional:
        config |= {"transactional.id": f"bench-{topic}", "transaction.timeout.ms": 900_000}
    producer = Producer(config)
    if transactional:
        producer.init_transactions(60)
        producer.begin_transaction()
    for i, value in enumerate(values):
        while True:
            try:
                producer.produce(topic, value, key=str(i).encode(), partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(300):
        raise RuntimeError(f"could not deliver every record to {topic}")
    return producer


def topic_of(fmt: str, size: str) -> str:
    return f"eff-{fmt}-{size}"


PROFILED = "eff-json-1k-profiled"
"""The JSON 1 KB case again, under py-spy (its JSON parser rule matches it like the others)."""


# -- the peers ----------------------------------------------------------------------------------------------------

def iceberg_sink(work: Path, bootstrap: str, bucket: BucketConfig, topic: str, records: int,
                 roots: ServiceRoots) -> dict[str, float]:
    """The Connect worker on the full ``topic``: CPU from its start and from "Kafka Connect started" until its
    table holds ``records`` rows."""
    from bench.connect import ConnectWorker, IcebergSink, SinkTable, wait_for
    from bench.peers import LOW_LATENCY_FLUSH_MS

    sink = IcebergSink(f"eff-kc-{topic}", topic, 1_000, LOW_LATENCY_FLUSH_MS)
    create_topic(bootstrap, sink.control_topic, 1)
    worker = ConnectWorker(work, bootstrap, bucket, sink)
    table = SinkTable(worker.catalog_db, bucket, sink.table)
    try:
        with cpu.sampled() as whole:
            worker.start()
            assert worker.process is not None
            pid = worker.process.pid
            wait_for(lambda: worker.log_path.exists() and
                     "Kafka Connect started" in worker.log_path.read_text(errors="replace"), 900,
                     "the worker's 'Kafka Connect started'", worker)
            with cpu.sampled() as window:
                wait_for(lambda: table.committed_records() >= records, 1800, "every record in the sink's table",
                         worker)
    finally:
        worker.stop()
    assert window.after is not None
    return {"cpu_s": window.total([pid]), "cpu_s_from_start": whole.total([pid]),
            "seconds": window.after.at - window.before.at, **roots.apart(window)}


def spark_sink(spark: Any, bootstrap: str, topic: str, path: str, checkpoint: Path, records: int,
               roots: ServiceRoots) -> dict[str, float]:
    """Spark's file sink on the full ``topic`` (``bench.ingest``'s query, to MinIO through S3A): the CPU of this
    process and its descendants but the services."""
    with cpu.sampled() as window:
        query = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
                 .option("subscribe", topic).option("startingOffsets", "earliest").option("includeHeaders", "true")
                 .option("maxOffsetsPerTrigger", "500000").load()
                 .writeStream.format("parquet").option("compression", "zstd")
                 .option("path", path).option("checkpointLocation", str(checkpoint))
                 .trigger(availableNow=True).start())
        query.awaitTermination()
    assert window.after is not None
    stored = spark.read.parquet(path).count()
    if stored != records:
        raise RuntimeError(f"Spark's sink stored {stored} rows of {records}")
    return {"cpu_s": window.total([os.getpid()], roots.services), "seconds": window.after.at - window.before.at,
            **roots.apart(window)}


def _spark_session(bucket: BucketConfig) -> Any:
    from bench.ingest import s3a_conf
    from shale.config import SparkConfig
    from shale.dev import connector_conf
    from shale.spark import spark_session

    s3a = s3a_conf(bucket)
    conf = {**s3a, "spark.jars": f"{connector_conf()['spark.jars']},{s3a['spark.jars']}"}
    spark = spark_session("shale-bench-efficiency", SparkConfig(master="local[2]", conf=conf))
    spark.range(1000).mapInArrow(lambda it: it, "id long").count()  # warm: the JVM and a Python worker
    return spark


# -- the benchmark ------------------------------------------------------------------------------------------------

@contextmanager
def _registry(work: Path) -> Iterator[SchemaRegistry]:
    registry = SchemaRegistry(work / "registry").start()
    try:
        yield registry
    finally:
        registry.stop()


def _profile(deployment: Deployment, bootstrap: str, registry_url: str, work: Path) -> dict[str, Any]:
    """The JSON 1 KB case once more on its own topic, each ingest group's tree under py-spy."""
    topic = PROFILED
    values = [json_value(r) for r in log_records(SIZES["1k"], RECORDS["1k"])]
    producer = produce(bootstrap, topic, values, transactional=True)
    spies = {group: (start_recording(pid, work / f"py-spy-{group}.txt"), work / f"py-spy-{group}.txt")
             for group, pid in deployment.group_pids().items()}
    time.sleep(2)  # py-spy attached
    producer.commit_transaction(60)
    deployment.wait_committed(topic, len(values))
    out: dict[str, Any] = {}
    for group, (spy, path) in spies.items():
        spy.send_signal(signal.SIGINT)
        _, err = spy.communicate(timeout=120)
        if not path.exists():
            raise RuntimeError(f"py-spy wrote no profile of the {group} group: {err.decode()[-2000:]}")
        profile = summarize(path.read_text(errors="replace"))
        out[group] = {"samples": profile.samples, "self": profile.self_share, "inclusive": profile.inclusive_share}
    return out


def _per_core(records: int, value_bytes: int, cpu_s: float) -> tuple[float, float]:
    return round(value_bytes / 1e6 / cpu_s, 2), round(records / cpu_s)


def run() -> dict[str, Any]:
    signal.signal(signal.SIGTERM, lambda signum, _: sys.exit(128 + signum))  # stopped: clean up the services
    cases: dict[str, CaseRun] = {}
    peers: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="shale-bench-efficiency-") as tmp, kafka_broker() as broker, \
            minio_bucket() as bucket, _registry(Path(tmp)) as registry:
        work, bootstrap = Path(tmp), broker.bootstrap_servers
        roots = ServiceRoots.of(broker, bucket, registry)
        topics = [*(topic_of(f, s) for f in FORMATS for s in (*SIZES, "warm")), PROFILED]
        for topic in topics:
            create_topic(bootstrap, topic, PARTITIONS)
        progress("warm-up topics")
        for fmt in FORMATS:
            encode = serializer(fmt, registry.url, topic_of(fmt, "warm"))
            produce(bootstrap, topic_of(fmt, "warm"), [encode(r) for r in log_records(130, WARM_RECORDS)], False)
        sizes: dict[str, tuple[int, int]] = {}
        with Deployment.start(work / "shale", bootstrap, bucket, registry.url, topics, roots) as deployment:
            deployment.unnice()
            for fmt in FORMATS:
                deployment.wait_committed(topic_of(fmt, "warm"), WARM_RECORDS)
            idle = deployment.idle_cores(10.0)
            progress(f"Shale warm; idle it uses {idle:.2f} cores")
            for size, fmt in ((s, f) for s in SIZES for f in FORMATS):
                topic = topic_of(fmt, size)
                encode = serializer(fmt, registry.url, topic)
                values = [encode(r) for r in log_records(SIZES[size], RECORDS[size])]
                sizes[topic] = (len(values), sum(map(len, values)))
                progress(f"{topic}: {len(values):,} records, {sizes[topic][1] / len(values):.0f} bytes each")
                producer = produce(bootstrap, topic, values, transactional=True)
                del values
                cases[topic] = deployment.measure(topic, sizes[topic][0], producer.commit_transaction)
                _save(cases, peers, sizes, idle)
                mb, rec = _per_core(*sizes[topic], cases[topic].shale_cpu)
                progress(f"  {cases[topic].seconds:.1f} s, {cases[topic].shale_cpu:.1f} Shale CPU s: "
                         f"{mb} MB/s, {rec:,} records/s per core")
            progress("profile: JSON 1 KB under py-spy")
            profile = _profile(deployment, bootstrap, registry.url, work)
            _save(cases, peers, sizes, idle, profile)
        for size in SIZES:
            topic = topic_of("json", size)
            progress(f"the Iceberg Kafka Connect sink on {topic}")
            peers[f"iceberg_kc_{size}"] = iceberg_sink(
                work / f"kc-{size}", bootstrap, bucket.model_copy(update={"url": f"{bucket.url}/kc-{size}"}), topic,
                sizes[topic][0], roots)
            _save(cases, peers, sizes, idle, profile)
        progress("Spark's Kafka-to-Parquet sink")
        spark = _spark_session(bucket)
        s3a_root = f"s3a://{bucket.url.removeprefix('s3://')}"
        spark_sink(spark, bootstrap, topic_of("json", "warm"), f"{s3a_root}/spark-warm", work / "ck-warm",
                   WARM_RECORDS, roots)
        for size in SIZES:
            topic = topic_of("json", size)
            peers[f"spark_sink_{size}"] = spark_sink(spark, bootstrap, topic, f"{s3a_root}/spark-{size}",
                                                     work / f"ck-{size}", sizes[topic][0], roots)
            _save(cases, peers, sizes, idle, profile)
        spark.stop()
        shutil.rmtree(work / "shale", ignore_errors=True)
    return _report(cases, peers, sizes, idle, profile)


def where_time_goes(case: CaseRun, profile: dict[str, Any]) -> str:
    """The notes' paragraph on the JSON 1 KB case: its CPU by process kind and service (/proc), and each ingest
    group's top Python functions by self time (py-spy, the unmeasured run)."""
    total = case.shale_cpu
    kinds = ", ".join(f"{k.replace('_', ' ')} {v / total:.0%}" for k, v in sorted(
        case.by_kind.items(), key=lambda kv: -kv[1]))
    services = ", ".join(f"{k} {v / total:.0%}" for k, v in sorted(case.by_service.items(), key=lambda kv: -kv[1]))
    lines = [f"Where each core's time goes (the JSON 1 KB case, {case.records:,} records, {total:.1f} CPU seconds "
             f"of Shale's processes): by kind of process {kinds}; by service {services}. The broker used "
             f"{case.apart.get('cpu_s_kafka', 0.0):.1f} CPU s and MinIO {case.apart.get('cpu_s_minio', 0.0):.1f} "
             "beside it. The Python time of each ingest group (drivers and Spark Python workers), by py-spy in a "
             "separate unmeasured run of the same case: the functions the samples were in (self time, share of "
             "the group's Python samples):", ""]
    for group, found in sorted(profile.items()):
        top = "; ".join(f"`{name}` {share:.1%}" for name, share in found["self"][:10])
        lines.append(f"* {group} ({found['samples']:,} samples): {top}.")
    return "\n".join(lines) + "\n"


def _save(cases: dict[str, CaseRun], peers: dict[str, dict[str, float]], sizes: dict[str, tuple[int, int]],
          idle: float, profile: dict[str, Any] | None = None) -> None:
    """What the run measured so far, in ``PARTIAL``: a run that fails late (a peer's JVM) keeps its cases, and
    ``python -m bench.efficiency --report`` writes the result from them."""
    PARTIAL.write_text(json.dumps({"quick": QUICK, "cases": {t: c.as_dict() for t, c in cases.items()}, "peers": peers,
                                   "sizes": sizes, "idle": idle, "profile": profile or {}}))


def _report_saved() -> dict[str, Any]:
    saved = json.loads(PARTIAL.read_text())
    return _report({t: CaseRun(**c) for t, c in saved["cases"].items()}, saved["peers"],
                   {t: (n, b) for t, (n, b) in saved["sizes"].items()}, saved["idle"], saved["profile"])


def _report(cases: dict[str, CaseRun], peers: dict[str, dict[str, float]], sizes: dict[str, tuple[int, int]],
            idle: float, profile: dict[str, Any]) -> dict[str, Any]:
    figures: dict[str, float] = {}
    for fmt, size in ((f, s) for f in FORMATS for s in SIZES if topic_of(f, s) in cases):  # all, but a partial run
        topic = topic_of(fmt, size)
        mb, rec = _per_core(*sizes[topic], cases[topic].shale_cpu)
        figures[f"mb_per_s_per_core_{fmt}_{size}"] = mb
        figures[f"records_per_s_per_core_{fmt}_{size}"] = rec
        figures[f"value_bytes_{fmt}_{size}"] = round(sizes[topic][1] / sizes[topic][0])
    figures["shale_idle_cores"] = round(idle, 2)
    baseline: dict[str, float] = {}
    ratios: dict[str, float] = {}
    for peer, result in peers.items():
        name, size = peer.rsplit("_", 1)
        if f"mb_per_s_per_core_json_{size}" not in figures:
            continue
        mb, rec = _per_core(*sizes[topic_of("json", size)], result["cpu_s"])
        baseline[f"mb_per_s_per_core_json_{size}_{name}"] = mb
        baseline[f"records_per_s_per_core_json_{size}_{name}"] = rec
        ratios[f"json_{size}_vs_{name}"] = round(figures[f"mb_per_s_per_core_json_{size}"] / mb, 2)
    notes = (__doc__ or "") + ("\n**Quick run** (few records): not the committed figures.\n" if QUICK else "")
    if topic_of("json", "1k") in cases:
        notes += "\n" + where_time_goes(cases[topic_of("json", "1k")], profile)
    details = {"quick": QUICK, "records": RECORDS, "cases": {t: c.as_dict() for t, c in cases.items()},
               "peers": peers, "profile": profile}
    return write_result("efficiency", figures, baseline, ratios, notes, details)


if __name__ == "__main__":
    if "--quick" in sys.argv[1:]:
        os.environ["EFFICIENCY_QUICK"] = "1"
        os.execv(sys.executable, [sys.executable, "-m", "bench", "efficiency"])
    if "--report" in sys.argv[1:]:
        QUICK = json.loads(PARTIAL.read_text())["quick"]
        _report_saved()
    else:
        run()
