"""SparkSession factory: local mode on loopback, the project's interpreter for Python workers, and the Kafka
connector jars (fetched from Maven Central at the exact pyspark version) on ``spark.jars``."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING

from shale.config import SparkConfig
from shale.config.secrets import looks_secret

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def _local(master: str) -> bool:
    return master.startswith("local")


def spark_session(
    app_name: str,
    config: SparkConfig | None = None,
    *,
    kafka: bool = True,
    extra_conf: dict[str, str] | None = None,
) -> SparkSession:
    """Return the process's SparkSession, creating it on first use.

    With ``kafka`` the four connector jars are added to ``spark.jars`` (they are fetched into the cache if
    missing). Local masters bind the driver to 127.0.0.1; the Python workers run the interpreter running
    this code, so that they see the same packages.
    """
    from pyspark.sql import SparkSession

    config = config or SparkConfig()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    conf: dict[str, str] = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "4",
        "spark.python.worker.reuse": "true",
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.extraJavaOptions": "-Duser.timezone=UTC",
        "spark.executor.extraJavaOptions": "-Duser.timezone=UTC",
    }
    if _local(config.master):
        conf["spark.driver.host"] = "127.0.0.1"
        conf["spark.driver.bindAddress"] = "127.0.0.1"
    if kafka:
        from shale.dev.fetch import spark_connector_jars

        conf["spark.jars"] = ",".join(str(p) for p in spark_connector_jars())
    conf.update(config.conf)
    conf.update(extra_conf or {})
    builder = SparkSession.builder.appName(app_name).master(config.master)
    # PySpark starts the JVM with every setting as `--conf key=value` on its command line, where `ps` shows it:
    # settings whose key looks secret go through a private properties file instead.
    hidden = {k: v for k, v in conf.items() if looks_secret(k)}
    for key, value in conf.items():
        if key not in hidden:
            builder = builder.config(key, value)
    with _properties_file(hidden):
        session = builder.getOrCreate()
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
