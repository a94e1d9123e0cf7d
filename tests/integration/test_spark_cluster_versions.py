"""The oldest Spark an existing cluster may run (docs/DEPLOY.md): a standalone master and worker started from pyspark
``SPARK_CLUSTER_OLDEST_VERSION``'s distribution (their JVMs and the executor's are that Spark), under a driver of the
pinned pyspark in the ``shale`` process. Both ingest groups and a compaction run on it; the bucket then holds the
topic's records, each exactly once, field by field."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest
from tests.integration.cluster_helpers import bucket_records, offsets, run_shale
from tests.integration.ingest_helpers import create_topic, produce_json, write_config
from tests.integration.test_spark_cluster import COMPACTION, KAFKA_KEYS, _bucket, _parsed, _projection, _topic_rows

from shale.dev import SparkStandalone, driver_conf
from shale.dev.fetch import SPARK_CLUSTER_OLDEST_VERSION, SPARK_VERSION, fetch_spark_cluster_oldest


@pytest.fixture(scope="module")
def oldest_cluster(services_dir: Path) -> Iterator[SparkStandalone]:
    cluster = SparkStandalone(services_dir / "spark-oldest", workers=1, home=fetch_spark_cluster_oldest()).start()
    yield cluster
    cluster.stop()


def test_a_driver_of_the_pinned_spark_runs_on_the_oldest_cluster_spark_claimed(
        kafka, minio, oldest_cluster: SparkStandalone, tmp_path: Path) -> None:
    assert pyspark.__version__ == SPARK_VERSION != SPARK_CLUSTER_OLDEST_VERSION
    topic = f"versions-{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap_servers, topic, 2)
    produce_json(kafka.bootstrap_servers, topic, 3_000, invalid_every=30, seed=3)
    everything = _topic_rows(kafka.bootstrap_servers, topic, 2)
    valid = [(row, value) for row in everything if (value := _parsed(row)) is not None]

    bucket = _bucket(minio)
    config = write_config(tmp_path, kafka.bootstrap_servers, bucket, [topic],
                          spark={"master": oldest_cluster.master_url, "conf": driver_conf()},
                          max_records_per_batch=1_000)
    with config.open("a") as f:
        f.write(COMPACTION)
    for group in ("backup", "partition"):
        run_shale(config, ["ingest", "--group", group, "--available-now"], tmp_path / f"ingest-{group}.log")
    run_shale(config, ["compact", "--until-idle"], tmp_path / "compact.log")

    backup = bucket_records(bucket, "backup")
    assert _projection(backup, KAFKA_KEYS) == Counter(everything)
    assert set(offsets(backup).values()) == {1}
    parsed = bucket_records(bucket, "partition")
    keys = ("topic", "partition", "offset", "level", "msg")
    assert _projection(parsed, keys) == Counter((*row[:3], value["level"], value["msg"]) for row, value in valid)
    assert set(offsets(parsed).values()) == {1}

    # The executors ran the older Spark: each one's command line (the first line of its log) has its classpath in
    # the older distribution's jars, and the driver was the pinned pyspark.
    commands = [p.read_text().splitlines()[0] for p in (oldest_cluster.directory / "worker0").glob("app-*/*/stderr")]
    assert commands, "no executor ran on the cluster"
    home = str(oldest_cluster.home)
    for command in commands:
        assert "CoarseGrainedExecutorBackend" in command
        classpath = command.split('"-cp" "', 1)[1].split('"', 1)[0]
        assert all(entry.startswith(home) for entry in classpath.split(":")), classpath
