"""Reprocess throughput (records/s) against the live partition-group ingest rate on the same data, in one run.

300,000 JSON records on 4 Kafka partitions are persisted by the backup group; then the partition group ingests
them live from Kafka (``availableNow``, batches of 100,000), timed; then ``shale reprocess`` parses the backup
blocks into generation 2 with the same parser, timed. Both in one local-mode SparkSession (``local[2]``) on MinIO,
with an embedded metastore.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from tests.integration.ingest_helpers import create_topic, produce_json

from bench.common import progress, timed, write_result
from bench.services import kafka_broker, minio_bucket
from shale.config import IngestConfig, ParserRule, ShaleConfig, SparkConfig
from shale.dev import connector_conf
from shale.ingest.job import IngestJob
from shale.metastore import open_metastore
from shale.reprocess import ReprocessJob
from shale.spark import spark_session

RECORDS = 300_000
OPTIONS: dict[str, Any] = {"time_field": "ts", "time_format": "epoch_s", "label_fields": ["level"],
                           "fields": ["msg"]}


def run() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="shale-bench-reprocess-") as tmp, kafka_broker() as broker, \
            minio_bucket() as bucket_config:
        topic = "events"
        create_topic(broker.bootstrap_servers, topic, 4)
        progress(f"producing {RECORDS:,} records")
        produce_json(broker.bootstrap_servers, topic, RECORDS)
        config = ShaleConfig(bucket=bucket_config, kafka={"bootstrap_servers": broker.bootstrap_servers},  # type: ignore[arg-type]
                             metastore={"data_dir": str(Path(tmp) / "ms")},  # type: ignore[arg-type]
                             ingest=IngestConfig(topics=[topic], max_records_per_batch=100_000,
                                                 parsers=[ParserRule(parser="json", options=OPTIONS)]))
        spark = spark_session("shale-bench-reprocess", SparkConfig(master="local[2]", conf=connector_conf()))
        metastore = open_metastore(config)
        progress("backup group")
        IngestJob(config, "backup", spark=spark, metastore=metastore).run(available_now=True)
        progress("live partition-group ingest (baseline)")
        with timed() as live:
            IngestJob(config, "partition", spark=spark, metastore=metastore).run(available_now=True)
        progress("reprocess into generation 2")
        job = ReprocessJob(config, metastore, spark, tenant="default", topic=topic, start=0, end=2**62,
                           parser="json", options=OPTIONS, generation=2, blocks_per_round=4)
        with timed() as ours:
            report = job.run()
        assert report.records == RECORDS, report
        assert sum(o.committed_end for o in metastore.offsets("partition", 2)) == RECORDS
        spark.stop()
    return write_result(
        "reprocess",
        figures={"records_per_s": round(RECORDS / ours[0]), "records": RECORDS, "rounds": report.rounds,
                 "seconds": round(ours[0], 2)},
        baseline={"live_ingest_records_per_s": round(RECORDS / live[0]), "seconds": round(live[0], 2)},
        ratios={"vs_live_ingest": round(live[0] / ours[0], 2)},
        notes=__doc__ or "",
    )
