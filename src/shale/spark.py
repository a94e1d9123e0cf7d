"""SparkSession factory: the ``[spark]`` configuration turned into a session, in local mode or as the driver of an
application on a cluster (client mode: the driver runs in the calling process).

What the executors of a cluster need, and where each comes from (nothing is installed on the worker machines but
the ``shale`` package in a Python environment):

* **the interpreter**: ``spark.pyspark.python`` when configured (its path on the worker machines), else the
  interpreter running the driver. PySpark sends it with every Python function, so executors start that one.
* **the Kafka connector jars** (ingest only): ``spark.jars`` (files on the driver machine, which the driver serves
  to its executors) or ``spark.jars.packages`` (Maven coordinates that Spark resolves on the driver at start-up).
  When neither is configured, ``KAFKA_CONNECTOR_PACKAGE`` is used (with ``KAFKA_CONNECTOR_EXCLUDES``). Shale itself
  never runs Maven.
* **the bucket and the rest of the configuration**: pickled into the task closures (``BucketConfig``,
  ``GroupSpec``, compaction and reprocess payloads); a task never reads the driver's config file or environment.
  With ``bucket.access_key_id`` empty, each executor uses its own machine's credentials (instance profile,
  workload identity, ``spark.executorEnv.AWS_*``).
* **failpoints** (fault-injection tests): the driver's, through ``spark.executorEnv``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from shale import failpoints
from shale.config import BucketConfig, SparkConfig, looks_secret, spark_redaction_regex
from shale.errors import ConfigError
from shale.signals import keep_handler

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Spark's Kafka connector for the pinned pyspark (4.1.1, Scala 2.13). Spark's resolver adds what its pom
# declares: spark-token-provider-kafka-0-10_2.13 4.1.1, kafka-clients 3.9.1 and commons-pool2 2.12.1, and eight
# libraries pyspark 4.1.1 already ships, excluded so that no class is on the classpath twice: the resolved set is
# the same four jars as the development cache's (docs/DEPLOY.md).
KAFKA_CONNECTOR_PACKAGE = "org.apache.spark:spark-sql-kafka-0-10_2.13:4.1.1"
KAFKA_CONNECTOR_EXCLUDES = ",".join([
    "org.apache.hadoop:hadoop-client-api", "org.apache.hadoop:hadoop-client-runtime", "org.lz4:lz4-java",
    "org.xerial.snappy:snappy-java", "org.slf4j:slf4j-api", "com.google.code.findbugs:jsr305",
    "org.scala-lang.modules:scala-parallel-collections_2.13", "org.apache.spark:spark-tags_2.13"])
LOOPBACK = "127.0.0.1"
CLASS_ARCHIVE_ENV = "SHALE_SPARK_CLASS_ARCHIVE"
"""Names a class data sharing archive of Spark's classes the driver JVM maps (``shale.dev.spark_classes``, for the
development machine's many short-lived drivers); unset, drivers start as Spark starts them."""

_DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.python.worker.reuse": "true",
    "spark.sql.session.timeZone": "UTC",
    # Shale's drivers only schedule: every task's work is Python (ingest, compaction, restore, reprocess, repair).
    # The JIT's first tier alone compiles what they run at a fraction of the CPU: a local session and three small
    # jobs took 8.5 CPU-seconds of the JVM instead of 11.9 (docs/DESIGN.md, "Cost at scale").
    "spark.driver.extraJavaOptions": "-Duser.timezone=UTC -XX:TieredStopAtLevel=1",
    "spark.executor.extraJavaOptions": "-Duser.timezone=UTC",
    # pyspark's daemon without Spark's archives on the Python workers' path: 80 ms of CPU less per task.
    "spark.python.daemon.module": "shale.spark_daemon",
}


def _local(master: str) -> bool:
    return master.startswith("local")


def _loopback(host: str) -> bool:
    return host == "localhost" or host.startswith("127.")


def session_conf(config: SparkConfig, *, kafka: bool, extra_conf: dict[str, str] | None = None) -> dict[str, str]:
    """Every setting the session is built with: Shale's defaults, local-mode binding, the configuration, then
    ``extra_conf``; the connector package when the session reads Kafka and nothing else names jars; and a
    ``spark.redaction.regex`` that names every secret-looking key (``shale.config.spark_redaction_regex``)."""
    conf = dict(_DEFAULTS)
    if _local(config.master):
        conf["spark.driver.host"] = LOOPBACK
        conf["spark.driver.bindAddress"] = LOOPBACK
    conf.update(failpoints.executor_conf())
    conf.update(config.conf)
    conf.update(extra_conf or {})
    archive = os.environ.get(CLASS_ARCHIVE_ENV, "")
    options = conf.get("spark.driver.extraJavaOptions", "")
    if archive and Path(archive).is_file() and "Archive" not in options:
        conf["spark.driver.extraJavaOptions"] = f"{options} -XX:SharedArchiveFile={archive} -Xshare:auto".strip()
    if kafka and "spark.jars" not in conf and "spark.jars.packages" not in conf:
        conf["spark.jars.packages"] = KAFKA_CONNECTOR_PACKAGE
        conf.setdefault("spark.jars.excludes", KAFKA_CONNECTOR_EXCLUDES)
    conf.setdefault("spark.pyspark.python", sys.executable)
    # Spark's UI, REST API and event log show every setting but those its redaction regex names; its default misses
    # credential and header.* (a REST catalog's), so the session redacts every key Shale takes as secret too.
    conf["spark.redaction.regex"] = spark_redaction_regex(conf.get("spark.redaction.regex", ""))
    return conf


# Spark's log4j2 configuration for Shale's drivers: warnings to the console as before, except the one Shale causes
# on purpose (no native Hadoop library is needed), which goes only to the Spark log file named in the process's log.
_LOG4J2 = """
status = error
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
appender.file.type = File
appender.file.name = file
appender.file.fileName = ${sys:shale.spark.log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{ISO8601} %p %c: %m%n%ex
rootLogger.level = warn
rootLogger.appenderRefs = console, file
rootLogger.appenderRef.console.ref = console
rootLogger.appenderRef.file.ref = file
logger.native.name = org.apache.hadoop.util.NativeCodeLoader
logger.native.level = warn
logger.native.additivity = false
logger.native.appenderRef.file.ref = file
"""


def spark_log_file(app_name: str) -> Path:
    """Where the driver's Spark log goes (its known, deliberate warnings go only there)."""
    return Path(tempfile.gettempdir()) / f"shale-spark-{app_name}-{os.getpid()}.log"


def _with_log_config(conf: dict[str, str], config_file: Path, log_file: Path) -> None:
    """The driver JVM reads Shale's log4j2 configuration, unless the operator's options name one."""
    options = conf.get("spark.driver.extraJavaOptions", "")
    if "log4j2.configurationFile" in options or "log4j.configuration" in options:
        return
    conf["spark.driver.extraJavaOptions"] = (f"{options} -Dlog4j2.configurationFile={config_file} "
                                             f"-Dshale.spark.log={log_file}").strip()


def check_shared_bucket(config: SparkConfig, bucket: BucketConfig) -> None:
    """A cluster's executors must reach the bucket the driver uses: a ``memory://`` bucket lives in one process, and
    a relative ``file://`` path would resolve against each executor's own working directory."""
    if _local(config.master):
        return
    parsed = urlparse(bucket.url)
    if parsed.scheme == "memory" or (parsed.scheme == "file" and not bucket.url.removeprefix("file://").startswith("/")):
        raise ConfigError(f"bucket.url = {bucket.url!r} cannot be shared with the executors of spark.master = "
                          f"{config.master!r}, which run in other processes and directories; use s3://, gs:// or "
                          "az:// (or file:///absolute/path on a filesystem every Spark worker mounts)")


def spark_session(
    app_name: str,
    config: SparkConfig | None = None,
    *,
    kafka: bool = True,
    extra_conf: dict[str, str] | None = None,
    bucket: BucketConfig | None = None,
) -> SparkSession:
    """Return the process's SparkSession, creating it on first use (see the module docstring for what executors
    get). ``kafka`` asks for the Kafka connector; ``bucket``, when given, is checked to be reachable from
    executors."""
    from pyspark.sql import SparkSession

    config = config or SparkConfig()
    if bucket is not None:
        check_shared_bucket(config, bucket)
    conf = session_conf(config, kafka=kafka, extra_conf=extra_conf)
    # PySpark reads the executors' interpreter from the driver's environment, not from spark.pyspark.python.
    os.environ["PYSPARK_PYTHON"] = conf["spark.pyspark.python"]
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    host = conf.get("spark.driver.host", "")
    if _loopback(host):
        # Without it the driver's JVM resolves the machine's hostname, finds a loopback address and warns.
        os.environ.setdefault("SPARK_LOCAL_IP", host)
    builder = SparkSession.builder.appName(app_name).master(config.master)
    # PySpark starts the JVM with every setting as `--conf key=value` on its command line, where `ps` shows it:
    # settings whose key looks secret go through a private properties file instead.
    hidden = {k: v for k, v in conf.items() if looks_secret(k)}
    for key, value in conf.items():
        if key not in hidden:
            builder = builder.config(key, value)
    log_file = spark_log_file(app_name)
    with tempfile.NamedTemporaryFile("w", prefix="shale-log4j2-", suffix=".properties") as log_config:
        log_config.write(_LOG4J2)
        log_config.flush()
        if "spark.driver.extraJavaOptions" not in hidden:
            extra = {"spark.driver.extraJavaOptions": conf.get("spark.driver.extraJavaOptions", "")}
            _with_log_config(extra, Path(log_config.name), log_file)
            builder = builder.config("spark.driver.extraJavaOptions", extra["spark.driver.extraJavaOptions"])
        with _properties_file(hidden), keep_handler():  # PySpark's SIGINT handler is not Shale's: shale.signals
            session = builder.getOrCreate()
    logging.getLogger(__name__).info("Spark's log (its known warnings included)", extra={"file": str(log_file)})
    session.sparkContext.setLogLevel("WARN")
    return session


@contextlib.contextmanager
def _properties_file(settings: dict[str, str]) -> Iterator[None]:
    """While open, a JVM started by PySpark also reads ``settings`` from a 0600 properties file (named in
    ``PYSPARK_SUBMIT_ARGS``, which PySpark appends to spark-submit's arguments). The file is deleted once the
    JVM has started; it has read it by then."""
    if not settings:
        yield
        return
    previous = os.environ.get("PYSPARK_SUBMIT_ARGS")
    fd, path = tempfile.mkstemp(prefix="shale-spark-", suffix=".properties")  # mode 0600
    with os.fdopen(fd, "w") as out:
        for key, value in settings.items():
            escaped = value.replace("\\", "\\\\").replace("\n", "\\n")
            out.write(f"{key}={escaped}\n")
    os.environ["PYSPARK_SUBMIT_ARGS"] = f"--properties-file {path} {previous or 'pyspark-shell'}"
    try:
        yield
    finally:
        os.unlink(path)
        if previous is None:
            os.environ.pop("PYSPARK_SUBMIT_ARGS", None)
        else:
            os.environ["PYSPARK_SUBMIT_ARGS"] = previous
