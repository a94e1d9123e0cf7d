"""The Spark connector jars must match pyspark exactly, or Spark fails at the first Kafka read."""

from __future__ import annotations

import re

import pyspark

from shale.dev import fetch


def test_connector_version_is_the_installed_pyspark_version() -> None:
    assert pyspark.__version__ == fetch.SPARK_VERSION
    names = [artifact for _, artifact, _ in fetch.SPARK_CONNECTOR_ARTIFACTS]
    assert names == ["spark-sql-kafka-0-10_2.13", "spark-token-provider-kafka-0-10_2.13", "kafka-clients",
                     "commons-pool2"]


def test_minio_is_pinned_to_an_exact_module_version() -> None:
    assert fetch.MINIO_VERSION.startswith("v")
    assert "latest" not in fetch.MINIO_VERSION


def test_promtool_is_pinned_to_a_release_and_fetched_with_the_others() -> None:
    assert re.fullmatch(r"v0\.3\d\d\.\d+", fetch.PROMTOOL_VERSION)  # Prometheus 3.x as a Go module version
    assert fetch.PROMTOOL_MODULE.endswith("/cmd/promtool")
    # what `make deps` (fetch.py all) builds
    assert set(fetch.FETCHERS) == {"kafka", "spark", "iceberg", "minio", "promtool", "apicurio"}
