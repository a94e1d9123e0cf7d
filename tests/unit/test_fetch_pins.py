"""The Spark connector jars must match pyspark exactly, or Spark fails at the first Kafka read."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pyspark
import pytest

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
    assert {n for n in fetch.FETCHERS if n not in fetch.NOT_IN_ALL} == {"kafka", "spark", "iceberg", "minio",
                                                                         "promtool", "apicurio", "trino", "nessie",
                                                                         "spark-cluster-oldest"}


def test_the_benchmarks_jars_are_fetched_only_by_make_bench() -> None:
    assert fetch.NOT_IN_ALL[:2] == ("iceberg-kafka-connect", "spark-avro")
    [(group, artifact, version)] = fetch.SPARK_AVRO_ARTIFACTS  # one jar: its dependencies are inside pyspark
    assert (group, artifact) == ("org.apache.spark", "spark-avro_2.13")
    assert version == pyspark.__version__
    pins = {(g, a): v for g, a, v in fetch.ICEBERG_KC_ARTIFACTS}
    assert pins[("org.apache.kafka", "connect-runtime")] == fetch.KAFKA_VERSION  # the broker's version
    assert {v for (g, _), v in pins.items() if g == "org.apache.iceberg"} == {fetch.ICEBERG_KC_VERSION}
    assert re.fullmatch(r"\d+\.\d+\.\d+", fetch.ICEBERG_KC_VERSION)


def test_the_rest_catalog_and_duckdb_are_pinned_and_fetched_when_first_needed() -> None:
    assert fetch.NOT_IN_ALL[2:4] == ("iceberg-rest", "duckdb")
    pins = {(g, a, c): v for g, a, v, c, _ in fetch.ICEBERG_REST_ARTIFACTS}
    # the server's own pieces of one Iceberg release (1.11: its test fixtures are the newest published)
    assert {v for (g, _, _), v in pins.items() if g == "org.apache.iceberg"} == {fetch.ICEBERG_REST_VERSION}
    assert pins[("org.xerial", "sqlite-jdbc", "")] == fetch.SQLITE_JDBC_VERSION
    assert all(v == fetch.JETTY_VERSION for (g, _, _), v in pins.items() if g.startswith("org.eclipse.jetty"))
    assert re.fullmatch(r"12\.1\.\d+", fetch.JETTY_VERSION)
    assert all(p.endswith(f"=={fetch.DUCKDB_VERSION}") for p in fetch.DUCKDB_PACKAGES)  # built for one DuckDB
    assert (fetch.Path(fetch.__file__).parent / "java" / f"{fetch.REST_LAUNCHER}.java").is_file()


def test_the_interoperability_engines_are_pinned_and_fetched_with_the_services() -> None:
    assert fetch.NOT_IN_ALL[4:] == ("chdb",)  # Trino is in ``all``: the reading guide's test starts it
    assert fetch.CHDB_PACKAGES[0] == f"chdb=={fetch.CHDB_VERSION}"
    assert all("==" in p for p in fetch.CHDB_PACKAGES)  # chdb-core, the engine it loads, pinned too
    assert f"io.trino:trino-server:{fetch.TRINO_VERSION}:tar.gz" == fetch.TRINO_ARTIFACT
    assert int(fetch.TRINO_VERSION) >= 476


def test_the_production_catalog_is_pinned_by_version_and_digest_and_fetched_with_the_services() -> None:
    assert "nessie" not in fetch.NOT_IN_ALL
    assert f"org.projectnessie.nessie:nessie-quarkus:{fetch.NESSIE_VERSION}:jar:runner" == fetch.NESSIE_ARTIFACT
    assert len(fetch.NESSIE_SHA256) == 64
    assert int(fetch.NESSIE_SHA256, 16) >= 0


def test_spark_s_connector_runtime_and_oldest_cluster_follow_the_pinned_pyspark() -> None:
    assert pyspark.__version__ == fetch.SPARK_VERSION
    pins = {a: v for _, a, v in fetch.SPARK_CONNECTOR_ARTIFACTS}
    assert pins["spark-sql-kafka-0-10_2.13"] == pins["spark-token-provider-kafka-0-10_2.13"] == fetch.SPARK_VERSION
    minor = ".".join(fetch.SPARK_VERSION.split(".")[:2])
    [runtime] = [a for _, a, _ in fetch.ICEBERG_ARTIFACTS if a.startswith("iceberg-spark-runtime-")]
    assert runtime == f"iceberg-spark-runtime-{minor}_2.13"  # Iceberg's runtime for this Spark minor release
    # a cluster may run an older patch release of the same minor release only (docs/DEPLOY.md)
    assert fetch.SPARK_CLUSTER_OLDEST_VERSION.startswith(f"{minor}.")
    assert fetch.SPARK_CLUSTER_OLDEST_VERSION != fetch.SPARK_VERSION


def test_maven_runs_one_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Maven 3.8 writes ~/.m2 without locks: two fetches resolving the same artifact at once fail on each other's
    partial file (a fresh machine's first `make test` failed so, 2026-12-04). Concurrent fetches run Maven in turn."""
    running: list[int] = []
    overlaps: list[int] = []

    def slow_maven(cmd: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
        assert cmd[0] == "mvn"
        running.append(1)
        overlaps.append(len(running))
        time.sleep(0.05)
        running.pop()

    monkeypatch.setattr(fetch, "_run", slow_maven)
    monkeypatch.setattr(fetch.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(fetch.Path, "home", lambda: tmp_path)
    threads = [threading.Thread(target=fetch._mvn, args=(["dependency:copy"], tmp_path)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlaps == [1, 1, 1, 1]
    assert (tmp_path / ".m2" / ".shale-mvn.lock").exists()


def test_promtool_is_built_without_service_discovery(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rule tests need promtool's rule checks only: built without Prometheus's service discovery providers it
    takes 179 s instead of 467 s on a cold build cache."""
    commands: list[list[str]] = []

    def go(cmd: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
        commands.append(cmd)
        assert env is not None
        (Path(env["GOBIN"]) / "promtool").write_text("")

    monkeypatch.setattr(fetch, "_run", go)
    monkeypatch.setattr(fetch.shutil, "which", lambda name: f"/usr/bin/{name}")
    assert fetch.fetch_promtool(tmp_path).exists()
    module = f"{fetch.PROMTOOL_MODULE}@{fetch.PROMTOOL_VERSION}"
    assert commands == [["go", "install", "-tags", "remove_all_sd", module]]
