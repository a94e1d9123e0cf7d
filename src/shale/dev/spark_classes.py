"""A class data sharing (CDS) archive of the classes a Spark driver loads, for the many short-lived Spark drivers
of the development machine (every ``shale ingest``, ``compact`` or ``restore`` a test starts).

A driver JVM started with ``-XX:SharedArchiveFile`` maps those classes from the archive instead of finding,
reading and verifying them in pyspark's jars: a local session and its first job took 8.5 s without and 4.7 s with
it on this machine. ``shale.spark`` adds the option to a driver's Java options when ``SHALE_SPARK_CLASS_ARCHIVE``
(``shale.spark.CLASS_ARCHIVE_ENV``) names an archive. ``make test`` builds it (``python -m shale.dev.spark_classes``)
while the unit tests run, and the test session names it when it is there (tests/conftest.py), for every driver the
tests start in process or as a ``shale`` command. A build that fails or outlasts ``BUILD_TIMEOUT_S`` (a machine
busy with the unit tests and the first downloads: it did once) is reported and ``make`` goes on without it.

The archive is built once per Java build and pyspark installation, in the cache (``spark-classes/``): a child
process runs a small Spark job of the kinds Shale runs with ``-XX:ArchiveClassesAtExit`` and exits its JVM, which
writes the archive on the way out; it is renamed into place only once whole. A JVM that cannot use an archive
(another Java build, another class path) says so in one warning line and starts as it would have without it.
Production drivers are long-lived, so this is for development: an operator who wants it adds the same option to
``spark.driver.extraJavaOptions``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from shale.dev.fetch import FetchError, cache_dir
from shale.dev.spark_cluster import spark_home
from shale.spark import CLASS_ARCHIVE_ENV

BUILD_TIMEOUT_S = 300


def _java() -> Path:
    """The ``java`` Spark's launcher runs: ``$JAVA_HOME/bin/java``, else the first on the ``PATH``."""
    home = os.environ.get("JAVA_HOME")
    found = Path(home) / "bin" / "java" if home else Path(shutil.which("java") or "java")
    return found.resolve()


def archive_path() -> Path:
    """Where the archive of this Java build and this pyspark installation is kept."""
    java = _java()
    stamp = f"{java}|{java.stat().st_mtime_ns if java.exists() else 0}|{spark_home()}"
    return cache_dir() / "spark-classes" / f"{hashlib.sha256(stamp.encode()).hexdigest()[:16]}.jsa"


def ensure_archive() -> Path:
    """The archive, built first if missing (one builder at a time: a lock file beside it)."""
    path = archive_path()
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.is_file():
            return path
        partial = path.with_name(f"{path.stem}.{os.getpid()}.partial")
        env = {k: v for k, v in os.environ.items() if k != CLASS_ARCHIVE_ENV}
        command = [sys.executable, "-m", "shale.dev.spark_classes", "--dump", str(partial)]
        try:
            done = subprocess.run(command, check=False, env=env, capture_output=True, text=True,
                                  timeout=BUILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            partial.unlink(missing_ok=True)
            raise FetchError(f"building Spark's class archive took more than {BUILD_TIMEOUT_S} s "
                             f"({' '.join(command)}): stopped") from None
        if done.returncode != 0 or not partial.is_file():
            partial.unlink(missing_ok=True)
            raise FetchError(f"building Spark's class archive failed ({' '.join(command)}, exit code "
                             f"{done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-4000:]}")
        os.replace(partial, path)
    return path


def _build(target: Path) -> None:
    """Run Shale's kinds of Spark work in a driver that writes the classes it loaded to ``target`` when it exits."""
    from py4j.protocol import Py4JError

    from shale.config import SparkConfig
    from shale.spark import spark_session

    options = f"-Duser.timezone=UTC -XX:ArchiveClassesAtExit={target}"
    spark = spark_session("shale-class-archive", SparkConfig(master="local[2]"), kafka=False,
                          extra_conf={"spark.driver.extraJavaOptions": options})
    with tempfile.TemporaryDirectory(prefix="shale-class-archive-") as tmp:
        rows = spark.sparkContext.parallelize(range(2000), 4).mapPartitions(
            lambda part: ((i, f"line {i}", i % 7, float(i) / 3) for i in part))
        frame = spark.createDataFrame(rows, "offset long, message string, level int, value double")
        frame.write.parquet(f"{tmp}/blocks")
        back = spark.read.parquet(f"{tmp}/blocks")
        back.groupBy("level").count().collect()
        back.createOrReplaceTempView("records")
        spark.sql("SELECT level, max(offset), sum(value) FROM records WHERE message LIKE 'line 1%' "
                  "GROUP BY level ORDER BY level").collect()
        back.repartition(2).sortWithinPartitions("offset").write.mode("overwrite").parquet(f"{tmp}/compacted")
    gateway = spark.sparkContext._gateway
    assert gateway is not None  # a session's context always has its gateway
    process = getattr(gateway, "proc", None)
    spark.stop()
    with contextlib.suppress(Py4JError, OSError):  # the JVM leaves at once: the call never returns
        gateway.jvm.System.exit(0)
    if process is not None:
        process.wait(timeout=BUILD_TIMEOUT_S)  # the archive is written on the JVM's way out


if __name__ == "__main__":
    if sys.argv[1:2] == ["--dump"]:
        _build(Path(sys.argv[2]))
    else:  # `make test` and `make integration` build it before the tests start: print where it is
        try:
            print(ensure_archive())
        except FetchError as exc:  # only a speed-up: the tests start their drivers without it
            print(f"{exc}\nno Spark class archive: the tests run without it (each Spark driver starts slower)",
                  file=sys.stderr)
