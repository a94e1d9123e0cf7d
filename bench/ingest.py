"""Backup-group ingest throughput against Spark's own Kafka-to-Parquet file sink and a raw consumer, on the same
topic in the same run.

One topic of 4 partitions holds 1,000,000 records (real Loghub lines, cycled: about 110 bytes each). Shale's
backup group and Spark's file sink both run one ``availableNow`` streaming query from the earliest offsets in
the same local-mode SparkSession (``local[2]``, batches of at most 500,000 records), write zstd Parquet, and
are timed from query start to its end (Spark's session start-up is excluded from both). Both persist the
whole record, headers included (``includeHeaders``), as a backup must. Spark's sink writes to
a local folder (its S3 connector is not part of this build); Shale's headline figures write to MinIO over HTTP
on the same disk, with put-if-absent, checksums, meta.json and a metastore commit per batch; Shale writing to a
``file://`` bucket is reported too (obstore's local store syncs every object to disk, which the sink does not).
The contenders run in two interleaved rounds on the same topic and the faster run of each is reported (this
machine's timings vary by tens of percent from run to run).
The raw consumer (confluent-kafka, one process) only reads the topic: the ceiling.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from tests.integration.ingest_helpers import create_topic
from tests.producing import CheckedProducer

from bench.common import progress, timed, write_result
from bench.services import kafka_broker, minio_bucket
from shale.config import BucketConfig, IngestConfig, ShaleConfig, SparkConfig
from shale.demo import LOGHUB_FORMATS, loghub_lines
from shale.dev import connector_conf
from shale.ingest.job import IngestJob
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


def _shale(spark: Any, bootstrap: str, topic: str, bucket: BucketConfig, work: Path) -> float:
    config = ShaleConfig(bucket=bucket, kafka={"bootstrap_servers": bootstrap},  # type: ignore[arg-type]
                         metastore={"data_dir": str(work / "metastore")},  # type: ignore[arg-type]
                         ingest=IngestConfig(topics=[topic], max_records_per_batch=BATCH))
    return timed_backup_ingest(spark, config, RECORDS)


def timed_backup_ingest(spark: Any, config: ShaleConfig, expected: int) -> float:
    """Seconds the backup group takes to store everything Kafka holds now; checks it committed ``expected``
    offsets."""
    job = IngestJob(config, "backup", spark=spark, metastore=open_metastore(config))
    with timed() as t:
        job.run(available_now=True)
    committed = sum(o.committed_end for o in job.metastore.offsets("backup", 1))
    assert committed == expected, committed
    return t[0]


def _spark_file_sink(spark: Any, bootstrap: str, topic: str, work: Path) -> float:
    with timed() as t:
        query = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
                 .option("subscribe", topic).option("startingOffsets", "earliest").option("includeHeaders", "true")
                 .option("maxOffsetsPerTrigger", str(BATCH)).load()
                 .writeStream.format("parquet").option("compression", "zstd")
                 .option("path", str(work / "sink")).option("checkpointLocation", str(work / "checkpoint"))
                 .trigger(availableNow=True).start())
        query.awaitTermination()
    assert spark.read.parquet(str(work / "sink")).count() == RECORDS
    return t[0]


def run() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="shale-bench-ingest-") as tmp, kafka_broker() as broker:
        work = Path(tmp)
        topic = "bench"
        create_topic(broker.bootstrap_servers, topic, PARTITIONS)
        progress(f"producing {RECORDS:,} records")
        size = produce_records(broker.bootstrap_servers, topic)
        spark = spark_session("shale-bench-ingest", SparkConfig(master="local[2]", conf=connector_conf()))
        progress("warming up Spark and its Python workers")
        spark.range(1000).mapInArrow(lambda it: it, "id long").count()
        raws, sinks, ours_runs, minio_runs = [], [], [], []
        with minio_bucket() as bucket:
            for attempt in range(ROUNDS):  # interleaved rounds; the best of each is reported
                progress(f"round {attempt + 1}/{ROUNDS}: raw consumer")
                raws.append(_raw_consumer(broker.bootstrap_servers, topic))
                progress(f"round {attempt + 1}/{ROUNDS}: Spark file sink (local disk)")
                sinks.append(_spark_file_sink(spark, broker.bootstrap_servers, topic, work / f"s{attempt}"))
                progress(f"round {attempt + 1}/{ROUNDS}: Shale backup group (local file bucket)")
                ours_runs.append(_shale(spark, broker.bootstrap_servers, topic,
                                        BucketConfig(url=f"file://{work}/bucket{attempt}"), work / f"a{attempt}"))
                progress(f"round {attempt + 1}/{ROUNDS}: Shale backup group (MinIO)")
                minio_runs.append(_shale(spark, broker.bootstrap_servers, topic,
                                         bucket.model_copy(update={"url": bucket.url + f"/r{attempt}"}),
                                         work / f"b{attempt}"))
        raw, sink, ours, ours_minio = min(raws), min(sinks), min(ours_runs), min(minio_runs)
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    mb = size / 1e6
    return write_result(
        "ingest",
        figures={"records_per_s": round(RECORDS / ours_minio), "mb_per_s": round(mb / ours_minio, 2),
                 "records_per_s_local_bucket": round(RECORDS / ours), "records": RECORDS,
                 "value_mb": round(mb, 1)},
        baseline={"spark_file_sink_records_per_s": round(RECORDS / sink),
                  "raw_consumer_records_per_s": round(RECORDS / raw)},
        ratios={"vs_spark_file_sink": round(sink / ours_minio, 2), "vs_raw_consumer": round(raw / ours_minio, 2),
                "local_bucket_vs_spark_file_sink": round(sink / ours, 2)},
        notes=__doc__ or "",
    )

