"""Restore throughput (records/s, MB/s) against Kafka's own ``ProducerPerformance`` with the same record count
and value size, in one run on the same broker.

200,000 JSON records on 4 Kafka partitions are persisted by the backup group; after a warm-up restore of 1,000
records per partition (the new broker's transaction state and Spark's Python workers: a production cluster has
both), ``shale restore`` replays them into a new topic (one Spark task per partition in ``local[2]``, transactions
of up to 20,000 records with their progress record), timed from the plan to the last commit; then
``ProducerPerformance`` (acks=all, idempotent, no transactions) sends as many records, each of the source records'
average key + value size, to another 4-partition topic; and confluent-kafka's producer (the restore's client:
idempotent, acks=all, no transactions, no bucket) sends the same count and size. The cost per million records is
the restore's wall seconds on this machine's 2 Spark cores per million records.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer
from tests.integration.ingest_helpers import create_topic, produce_json
from tests.producing import CheckedProducer

from bench.common import progress, timed, write_result
from bench.services import kafka_broker, minio_bucket
from shale.config import IngestConfig, ShaleConfig, SparkConfig
from shale.dev import connector_conf
from shale.dev.fetch import kafka_tools_classpath
from shale.dev.kafka import java_binary
from shale.ingest.job import IngestJob
from shale.metastore import open_index_view, open_metastore
from shale.restore import RestoreJob, RestoreRange, RestoreRequest
from shale.spark import spark_session

RECORDS = 200_000
PARTITIONS = 4
SUMMARY = re.compile(r"(\d+) records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\)")


def librdkafka_producer(bootstrap: str, topic: str, records: int, size: int) -> tuple[float, float]:
    """The same client the restore uses (confluent-kafka), idempotent, acks=all, no transactions and no bucket:
    (records/s, MB/s) sending ``records`` values of ``size`` bytes round-robin over the partitions."""
    producer = CheckedProducer({"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": True,
                                "acks": "all"})
    value = b"x" * size
    with timed() as took:
        for i in range(records):
            producer.produce(topic, value, partition=i % PARTITIONS)
        producer.flush(300)
    return records / took[0], records * size / took[0] / 2**20


def producer_performance(bootstrap: str, topic: str, records: int, size: int) -> tuple[float, float]:
    """Kafka's ProducerPerformance (kafka-tools at the broker's version, fetched on first use as the ingest
    benchmark's ConsumerPerformance is): (records/s, MB/s) of its final summary line."""
    command = [java_binary(), "-Xmx512m", "-cp", kafka_tools_classpath(), "org.apache.kafka.tools.ProducerPerformance",
               "--topic", topic, "--num-records", str(records), "--record-size", str(size), "--throughput", "-1",
               "--producer-props", f"bootstrap.servers={bootstrap}", "acks=all", "enable.idempotence=true",
               "linger.ms=20"]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    found = SUMMARY.findall(out)
    assert found, out[-2000:]
    _, rate, mb = found[-1]
    return float(rate), float(mb)


def record_size(bootstrap: str, topic: str, sample: int = 2000) -> int:
    """The average key + value bytes of the first records of ``topic``."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-size", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    sizes: list[int] = []
    try:
        while len(sizes) < sample:
            message = consumer.poll(5)
            assert message is not None, "no records to measure"
            if message.error() is None:
                sizes.append(len(message.key() or b"") + len(message.value() or b""))
    finally:
        consumer.close()
    return round(sum(sizes) / len(sizes))


def run() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="shale-bench-restore-") as tmp, kafka_broker() as broker, \
            minio_bucket() as bucket_config:
        topic = "events"
        create_topic(broker.bootstrap_servers, topic, PARTITIONS)
        progress(f"producing {RECORDS:,} records")
        produce_json(broker.bootstrap_servers, topic, RECORDS)
        config = ShaleConfig(bucket=bucket_config, kafka={"bootstrap_servers": broker.bootstrap_servers},  # type: ignore[arg-type]
                             metastore={"data_dir": str(Path(tmp) / "ms")},  # type: ignore[arg-type]
                             ingest=IngestConfig(topics=[topic], max_records_per_batch=100_000))
        spark = spark_session("shale-bench-restore", SparkConfig(master="local[2]", conf=connector_conf()))
        progress("backup group")
        IngestJob(config, "backup", spark=spark, metastore=open_metastore(config)).run(available_now=True)
        # A warm-up restore of the first 1,000 records of each partition: the brand-new broker creates its
        # transaction state topic (50 partitions) on the first transactional producer, and Spark starts its Python
        # workers; a production cluster has both already.
        progress("warm-up restore")
        warm = RestoreRange(offsets=dict.fromkeys(range(PARTITIONS), (0, 1000)))
        assert RestoreJob(open_index_view(config), config.bucket, config.kafka,
                          RestoreRequest(tenant="default", topic=topic, target_topic="warm-up", range=warm),
                          spark).run().ok
        progress("restore")
        job = RestoreJob(open_index_view(config), config.bucket, config.kafka,
                         RestoreRequest(tenant="default", topic=topic, target_topic="restored"), spark)
        with timed() as ours:
            report = job.run()
        assert report.ok, report
        restored = sum(p.sent_now for p in report.partitions)
        assert restored == RECORDS, report
        spark.stop()
        size = record_size(broker.bootstrap_servers, topic)
        create_topic(broker.bootstrap_servers, "perf", PARTITIONS)
        progress(f"ProducerPerformance: {RECORDS:,} records of {size} bytes")
        perf = producer_performance(broker.bootstrap_servers, "perf", RECORDS, size)
        create_topic(broker.bootstrap_servers, "plain", PARTITIONS)
        progress(f"librdkafka producer: {RECORDS:,} records of {size} bytes")
        plain_rate, plain_mb = librdkafka_producer(broker.bootstrap_servers, "plain", RECORDS, size)
    rate = RECORDS / ours[0]
    mb = RECORDS * size / ours[0] / 2**20
    baseline = {"librdkafka_producer_records_per_s": round(plain_rate), "librdkafka_producer_mb_per_s":
                round(plain_mb, 2)}
    baseline.update(producer_perf_records_per_s=round(perf[0]), producer_perf_mb_per_s=perf[1])
    ratios = {"vs_producer_perf": round(rate / perf[0], 3), "vs_librdkafka_producer": round(rate / plain_rate, 3)}
    return write_result(
        "restore",
        figures={"records_per_s": round(rate), "mb_per_s": round(mb, 2), "records": RECORDS,
                 "record_bytes": size, "seconds": round(ours[0], 2),
                 "seconds_per_million_records_on_2_cores": round(ours[0] * 1_000_000 / RECORDS, 1)},
        baseline=baseline,
        ratios=ratios,
        notes=__doc__ or "",
    )
