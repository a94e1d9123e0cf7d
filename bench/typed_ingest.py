"""Typed ingest of Schema Registry Avro against Spark's own ``from_avro`` path, on the same topic in the same run.

One topic of 4 partitions holds 200,000 records of ``bench/typed_decode.py``'s schema (20 fields: nested records,
an array, a map, a nullable union, decimal, timestamp-millis, date, uuid, enum), written with confluent-kafka's
``AvroSerializer`` through the real registry (Apicurio 3.0.9), so each value is the Confluent wire format (a zero
byte, the schema id, the Avro datum). Both contenders run in the same local-mode SparkSession (``local[2]``: this
machine's two cores), read the topic from the earliest offsets in batches of at most 50,000 records with matching
Kafka consumer settings (``max.partition.fetch.bytes`` 16 MiB, ``read_committed``, headers included), write zstd
Parquet to the same MinIO, and are timed from their start to their end (the session's start-up excluded).

* Shale: the partition group with the ``avro`` parser (``IngestJob.run(available_now=True)``): per batch, offsets
  planned from the metastore, one Spark task per core reading its share of the ranges with one librdkafka
  consumer (``shale.ingest.source``) into the chunk writer, which fetches the writer schema from the registry
  once per id and process and decodes with fastavro into typed Arrow columns (decimal128(12, 2), timestamp,
  date32, struct, list, map), then put-if-absent, meta.json last and one metastore commit. Each row keeps the
  Kafka record (key, value, headers, offsets) beside the typed columns.
* Spark: an ``availableNow`` Structured Streaming query (Kafka source, ``maxOffsetsPerTrigger`` 50,000), the
  5-byte Confluent header cut with ``substring(value, 6)``, ``from_avro`` of ``spark-avro`` (at pyspark's version,
  ``make bench-deps``) with the same schema, the Kafka columns kept beside the decoded ones as Shale keeps them,
  written by the Parquet sink to MinIO through Hadoop's S3A connector (checkpoint on local disk). That is what a
  Spark user would write to keep such a topic typed; it needs the schema in the job (``from_avro`` knows nothing
  of a registry) and fails the query on a record it cannot decode, where Shale quarantines it.

The contenders run interleaved in three rounds and the best run of each is reported (this machine's timings vary
by tens of percent from run to run). A ratio above 1 means Shale is faster. The cost figures are CPU seconds per
1,000,000 records of Spark's JVM, its Python workers and the driver (this process and its descendants; Kafka, MinIO,
the registry and other users' processes left out), and
the seconds one Python process takes to decode 1,000,000 of these records into a typed Arrow table with Shale's
decoder (``shale.schemas.avro.Decoder``, measured on 20,000 of them).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from tests.integration.ingest_helpers import create_topic
from tests.producing import CheckedProducer

from bench.common import CpuSnapshot, cpu_snapshot, progress, timed, write_result
from bench.ingest import s3a_conf, timed_ingest
from bench.services import kafka_broker, minio_bucket
from bench.typed_decode import SCHEMA, _datum
from shale.config import BucketConfig, ShaleConfig, SparkConfig
from shale.dev import SchemaRegistry, connector_conf
from shale.dev.fetch import spark_avro_jars
from shale.kafka import FETCH_BYTES
from shale.schemas.avro import Decoder
from shale.schemas.wire import payload
from shale.spark import spark_session

RECORDS = 200_000
PARTITIONS = 4
BATCH = 50_000
ROUNDS = 3
DECODE_SAMPLE = 20_000
TOPIC = "bench.typed"


def produce(bootstrap: str, registry_url: str) -> list[bytes]:
    """The records, serialized by confluent-kafka's AvroSerializer (the schema registered on the first); returns
    the first ``DECODE_SAMPLE`` values."""
    serializer = AvroSerializer(SchemaRegistryClient({"url": registry_url}), json.dumps(SCHEMA))
    context = SerializationContext(TOPIC, MessageField.VALUE)
    producer = CheckedProducer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.size": 1_000_000,
                                "compression.type": "lz4", "queue.buffering.max.messages": 500_000})
    sample = []
    for i in range(RECORDS):
        value = serializer(_datum(i), context)
        if i < DECODE_SAMPLE:
            sample.append(value)
        producer.produce(TOPIC, value, key=str(i).encode(), partition=i % PARTITIONS)
    producer.flush(300)
    return sample


def _shale(spark: Any, bootstrap: str, registry_url: str, bucket: BucketConfig, work: Path) -> float:
    config = ShaleConfig.model_validate({
        "bucket": bucket.model_dump(), "kafka": {"bootstrap_servers": bootstrap},
        "metastore": {"data_dir": str(work / "metastore")},
        "ingest": {"topics": [TOPIC], "max_records_per_batch": BATCH, "schema_registry": {"url": registry_url},
                   "parsers": [{"parser": "avro", "options": {"time_field": "ts"}}]}})
    return timed_ingest(spark, config, RECORDS, group="partition")


def _spark_from_avro(spark: Any, bootstrap: str, path: str, checkpoint: Path) -> float:
    from pyspark.sql.avro.functions import from_avro
    from pyspark.sql.functions import col, expr

    with timed() as t:
        kafka = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
                 .option("subscribe", TOPIC).option("startingOffsets", "earliest").option("includeHeaders", "true")
                 .option("kafka.isolation.level", "read_committed")
                 .option("kafka.max.partition.fetch.bytes", str(FETCH_BYTES))
                 .option("maxOffsetsPerTrigger", str(BATCH)).load())
        decoded = kafka.select("*", from_avro(expr("substring(value, 6)"), json.dumps(SCHEMA)).alias("record"))
        query = (decoded.select(*(col(c) for c in kafka.columns), "record.*")
                 .writeStream.format("parquet").option("compression", "zstd")
                 .option("path", path).option("checkpointLocation", str(checkpoint))
                 .trigger(availableNow=True).start())
        query.awaitTermination()
    stored = spark.read.parquet(path)
    assert stored.count() == RECORDS
    assert dict(stored.dtypes)["amount"] == "decimal(12,2)"
    return t[0]


def _cpu(before: CpuSnapshot, after: CpuSnapshot) -> float:
    """CPU seconds between the snapshots of this process (the driver) and its descendants but Kafka, MinIO and the
    registry: Spark's JVM and its Python workers. Other people's processes on this shared machine are not counted.
    Command lines are cut at 300 characters: the services' names come early in theirs."""
    me, total = os.getpid(), 0.0
    for pid, (_, _, command, cpu) in after.processes.items():
        if any(name in command for name in ("kafka.Kafka", "apicurio", "minio")):
            continue
        ancestor, hops = pid, 0
        while ancestor not in (me, 0, 1) and ancestor in after.processes and hops < 64:
            ancestor, hops = after.processes[ancestor][0], hops + 1
        if ancestor == me:
            total += cpu - before.processes.get(pid, (0, 0, "", 0.0))[3]
    return total


def _decode_seconds(sample: list[bytes]) -> float:
    """Seconds Shale's decoder takes for ``sample`` into one typed Arrow table, in this process."""
    decoder = Decoder(SCHEMA)
    schema = pa.schema(list(decoder.arrow))
    with timed() as t:
        pa.Table.from_pylist([decoder.decode(payload(v)) for v in sample], schema=schema)
    return t[0]


def run() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="shale-bench-typed-") as tmp, kafka_broker() as broker, \
            minio_bucket() as bucket:
        work, bootstrap = Path(tmp), broker.bootstrap_servers
        registry = SchemaRegistry(work / "registry").start()
        try:
            create_topic(bootstrap, TOPIC, PARTITIONS)
            progress(f"producing {RECORDS:,} Avro records with AvroSerializer")
            sample = produce(bootstrap, registry.url)
            s3a = s3a_conf(bucket)
            jars = [connector_conf()["spark.jars"], s3a["spark.jars"], *(str(p) for p in spark_avro_jars())]
            spark = spark_session("shale-bench-typed-ingest",
                                  SparkConfig(master="local[2]", conf={**s3a, "spark.jars": ",".join(jars)}))
            progress("warming up Spark and its Python workers")
            spark.range(1000).mapInArrow(lambda it: it, "id long").count()
            s3a_root = f"s3a://{bucket.url.removeprefix('s3://')}"
            contenders: dict[str, tuple[str, Callable[[int], float]]] = {
                "spark": ("Spark from_avro to Parquet (MinIO through S3A)", lambda i: _spark_from_avro(
                    spark, bootstrap, f"{s3a_root}/spark-from-avro/r{i}", work / f"checkpoint{i}")),
                "shale": ("Shale partition group, avro parser (MinIO)", lambda i: _shale(
                    spark, bootstrap, registry.url, bucket.model_copy(update={"url": f"{bucket.url}/r{i}"}),
                    work / f"shale{i}")),
            }
            runs: dict[str, list[tuple[float, float]]] = {name: [] for name in contenders}
            for attempt in range(ROUNDS):  # interleaved rounds; the best of each is reported
                for name, (what, contender) in contenders.items():
                    progress(f"round {attempt + 1}/{ROUNDS}: {what}")
                    before = cpu_snapshot()
                    seconds = contender(attempt)
                    runs[name].append((seconds, _cpu(before, cpu_snapshot())))
                    progress(f"  {seconds:.1f} s, {runs[name][-1][1]:.1f} CPU s")
            spark.stop()
            decode = min(_decode_seconds(sample) for _ in range(ROUNDS))
        finally:
            registry.stop()
        shutil.rmtree(work, ignore_errors=True)
    best = {name: min(r) for name, r in runs.items()}  # the fastest run and its CPU seconds
    per_million = 1e6 / RECORDS
    return write_result(
        "typed_ingest",
        figures={"records": RECORDS, "records_per_s": round(RECORDS / best["shale"][0]),
                 "cpu_seconds_per_million_records": round(best["shale"][1] * per_million, 1),
                 "decode_seconds_per_million_records": round(decode / DECODE_SAMPLE * 1e6, 1)},
        baseline={"spark_from_avro_records_per_s": round(RECORDS / best["spark"][0]),
                  "spark_from_avro_cpu_seconds_per_million_records": round(best["spark"][1] * per_million, 1)},
        ratios={"vs_spark_from_avro": round(best["spark"][0] / best["shale"][0], 2),
                "cpu_vs_spark_from_avro": round(best["spark"][1] / best["shale"][1], 2)},
        notes=__doc__ or "")
