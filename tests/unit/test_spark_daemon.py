"""Spark's Python daemon for Shale's sessions: Spark's archives leave the workers' path only when pyspark and py4j
import without them."""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

from shale.config import SparkConfig
from shale.spark import session_conf
from shale.spark_daemon import drop_spark_archives


def _archive(path: Path, module: str) -> str:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{module}.py", "VALUE = 1\n")
    return str(path)


def test_archives_are_dropped_when_the_installed_packages_import(tmp_path: Path) -> None:
    zipped = _archive(tmp_path / "pyspark.zip", "pyspark_copy")
    jar = _archive(tmp_path / "spark-core.jar", "nothing")
    path = [zipped, jar, *sys.path]
    assert drop_spark_archives(path) == sys.path
    assert sys.path == path[2:]  # the probe leaves the process's own path as it was


def test_archives_stay_when_a_needed_module_lives_only_in_them(tmp_path: Path) -> None:
    zipped = _archive(tmp_path / "pyspark.zip", "shale_only_in_this_zip")
    path = [zipped, *sys.path]
    assert drop_spark_archives(path, needed=("shale_only_in_this_zip",)) is path


def test_a_missing_archive_file_is_not_touched() -> None:
    path = ["/nonexistent/python311.zip", *sys.path]  # the interpreter's own (usually absent) stdlib zip
    assert drop_spark_archives(path) is path


def test_every_session_uses_it() -> None:
    assert session_conf(SparkConfig(), kafka=False)["spark.python.daemon.module"] == "shale.spark_daemon"
