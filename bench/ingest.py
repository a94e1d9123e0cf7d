"""Backup-group ingest throughput against Spark's own Kafka-to-Parquet file sink (to local disk and to MinIO
through Hadoop's S3A connector), Kafka's own consumer performance tool and a raw consumer, on the same topic in
the same run.

One topic of 4 partitions holds 1,000,000 records (real Loghub lines, cycled: about 110 bytes each). Every
contender runs in the same local-mode SparkSession (``local[2]``: this machine's two cores), reads from the
earliest offsets in batches of at most 500,000 records, writes zstd Parquet, and is timed from its start to its
end (Spark's session start-up is excluded). Both persist the whole record, headers included (``includeHeaders``),
as a backup must.

* Shale: the backup group (``IngestJob.run(available_now=True)``): per batch, offsets planned from the metastore,
  one Spark task per core reading its share of the ranges with one librdkafka consumer (``shale.ingest.source``)
  into the chunk writer, put-if-absent, checksums, meta.json last and one metastore commit. Its headline
  figures write to MinIO over HTTP on the same disk; Shale writing to a ``file://`` bucket is reported too
  (obstore's local store syncs every object to disk, which Spark's sink does not).
* Spark's file sink: an ``availableNow`` Structured Streaming query (Kafka source, ``maxOffsetsPerTrigger``
  500,000, Parquet sink, checkpoint on local disk). That is Spark's own exactly-once Kafka-to-Parquet pipeline,
  the one a user would run to keep a topic in Parquet (offsets in its checkpoint, files in the sink's
  ``_spark_metadata`` log), so it is the fair counterpart of an ingest group. A batch
  ``spark.read.format("kafka")...write.parquet`` keeps no offsets (so no exactly-once), and its commit renames
  every file, a copy on S3A: it would be both less than a sink and slower than one. The sink writes once to a
  local folder and once to MinIO through Hadoop's S3A connector (``hadoop-aws`` and the AWS SDK bundle for
  pyspark's Hadoop, credentials in the session's secret properties file), the same object store Shale writes to.
* Kafka's ``org.apache.kafka.tools.ConsumerPerformance`` (``kafka-tools`` at the broker's version, its own JVM)
  reads the same topic: the physical ceiling. Its fetch rate (``fetch.nMsg.sec``: from its first fetch to its
  last record, its group join excluded) is the baseline, which is the stricter of its two rates.
* A confluent-kafka consumer in one Python process only reads the topic.

The contenders run interleaved in three rounds on the same topic and the best run of each is reported (this
machine's timings vary by tens of percent from run to run). Ratios above 1 mean Shale is faster.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from tests.integration.ingest_helpers import create_topic
from tests.producing import CheckedProducer

from bench.common import CpuSnapshot, cpu_snapshot, progress, timed, write_result
from bench.services import kafka_broker, minio_bucket
from shale.config import BucketConfig, IngestConfig, ShaleConfig, SparkConfig
from shale.demo import LOGHUB_FORMATS, loghub_lines
from shale.dev import connector_conf
from shale.dev.fetch import kafka_tools_classpath, s3a_jars
from shale.dev.kafka import java_binary
from shale.ingest import metrics
from shale.ingest.job import IngestJob
from shale.kafka import FETCH_BYTES
from shale.metastore import open_metastore
from shale.spark import spark_session

RECORDS = 1_000_000
PARTITIONS = 4
BATCH = 500_000
ROUNDS = 3


def produce_records(bootstrap: str, topic: str, count: int = RECORDS) -> int:
    lines = [line for sample in LOGHUB_FORMATS for line in loghub_lines(sample)]
    producer = CheckedProducer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.size": 1_000_000,
                                "compression.type": "lz4", "queue.buffering.max.messages": 500_000})
    size = 0
    for i in range(count):
        value = lines[i % len(lines)]
        size += len(value)
        producer.produce(topic, value, partition=i % PARTITIONS)
    producer.flush(300)
    return size


def _raw_consumer(bootstrap: str, topic: str) -> float:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "fetch.max.bytes": 64 * 2**20})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    seen = 0
    with timed() as t:
        while seen < RECORDS:
            seen += sum(1 for m in consumer.consume(10_000, timeout=1.0) if m.error() is None)
    consumer.close()
    return t[0]


def _consumer_perf(bootstrap: str, topic: str) -> float:
    """Seconds Kafka's ConsumerPerformance takes to fetch the topic, by its own report (``fetch.nMsg.sec``)."""
    command = [java_binary(), "-Xmx512m", "-cp", kafka_tools_classpath(), "org.apache.kafka.tools.ConsumerPerformance",
               "--bootstrap-server", bootstrap, "--topic", topic, "--messages", str(RECORDS),
               "--group", f"bench-{uuid.uuid4().hex}", "--timeout", "60000"]
    proc = subprocess.run(command, capture_output=True, text=True, check=False, timeout=300)
    lines = [line for line in proc.stdout.splitlines() if "," in line]
    if proc.returncode != 0 or len(lines) < 2:
        raise RuntimeError(f"ConsumerPerformance failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}")
    report = dict(zip([h.strip() for h in lines[0].split(",")], [v.strip() for v in lines[-1].split(",")],
                      strict=True))
    if int(report["data.consumed.in.nMsg"]) < RECORDS:
        raise RuntimeError(f"ConsumerPerformance read {report['data.consumed.in.nMsg']} of {RECORDS} records")
    return RECORDS / float(report["fetch.nMsg.sec"])


def _shale(spark: Any, bootstrap: str, topic: str, bucket: BucketConfig, work: Path,
           breakdowns: list[dict[str, float]] | None = None) -> float:
    config = ShaleConfig(bucket=bucket, kafka={"bootstrap_servers": bootstrap},  # type: ignore[arg-type]
                         metastore={"data_dir": str(work / "metastore")},  # type: ignore[arg-type]
                         ingest=IngestConfig(topics=[topic], max_records_per_batch=BATCH))
    phases, cpu = _phase_seconds(), cpu_snapshot()
    seconds = timed_ingest(spark, config, RECORDS)
    if breakdowns is not None:
        after = _phase_seconds()
        breakdowns.append({"wall": seconds, **{k: v - phases.get(k, 0.0) for k, v in after.items()},
                           **_cpu_seconds(cpu, cpu_snapshot())})
    return seconds


def _phase_seconds() -> dict[str, float]:
    """The backup group's phase counters in this process (the job runs in it): ``driver.<phase>`` and
    ``tasks.<phase>`` (``shale_ingest_batch_seconds_total``, ``shale_ingest_task_seconds_total``)."""
    out: dict[str, float] = {}
    for prefix, counter in (("driver", metrics.BATCH_SECONDS), ("tasks", metrics.TASK_SECONDS)):
        for sample in counter.collect()[0].samples:
            if sample.name.endswith("_total") and sample.labels["group"] == "backup":
                out[f"{prefix}.{sample.labels['phase']}"] = sample.value
    return out


def _cpu_seconds(before: CpuSnapshot, after: CpuSnapshot) -> dict[str, float]:
    """CPU seconds between the snapshots: this process (the driver), Spark's JVM, its Python workers, Kafka, MinIO
    and the rest of the machine."""
    me, use = os.getpid(), {"cpu.driver": 0.0, "cpu.jvm": 0.0, "cpu.python_workers": 0.0, "cpu.kafka": 0.0,
                            "cpu.minio": 0.0}
    for pid, (_, _, command, cpu) in after.processes.items():
        # Command lines are cut at 300 characters: Spark's JVM is the Java process that is not Kafka's.
        name = ("cpu.driver" if pid == me else "cpu.kafka" if "kafka.Kafka" in command
                else "cpu.jvm" if "java" in command.split(" ", 1)[0]
                else "cpu.python_workers" if "daemon" in command and "python" in command
                else "cpu.minio" if "minio" in command else None)
        if name:
            use[name] += cpu - before.processes.get(pid, (0, 0, "", 0.0))[3]
    use["cpu.other"] = max(0.0, after.busy - before.busy - sum(use.values()))
    return use


def _breakdown_note(b: dict[str, float]) -> str:
    """Where the time of the fastest Shale run to MinIO went, per 1,000,000 records."""
    k = 1_000_000 / RECORDS

    def f(key: str) -> str:
        return f"{b.get(key, 0.0) * k:.2f} s"

    return (
        f"Where the time goes (appended for each run; the fastest Shale run to MinIO, per 1,000,000 records, from "
        f"the group's phase counters ``shale_ingest_batch_seconds_total`` and ``shale_ingest_task_seconds_total`` "
        f"and the processes' CPU seconds in /proc): wall {f('wall')}; the driver's loop: plan {f('driver.plan')}, "
        f"Spark jobs {f('driver.spark')}, commits {f('driver.commit')}. The Spark tasks (two at a time, summed): "
        f"waiting for the task's Kafka consumer's next records {f('tasks.wait')}, "
        f"normalizing {f('tasks.normalize')}, Parquet encoding and checksums {f('tasks.encode')}, object-store "
        f"requests {f('tasks.upload')}. CPU: Spark's JVM {f('cpu.jvm')}, Python workers {f('cpu.python_workers')}, "
        f"the driver {f('cpu.driver')}, MinIO {f('cpu.minio')}, Kafka {f('cpu.kafka')}, the rest of the machine "
        f"{f('cpu.other')}.")


def timed_ingest(spark: Any, config: ShaleConfig, expected: int, group: str = "backup") -> float:
    """Seconds the group takes to store everything Kafka holds now; checks it committed ``expected`` offsets."""
    job = IngestJob(config, group, spark=spark, metastore=open_metastore(config))
    with timed() as t:
        job.run(available_now=True)
    committed = sum(o.committed_end for o in job.metastore.offsets(group, 1))
    assert committed == expected, committed
    return t[0]


def _spark_sink(spark: Any, bootstrap: str, topic: str, path: str, checkpoint: Path,
                consumer: dict[str, str] | None = None) -> float:
    with timed() as t:
        source = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
                  .option("subscribe", topic).option("startingOffsets", "earliest").option("includeHeaders", "true")
                  .option("maxOffsetsPerTrigger", str(BATCH)))
        for key, value in (consumer or {}).items():
            source = source.option(f"kafka.{key}", value)
        query = (source.load()
                 .writeStream.format("parquet").option("compression", "zstd")
                 .option("path", path).option("checkpointLocation", str(checkpoint))
                 .trigger(availableNow=True).start())
        query.awaitTermination()
    assert spark.read.parquet(path).count() == RECORDS
    return t[0]


def s3a_conf(bucket: BucketConfig) -> dict[str, str]:
    """Spark settings for Hadoop's S3A connector to reach ``bucket``'s MinIO. The keys' names look secret, so
    ``spark_session`` passes them in a private properties file, never on the JVM's command line."""
    return {"spark.jars": ",".join(str(p) for p in s3a_jars()),
            "spark.hadoop.fs.s3a.endpoint": bucket.endpoint, "spark.hadoop.fs.s3a.endpoint.region": "us-east-1",
            "spark.hadoop.fs.s3a.path.style.access": "true",
            "spark.hadoop.fs.s3a.connection.ssl.enabled": str(not bucket.allow_http).lower(),
            "spark.hadoop.fs.s3a.access.key": bucket.access_key_id,
            "spark.hadoop.fs.s3a.secret.key": bucket.secret_access_key.get_secret_value()}


def run() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="shale-bench-ingest-") as tmp, kafka_broker() as broker, \
            minio_bucket() as bucket:
        work, topic, bootstrap = Path(tmp), "bench", broker.bootstrap_servers
        create_topic(bootstrap, topic, PARTITIONS)
        progress(f"producing {RECORDS:,} records")
        size = produce_records(bootstrap, topic)
        s3a = s3a_conf(bucket)
        conf = {**s3a, "spark.jars": f"{connector_conf()['spark.jars']},{s3a['spark.jars']}"}
        spark = spark_session("shale-bench-ingest", SparkConfig(master="local[2]", conf=conf))
        progress("warming up Spark and its Python workers")
        spark.range(1000).mapInArrow(lambda it: it, "id long").count()
        s3a_root = f"s3a://{bucket.url.removeprefix('s3://')}"
        breakdowns: list[dict[str, float]] = []  # per Shale run to MinIO
        contenders: dict[str, tuple[str, Callable[[int], float]]] = {
            "consumer_perf": ("Kafka ConsumerPerformance", lambda _: _consumer_perf(bootstrap, topic)),
            "raw": ("raw consumer", lambda _: _raw_consumer(bootstrap, topic)),
            "sink": ("Spark file sink (local disk)", lambda i: _spark_sink(
                spark, bootstrap, topic, str(work / f"sink{i}"), work / f"sink-checkpoint{i}")),
            "sink_same_fetch": ("Spark file sink (local disk, Shale's fetch size)", lambda i: _spark_sink(
                spark, bootstrap, topic, str(work / f"sink-fetch{i}"), work / f"sink-fetch-checkpoint{i}",
                {"max.partition.fetch.bytes": str(FETCH_BYTES)})),
            "s3a_sink": ("Spark file sink (MinIO through S3A)", lambda i: _spark_sink(
                spark, bootstrap, topic, f"{s3a_root}/spark-sink/r{i}", work / f"s3a-checkpoint{i}")),
            "shale_file": ("Shale backup group (local file bucket)", lambda i: _shale(
                spark, bootstrap, topic, BucketConfig(url=f"file://{work}/bucket{i}"), work / f"a{i}")),
            "shale_minio": ("Shale backup group (MinIO)", lambda i: _shale(
                spark, bootstrap, topic, bucket.model_copy(update={"url": f"{bucket.url}/r{i}"}), work / f"b{i}",
                breakdowns)),
        }
        runs: dict[str, list[float]] = {name: [] for name in contenders}
        for attempt in range(ROUNDS):  # interleaved rounds; the best of each is reported
            for name, (what, contender) in contenders.items():
                progress(f"round {attempt + 1}/{ROUNDS}: {what}")
                runs[name].append(contender(attempt))
        best = {name: min(seconds) for name, seconds in runs.items()}
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    ours, mb = best["shale_minio"], size / 1e6
    return write_result(
        "ingest",
        figures={"records_per_s": round(RECORDS / ours), "mb_per_s": round(mb / ours, 2),
                 "records_per_s_local_bucket": round(RECORDS / best["shale_file"]), "records": RECORDS,
                 "value_mb": round(mb, 1)},
        baseline={"spark_file_sink_records_per_s": round(RECORDS / best["sink"]),
                  "spark_s3a_sink_records_per_s": round(RECORDS / best["s3a_sink"]),
                  "spark_file_sink_same_fetch_records_per_s": round(RECORDS / best["sink_same_fetch"]),
                  "kafka_consumer_perf_records_per_s": round(RECORDS / best["consumer_perf"]),
                  "raw_consumer_records_per_s": round(RECORDS / best["raw"])},
        ratios={"vs_spark_file_sink": round(best["sink"] / ours, 2),
                "vs_spark_s3a_sink": round(best["s3a_sink"] / ours, 2),
                "vs_spark_file_sink_same_fetch": round(best["sink_same_fetch"] / ours, 2),
                "vs_kafka_consumer_perf": round(best["consumer_perf"] / ours, 2),
                "vs_raw_consumer": round(best["raw"] / ours, 2),
                "local_bucket_vs_spark_file_sink": round(best["sink"] / best["shale_file"], 2)},
        notes=(__doc__ or "") + "\n" + _breakdown_note(min(breakdowns, key=lambda b: b["wall"])),
    )
