"""The production path for the Kafka connector: with neither ``spark.jars`` nor ``spark.jars.packages``
configured, ``shale ingest`` asks Spark to resolve ``shale.spark.KAFKA_CONNECTOR_PACKAGE`` from Maven Central
(Spark's own resolver, no Maven) — the four connector jars and nothing pyspark already ships — and ingests every
record once. The resolver's cache is kept under the development cache (``spark.jars.ivy``), so later runs
resolve offline."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

from tests.integration.cluster_helpers import bucket_records, offsets, run_shale
from tests.integration.ingest_helpers import config_of, create_topic, produce_json, write_config

from shale.dev.fetch import cache_dir


def test_ingest_resolves_the_default_connector_package(kafka, minio_bucket, tmp_path: Path) -> None:
    topic = f"packages-{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap_servers, topic, 2)
    produce_json(kafka.bootstrap_servers, topic, 3_000)
    file = write_config(tmp_path, kafka.bootstrap_servers, minio_bucket, [topic])
    ivy = f'"spark.jars.ivy" = "{cache_dir() / "ivy"}"'
    text, replaced = re.subn(r'"spark\.jars" = "[^"]*"', ivy, file.read_text())
    assert replaced == 1
    file.write_text(text)
    config = config_of(file)
    assert "spark.jars" not in config.spark.conf
    assert "spark.jars.packages" not in config.spark.conf

    log = run_shale(file, ["ingest", "--group", "backup", "--available-now"], tmp_path / "ingest.log")
    # Spark's resolver lists what it resolved: the four connector jars, nothing pyspark already has.
    resolved = sorted(set(re.findall(r"found ([\w.-]+#[\w.-]+);", log)))
    assert resolved == ["org.apache.commons#commons-pool2", "org.apache.kafka#kafka-clients",
                        "org.apache.spark#spark-sql-kafka-0-10_2.13",
                        "org.apache.spark#spark-token-provider-kafka-0-10_2.13"]
    stored = offsets(bucket_records(minio_bucket, "backup"))
    assert len(stored) == 3_000
    assert set(stored.values()) == {1}
