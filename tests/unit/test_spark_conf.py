"""The SparkSession's settings (no JVM is started): where the connector jars, the interpreter and the failpoints
come from, and a bucket executors cannot share is refused."""

from __future__ import annotations

import sys
from pathlib import Path

import pyspark
import pytest

from shale.config import BucketConfig, SparkConfig
from shale.dev import fetch
from shale.errors import ConfigError
from shale.spark import CLASS_ARCHIVE_ENV, KAFKA_CONNECTOR_PACKAGE, check_shared_bucket, session_conf


def test_connector_package_is_the_pinned_pyspark_version() -> None:
    group, artifact, version = fetch.SPARK_CONNECTOR_ARTIFACTS[0]
    assert f"{group}:{artifact}:{version}" == KAFKA_CONNECTOR_PACKAGE
    assert version == pyspark.__version__


def test_kafka_sessions_resolve_the_connector_unless_jars_are_configured() -> None:
    conf = session_conf(SparkConfig(master="spark://h:7077"), kafka=True)
    assert conf["spark.jars.packages"] == KAFKA_CONNECTOR_PACKAGE
    assert "org.apache.hadoop:hadoop-client-runtime" in conf["spark.jars.excludes"]  # pyspark ships it
    assert "spark.jars" not in conf
    assert "spark.driver.host" not in conf  # a cluster driver binds where the operator says, not to loopback
    given = session_conf(SparkConfig(conf={"spark.jars": "/opt/jars/a.jar"}), kafka=True)
    assert given["spark.jars"] == "/opt/jars/a.jar"
    assert "spark.jars.packages" not in given
    packages = session_conf(SparkConfig(conf={"spark.jars.packages": "g:a:1"}), kafka=True)
    assert packages["spark.jars.packages"] == "g:a:1"
    assert "spark.jars.excludes" not in packages
    assert "spark.jars.packages" not in session_conf(SparkConfig(), kafka=False)


def test_local_mode_binds_loopback_and_executors_run_this_interpreter() -> None:
    conf = session_conf(SparkConfig(master="local[2]"), kafka=False)
    assert conf["spark.driver.host"] == conf["spark.driver.bindAddress"] == "127.0.0.1"
    assert conf["spark.pyspark.python"] == sys.executable
    other = session_conf(SparkConfig(conf={"spark.pyspark.python": "/opt/shale/bin/python"}), kafka=False)
    assert other["spark.pyspark.python"] == "/opt/shale/bin/python"


def test_failpoints_of_the_driver_reach_executors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SHALE_FAILPOINTS", raising=False)
    assert not any(k.startswith("spark.executorEnv.SHALE") for k in session_conf(SparkConfig(), kafka=False))
    monkeypatch.setenv("SHALE_FAILPOINTS", "ingest.task=pause-once")
    monkeypatch.setenv("SHALE_FAILPOINT_DIR", "/tmp/points")
    conf = session_conf(SparkConfig(), kafka=False)
    assert conf["spark.executorEnv.SHALE_FAILPOINTS"] == "ingest.task=pause-once"
    assert conf["spark.executorEnv.SHALE_FAILPOINT_DIR"] == "/tmp/points"


def test_a_bucket_executors_cannot_share_is_refused_on_a_cluster() -> None:
    cluster = SparkConfig(master="spark://h:7077")
    check_shared_bucket(SparkConfig(master="local[2]"), BucketConfig(url="memory://x"))
    check_shared_bucket(cluster, BucketConfig(url="s3://b"))
    check_shared_bucket(cluster, BucketConfig(url="file:///mnt/shared/bucket"))
    for url in ("memory://x", "file://.shale/bucket"):
        with pytest.raises(ConfigError, match="cannot be shared with the executors"):
            check_shared_bucket(cluster, BucketConfig(url=url))


def test_a_driver_maps_the_class_archive_the_environment_names_when_it_exists(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    archive = tmp_path / "spark.jsa"
    monkeypatch.setenv(CLASS_ARCHIVE_ENV, str(archive))
    assert "SharedArchiveFile" not in session_conf(SparkConfig(), kafka=False)["spark.driver.extraJavaOptions"]
    archive.write_bytes(b"x")
    options = session_conf(SparkConfig(), kafka=False)["spark.driver.extraJavaOptions"]
    assert options == f"-Duser.timezone=UTC -XX:TieredStopAtLevel=1 -XX:SharedArchiveFile={archive} -Xshare:auto"
    # The operator's own archive option wins (and the archive's builder dumps rather than maps).
    own = SparkConfig(conf={"spark.driver.extraJavaOptions": "-XX:ArchiveClassesAtExit=/tmp/a.jsa"})
    assert session_conf(own, kafka=False)["spark.driver.extraJavaOptions"] == "-XX:ArchiveClassesAtExit=/tmp/a.jsa"
    monkeypatch.delenv(CLASS_ARCHIVE_ENV)
    assert "SharedArchiveFile" not in session_conf(SparkConfig(), kafka=False)["spark.driver.extraJavaOptions"]
