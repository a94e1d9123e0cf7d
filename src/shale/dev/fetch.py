"""Fetch the real services Shale develops and tests against, into a git-ignored cache.

This module uses the standard library only, so that `make` can run it with the system Python
while the virtual environment is still being built:

    python3 src/shale/dev/fetch.py all      # Kafka and Spark connector jars, MinIO, promtool, Apicurio

What is fetched, and from where (the machines reach Maven Central and the Go module proxy only):

* Apache Kafka (KRaft broker): ``org.apache.kafka:kafka_2.13`` and its runtime dependencies, plus an
  SLF4J binding, resolved by ``mvn dependency:copy-dependencies``.
* Spark's Kafka connector for the exact pyspark version: ``spark-sql-kafka-0-10_2.13``,
  ``spark-token-provider-kafka-0-10_2.13``, ``kafka-clients`` and ``commons-pool2``, four jars and nothing
  else (everything else is inside pyspark), passed to Spark with ``spark.jars``.
* MinIO: ``go install github.com/minio/minio@<pinned pseudo-version>``.
* promtool, Prometheus's rule checker and rule unit-test runner (the tests run the alert rules with it):
  ``go install -tags remove_all_sd github.com/prometheus/prometheus/cmd/promtool@<pinned version>``.
* Apache Iceberg's Spark runtime for Spark 4.1, its AWS bundle (S3FileIO) and the SQLite JDBC driver, three jars
  and nothing else, so that Spark SQL reads the Iceberg tables Shale publishes (JDBC catalog on SQLite, S3FileIO).

* Apache Iceberg's REST catalog server, for Iceberg tables published through a REST catalog (``fetch.py
  iceberg-rest``, not in ``all``; ``shale dev up --iceberg-catalog`` and the REST tests fetch it):
  ``org.apache.iceberg:iceberg-open-api`` classifier ``test-fixtures`` (``RESTCatalogServer`` and its adapter),
  ``iceberg-core`` with its ``tests`` classifier (``RESTCatalogServlet``), ``iceberg-aws`` and ``iceberg-aws-bundle``
  (S3FileIO for the warehouse on MinIO) with ``failsafe``, Jetty 12's servlet and compression modules, the SQLite
  JDBC driver (its store) and an SLF4J binding, with their dependencies; then ``LoopbackRESTCatalogServer.java``
  (beside this file) compiled with ``javac`` into the same folder: it runs the server's pieces on a connector bound
  to one address.

* Project Nessie 0.99.0's server, a production Iceberg REST catalog (``fetch.py nessie``, in ``all``: ``make test``
  fetches it while the unit tests run): ``org.projectnessie.nessie:nessie-quarkus:0.99.0:jar:runner``, one
  self-contained Quarkus jar (245 MB) that runs on Java 21 or newer (Temurin 25 here), its SHA-256 checked. 0.99.0 is
  the newest ``nessie-quarkus`` on the Maven Central this project reaches (checked 2026-12-02: 0.110.0's runner jar
  answers 404). Apache Polaris publishes no runnable server there (``polaris-runtime-service`` is a plain jar, its
  ``-runner`` 404; the server is a tarball on downloads.apache.org, unreachable) and Lakekeeper is a Rust binary
  (crates.io's index unreachable).

* pyspark at the oldest version an existing Spark cluster may run (``SPARK_CLUSTER_OLDEST_VERSION``, 4.1.0), in a
  virtual environment of its own (``fetch.py spark-cluster-oldest``, in ``all``): the cluster-versions test starts a
  master and a worker from its distribution under a driver of the pinned pyspark.

* DuckDB 1.5.5 with its Iceberg extension, in a virtual environment of its own (``fetch.py duckdb``, not in
  ``all``; the REST tests and ``make demo`` fetch it): ``python -m venv`` and pip from PyPI.

* Apicurio Registry (a Schema Registry with a Confluent-compatible API, for the typed-table parsers):
  ``io.apicurio:apicurio-registry-app:3.0.9:zip:all``, unzipped; the Quarkus runner jar runs on Java 17.

Two more sets only the ingest benchmark needs, fetched when it first runs (not by ``all``):

* ``kafka-tools`` at the broker's version, for ``org.apache.kafka.tools.ConsumerPerformance``; it runs on the
  broker's classpath plus this one jar.
* Hadoop's S3A connector for Spark's own Hadoop: ``hadoop-aws`` at pyspark's Hadoop version and the AWS SDK
  bundle it declares, two jars (Hadoop itself is inside pyspark).

Two more sets only benchmarks need, fetched by ``make bench-deps`` (``make bench``) with ``fetch.py
spark-avro iceberg-kafka-connect`` (not by ``all``):

* Spark's own Avro support for the typed-ingest benchmark (``bench/typed_ingest.py``: ``from_avro``):
  ``org.apache.spark:spark-avro_2.13`` at pyspark's version, one jar (Avro itself is inside pyspark).

* A Kafka Connect worker with the Apache Iceberg sink, assembled as the sink's runtime distribution is (that zip
  is not published on Maven Central): ``org.apache.iceberg:iceberg-kafka-connect`` at its newest release, its
  ``-transforms`` (``KafkaMetadataTransform``), ``iceberg-parquet`` (the data files' format), ``iceberg-aws`` and
  ``iceberg-aws-bundle`` (S3FileIO for MinIO and its AWS SDK), ``org.apache.kafka:connect-runtime`` at the broker's
  version, Hadoop's shaded client jars (the Parquet writer needs Hadoop's ``Configuration``), the SQLite JDBC
  driver for a JDBC catalog and Log4j 2 (the logging Kafka's distribution ships), all with their dependencies and
  one Jackson version (``jackson-bom``), resolved by ``mvn dependency:copy-dependencies`` into one folder that is
  the worker's classpath (the peer benchmark, ``bench/peers.py``).

Every fetch is idempotent: a ``.complete`` marker is written last, so an interrupted fetch is redone.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

KAFKA_VERSION = "4.1.1"
SLF4J_VERSION = "1.7.36"  # kafka_2.13 4.1 depends on slf4j-api 1.7.x; the binding must match it.
# The connector must match pyspark exactly. 4.1.1 is the newest Spark whose wheel (PyPI), four Kafka connector jars
# and Iceberg Spark runtime all resolve on the registries this project reaches (checked 2026-12-02; 4.2.0 has no
# Iceberg runtime, 4.2.1 and 4.3.0 no Kafka connector on Maven Central; see docs/DESIGN.md).
SPARK_VERSION = "4.1.1"
SPARK_KAFKA_CLIENTS_VERSION = "3.9.1"  # as declared by spark-sql-kafka-0-10_2.13:4.1.1
SPARK_COMMONS_POOL2_VERSION = "2.12.1"  # as declared by spark-sql-kafka-0-10_2.13:4.1.1
# The oldest Spark an existing cluster may run under a 4.1.1 driver (docs/DEPLOY.md): its master's and workers'
# Spark, pyspark's distribution in a virtual environment of its own (``fetch.py spark-cluster-oldest``).
SPARK_CLUSTER_OLDEST_VERSION = "4.1.0"
MINIO_MODULE = "github.com/minio/minio"
MINIO_VERSION = "v0.0.0-20260212201848-7aac2a2c5b7c"
PROMTOOL_MODULE = "github.com/prometheus/prometheus/cmd/promtool"
# Prometheus 3.16.0, published as Go module version v0.316.0 (Prometheus 3 tags its Go module v0.3MM.P; the v2.x
# tags are +incompatible and v1.99.0 is a placeholder). It is the newest release on the Go module proxy (checked
# 2026-11-23), its go.mod has no replace or exclude directive (`go install module@version` refuses those), and it
# asks for go 1.26.7, which the Go on these machines satisfies.
PROMTOOL_VERSION = "v0.316.0"
# Iceberg 1.12.0's Spark runtime for Spark 4.1 (the newest on Maven Central, checked 2026-12-02). The AWS bundle must
# be the same Iceberg version as the runtime.
ICEBERG_VERSION = "1.12.0"
SQLITE_JDBC_VERSION = "3.54.1.0"
ICEBERG_ARTIFACTS = (
    ("org.apache.iceberg", "iceberg-spark-runtime-4.1_2.13", ICEBERG_VERSION),
    ("org.apache.iceberg", "iceberg-aws-bundle", ICEBERG_VERSION),
    ("org.xerial", "sqlite-jdbc", SQLITE_JDBC_VERSION),
)

# The REST catalog server: Iceberg 1.11.0's, since iceberg-open-api publishes its ``test-fixtures`` (the server) up to
# 1.11.0 only (checked 2026-12-02: 1.12.0 has none); a 1.11 server and 1.12 clients speak the same REST protocol.
# Jetty 12.1 is what those fixtures are built against (org.eclipse.jetty.ee10 servlets,
# org.eclipse.jetty.compression); 12.1.14 is its newest release (2026-11-27).
ICEBERG_REST_VERSION = "1.11.0"
JETTY_VERSION = "12.1.14"
ICEBERG_REST_ARTIFACTS = (  # (group, artifact, version, classifier, with its dependencies)
    ("org.apache.iceberg", "iceberg-open-api", ICEBERG_REST_VERSION, "test-fixtures", False),
    ("org.apache.iceberg", "iceberg-core", ICEBERG_REST_VERSION, "", True),
    ("org.apache.iceberg", "iceberg-core", ICEBERG_REST_VERSION, "tests", False),
    ("org.apache.iceberg", "iceberg-aws", ICEBERG_REST_VERSION, "", False),
    ("org.apache.iceberg", "iceberg-aws-bundle", ICEBERG_REST_VERSION, "", False),
    ("dev.failsafe", "failsafe", "3.3.2", "", False),  # iceberg-aws's retries, as its pom declares
    ("org.eclipse.jetty.ee10", "jetty-ee10-servlet", JETTY_VERSION, "", True),
    ("org.eclipse.jetty.compression", "jetty-compression-server", JETTY_VERSION, "", True),
    ("org.eclipse.jetty.compression", "jetty-compression-gzip", JETTY_VERSION, "", True),
    ("org.xerial", "sqlite-jdbc", SQLITE_JDBC_VERSION, "", False),
    ("org.slf4j", "slf4j-simple", "2.0.17", "", True),  # the binding of iceberg-core's slf4j-api 2.0.17
)
REST_LAUNCHER = "LoopbackRESTCatalogServer"

# 3.0.9 is the newest Apicurio Registry published on Maven Central as a runnable `zip:all` (3.3.3 has none).
APICURIO_VERSION = "3.0.9"
APICURIO_ARTIFACT = f"io.apicurio:apicurio-registry-app:{APICURIO_VERSION}:zip:all"

KAFKA_TOOLS_ARTIFACTS = (("org.apache.kafka", "kafka-tools", KAFKA_VERSION),)
HADOOP_VERSION = "3.4.2"  # pyspark 4.1.1 ships hadoop-client-api and hadoop-client-runtime 3.4.2
AWS_SDK_BUNDLE_VERSION = "2.29.52"  # as declared by hadoop-aws 3.4.2
S3A_ARTIFACTS = (
    ("org.apache.hadoop", "hadoop-aws", HADOOP_VERSION),
    ("software.amazon.awssdk", "bundle", AWS_SDK_BUNDLE_VERSION),
)

LOG4J_VERSION = "2.24.3"  # as Kafka 4.1.1's distribution ships
ICEBERG_KC_VERSION = "1.12.0"  # the newest iceberg-kafka-connect on Maven Central (checked 2026-11-26)
ICEBERG_KC_ARTIFACTS = (
    ("org.apache.iceberg", "iceberg-kafka-connect", ICEBERG_KC_VERSION),
    ("org.apache.iceberg", "iceberg-kafka-connect-transforms", ICEBERG_KC_VERSION),
    ("org.apache.iceberg", "iceberg-parquet", ICEBERG_KC_VERSION),  # the data files' format (the runtime zip has it)
    ("org.apache.iceberg", "iceberg-aws", ICEBERG_KC_VERSION),  # S3FileIO itself
    ("org.apache.iceberg", "iceberg-aws-bundle", ICEBERG_KC_VERSION),  # the AWS SDK it uses, shaded
    ("org.apache.kafka", "connect-runtime", KAFKA_VERSION),
    ("org.apache.hadoop", "hadoop-client-api", HADOOP_VERSION),
    ("org.apache.hadoop", "hadoop-client-runtime", HADOOP_VERSION),
    ("org.xerial", "sqlite-jdbc", SQLITE_JDBC_VERSION),
    # The worker's logging, as Kafka's own distribution ships it (connect-runtime declares no binding).
    ("org.apache.logging.log4j", "log4j-api", LOG4J_VERSION),
    ("org.apache.logging.log4j", "log4j-core", LOG4J_VERSION),
    ("org.apache.logging.log4j", "log4j-slf4j2-impl", LOG4J_VERSION),
)

# Left to Maven's nearest-wins, the sink's jackson-databind 2.22 meets connect-runtime's jackson-annotations 2.19
# (NoClassDefFoundError: com/fasterxml/jackson/annotation/JsonSerializeAs): one Jackson for all, the sink's.
ICEBERG_KC_BOMS = (("com.fasterxml.jackson", "jackson-bom", "2.22.2"),)

# spark-avro_2.13 4.1.1's runtime dependencies (spark-tags, tukaani's xz; Avro through Spark's core) are all inside
# pyspark 4.1.1: the one jar.
SPARK_AVRO_ARTIFACTS = (("org.apache.spark", "spark-avro_2.13", SPARK_VERSION),)

SPARK_CONNECTOR_ARTIFACTS = (
    ("org.apache.spark", "spark-sql-kafka-0-10_2.13", SPARK_VERSION),
    ("org.apache.spark", "spark-token-provider-kafka-0-10_2.13", SPARK_VERSION),
    ("org.apache.kafka", "kafka-clients", SPARK_KAFKA_CLIENTS_VERSION),
    ("org.apache.commons", "commons-pool2", SPARK_COMMONS_POOL2_VERSION),
)


class FetchError(RuntimeError):
    """A component could not be fetched; the message names the command and its output."""


def cache_dir() -> Path:
    """The cache folder, the same from any working folder: ``$SHALE_CACHE_DIR``; else, for Shale run from its source
    checkout (``make demo``, ``.venv/bin/shale``), that checkout's ``.cache``, which the Makefile fills; else the
    user's cache, ``$XDG_CACHE_HOME/shale`` (``~/.cache/shale``)."""
    if os.environ.get("SHALE_CACHE_DIR"):
        return Path(os.environ["SHALE_CACHE_DIR"]).resolve()
    checkout = Path(__file__).resolve().parents[3]  # src/shale/dev/fetch.py -> the checkout
    if (checkout / "Makefile").is_file() and (checkout / "src" / "shale").is_dir():
        return checkout / ".cache"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "shale"


def kafka_jars_dir(cache: Path | None = None) -> Path:
    return (cache or cache_dir()) / "jars" / f"kafka-{KAFKA_VERSION}"


def spark_jars_dir(cache: Path | None = None) -> Path:
    return (cache or cache_dir()) / "jars" / f"spark-kafka-connector-{SPARK_VERSION}"


def iceberg_jars_dir(cache: Path | None = None) -> Path:
    return (cache or cache_dir()) / "jars" / f"iceberg-{ICEBERG_VERSION}"


def minio_binary(cache: Path | None = None) -> Path:
    return (cache or cache_dir()) / "bin" / f"minio-{MINIO_VERSION}" / "minio"


def _log(message: str) -> None:
    print(f"[shale fetch] {time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _locked(target: Path) -> Iterator[None]:
    """Serialises fetches of one component across processes (make -j, pytest, shale dev up)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _run(cmd: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
        raise FetchError(f"command failed (exit {proc.returncode}): {' '.join(cmd)}\n{tail}")


def _mvn(args: list[str], cwd: Path) -> None:
    """``mvn args`` in ``cwd``, one at a time on this machine: Maven 3.8 writes its local repository (~/.m2) without
    locks, and two runs downloading the same artifact at once fail on each other's partial file (a fresh machine's
    first `make test`: every fetch resolves the same dependency plugin)."""
    if shutil.which("mvn") is None:
        raise FetchError("mvn is not on PATH: install Maven (Debian package 'maven') and retry")
    lock_file = Path.home() / ".m2" / ".shale-mvn.lock"
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _run(["mvn", "-q", "-B", *args], cwd=cwd)


def _dependency(group: str, artifact: str, version: str, exclude_all: bool, classifier: str = "") -> str:
    exclusions = (
        "<exclusions><exclusion><groupId>*</groupId><artifactId>*</artifactId></exclusion></exclusions>"
        if exclude_all
        else ""
    )
    classified = f"<classifier>{classifier}</classifier>" if classifier else ""
    return (
        f"<dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId>"
        f"<version>{version}</version>{classified}{exclusions}</dependency>"
    )


def _maven_copy(target: Path, dependencies: list[str], boms: tuple[tuple[str, str, str], ...] = ()) -> None:
    """Resolve ``dependencies`` from Maven Central (versions of what ``boms`` name taken from them) and copy their
    runtime jars into ``target``."""
    managed = [f"<dependency><groupId>{g}</groupId><artifactId>{a}</artifactId><version>{v}</version>"
               "<type>pom</type><scope>import</scope></dependency>" for g, a, v in boms]
    pom = (
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        "<groupId>dev.shale</groupId><artifactId>fetch</artifactId><version>1</version>"
        f"<dependencyManagement><dependencies>{''.join(managed)}</dependencies></dependencyManagement>"
        f"<dependencies>{''.join(dependencies)}</dependencies></project>"
    )
    with tempfile.TemporaryDirectory(prefix="shale-mvn-") as work:
        Path(work, "pom.xml").write_text(pom)
        staging = Path(work, "jars")
        _mvn(["dependency:copy-dependencies", "-DincludeScope=runtime", f"-DoutputDirectory={staging}"], Path(work))
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(staging, target)


def fetch_kafka(cache: Path | None = None) -> Path:
    """The Kafka broker's classpath folder, fetched if missing."""
    target = kafka_jars_dir(cache)
    with _locked(target):
        if (target / ".complete").exists():
            return target
        _log(f"fetching Apache Kafka {KAFKA_VERSION} jars from Maven Central")
        _maven_copy(
            target,
            [
                _dependency("org.apache.kafka", "kafka_2.13", KAFKA_VERSION, exclude_all=False),
                _dependency("org.slf4j", "slf4j-api", SLF4J_VERSION, exclude_all=False),
                _dependency("org.slf4j", "slf4j-simple", SLF4J_VERSION, exclude_all=False),
            ],
        )
        (target / ".complete").write_text(KAFKA_VERSION)
        _log(f"Kafka jars ready in {target}")
    return target


def _fetch_jar_set(target: Path, artifacts: tuple[tuple[str, str, str], ...], version: str, what: str) -> Path:
    """``target`` holding exactly ``artifacts`` (each without its dependencies), fetched if missing."""
    with _locked(target):
        if (target / ".complete").exists():
            return target
        _log(f"fetching {what} from Maven Central")
        _maven_copy(target, [_dependency(g, a, v, exclude_all=True) for g, a, v in artifacts])
        found = sorted(p.name for p in target.glob("*.jar"))
        if len(found) != len(artifacts):
            raise FetchError(f"expected {len(artifacts)} jars for {what}, got {found}")
        (target / ".complete").write_text(version)
        _log(f"{what} ready in {target}")
    return target


def fetch_spark_connector(cache: Path | None = None) -> Path:
    """The folder holding exactly the four connector jars, fetched if missing."""
    return _fetch_jar_set(spark_jars_dir(cache), SPARK_CONNECTOR_ARTIFACTS, SPARK_VERSION,
                          f"Spark {SPARK_VERSION} Kafka connector jars")


def spark_connector_jars(cache: Path | None = None) -> list[Path]:
    return sorted(fetch_spark_connector(cache).glob("*.jar"))


def fetch_spark_avro(cache: Path | None = None) -> Path:
    """The folder holding exactly ``spark-avro`` at pyspark's version, fetched if missing."""
    return _fetch_jar_set((cache or cache_dir()) / "jars" / f"spark-avro-{SPARK_VERSION}", SPARK_AVRO_ARTIFACTS,
                          SPARK_VERSION, f"Spark {SPARK_VERSION} Avro jar")


def spark_avro_jars(cache: Path | None = None) -> list[Path]:
    return sorted(fetch_spark_avro(cache).glob("*.jar"))


def fetch_iceberg(cache: Path | None = None) -> Path:
    """The folder holding exactly the Iceberg Spark runtime, the AWS bundle and the SQLite JDBC driver."""
    return _fetch_jar_set(iceberg_jars_dir(cache), ICEBERG_ARTIFACTS, ICEBERG_VERSION,
                          f"Apache Iceberg {ICEBERG_VERSION} Spark jars and the SQLite JDBC driver")


def iceberg_jars(cache: Path | None = None) -> list[Path]:
    return sorted(fetch_iceberg(cache).glob("*.jar"))


def iceberg_rest_dir(cache: Path | None = None) -> Path:
    return (cache or cache_dir()) / "jars" / f"iceberg-rest-{ICEBERG_REST_VERSION}"


def fetch_iceberg_rest(cache: Path | None = None) -> Path:
    """The REST catalog server's classpath folder (jars and the compiled launcher), fetched if missing."""
    target = iceberg_rest_dir(cache)
    with _locked(target):
        if (target / ".complete").exists():
            return target
        if shutil.which("javac") is None:
            raise FetchError("javac is not on PATH: install a JDK 17 (Debian package 'openjdk-17-jdk-headless')")
        _log(f"fetching Apache Iceberg {ICEBERG_REST_VERSION}'s REST catalog server from Maven Central")
        _maven_copy(target, [_dependency(g, a, v, exclude_all=not deps, classifier=c)
                             for g, a, v, c, deps in ICEBERG_REST_ARTIFACTS])
        source = Path(__file__).resolve().parent / "java" / f"{REST_LAUNCHER}.java"
        _run(["javac", "--release", "17", "-d", str(target), "-cp", f"{target}/*", str(source)])
        (target / ".complete").write_text(ICEBERG_REST_VERSION)
        _log(f"REST catalog server ready in {target}")
    return target


NESSIE_VERSION = "0.99.0"
NESSIE_ARTIFACT = f"org.projectnessie.nessie:nessie-quarkus:{NESSIE_VERSION}:jar:runner"
NESSIE_SHA256 = "ce9fa33e2878bf5ea3981876b9e6204cabc0362b3dd82326b10e47271a78c417"


def fetch_nessie(cache: Path | None = None) -> Path:
    """Project Nessie's runner jar from Maven Central (``fetch.py nessie``, in ``all``), fetched if missing and
    refused unless its SHA-256 is the pinned one."""
    target = (cache or cache_dir()) / "nessie" / f"nessie-{NESSIE_VERSION}"
    jar = target / f"nessie-quarkus-{NESSIE_VERSION}-runner.jar"
    with _locked(target):
        if (target / ".complete").exists():
            return jar
        _log(f"fetching Project Nessie {NESSIE_VERSION}'s server from Maven Central (245 MB)")
        with tempfile.TemporaryDirectory(prefix="shale-mvn-") as work:
            _mvn(["dependency:copy", f"-Dartifact={NESSIE_ARTIFACT}", f"-DoutputDirectory={work}"], Path(work))
            fetched = Path(work) / jar.name
            digest = hashlib.sha256()
            with fetched.open("rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    digest.update(chunk)
            if digest.hexdigest() != NESSIE_SHA256:
                raise FetchError(f"{NESSIE_ARTIFACT}: SHA-256 {digest.hexdigest()}, expected {NESSIE_SHA256}")
            if target.exists():
                shutil.rmtree(target)
            target.mkdir(parents=True)
            shutil.move(fetched, jar)
        (target / ".complete").write_text(NESSIE_VERSION)
        _log(f"Nessie ready at {jar}")
    return jar


DUCKDB_VERSION = "1.5.5"
DUCKDB_PACKAGES = (f"duckdb=={DUCKDB_VERSION}", f"duckdb-extensions=={DUCKDB_VERSION}",
                   *(f"duckdb-extension-{e}=={DUCKDB_VERSION}" for e in ("iceberg", "httpfs", "avro")))


def fetch_duckdb(cache: Path | None = None) -> Path:
    """The Python of a virtual environment holding DuckDB and its Iceberg extension (with httpfs and avro, which it
    loads) from PyPI, pinned to one DuckDB version: the extensions' wheels are built for exactly that version, so
    they live beside Shale's environment rather than in it. The tests drive it as a subprocess."""
    return _fetch_venv("duckdb", DUCKDB_VERSION, DUCKDB_PACKAGES, f"DuckDB {DUCKDB_VERSION} and its Iceberg extension",
                       cache)


# chDB 4.4 (ClickHouse in a Python module) and the engine build it loads, chdb-core (ClickHouse 26.9): about 900 MB
# installed, for the interoperability script only (bench/interop.py).
CHDB_VERSION = "4.4.0"
CHDB_PACKAGES = (f"chdb=={CHDB_VERSION}", "chdb-core==26.9.0")


def _fetch_venv(name: str, version: str, packages: tuple[str, ...], what: str, cache: Path | None) -> Path:
    """The Python of a virtual environment ``venvs/<name>-<version>`` holding ``packages`` from PyPI, made if
    missing."""
    target = (cache or cache_dir()) / "venvs" / f"{name}-{version}"
    python = target / "bin" / "python"
    with _locked(target):
        if (target / ".complete").exists():
            return python
        _log(f"creating a virtual environment with {what} (PyPI)")
        if target.exists():
            shutil.rmtree(target)
        _run([sys.executable, "-m", "venv", str(target)])
        _run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *packages])
        (target / ".complete").write_text(version)
        _log(f"{what} ready in {target}")
    return python


def fetch_spark_cluster_oldest(cache: Path | None = None) -> Path:
    """The Spark distribution folder (``bin/spark-class``, ``jars/``) of pyspark at the oldest version an existing
    cluster may run (``SPARK_CLUSTER_OLDEST_VERSION``), in a virtual environment of its own (``fetch.py
    spark-cluster-oldest``, in ``all``; tests/integration/test_spark_cluster_versions.py starts a cluster from it)."""
    python = _fetch_venv("pyspark", SPARK_CLUSTER_OLDEST_VERSION, (f"pyspark=={SPARK_CLUSTER_OLDEST_VERSION}",),
                         f"pyspark {SPARK_CLUSTER_OLDEST_VERSION} (an older Spark cluster)", cache)
    found = sorted(python.parent.parent.glob("lib/python*/site-packages/pyspark"))
    if not found:
        raise FetchError(f"no pyspark package under {python.parent.parent}: delete the folder and fetch again")
    return found[0]


def fetch_chdb(cache: Path | None = None) -> Path:
    """The Python of a virtual environment holding chDB (``fetch.py chdb``, not in ``all``): beside Shale's, since
    chdb-core pins its own Arrow and is large. The interoperability script drives it as a subprocess."""
    return _fetch_venv("chdb", CHDB_VERSION, CHDB_PACKAGES, f"chDB {CHDB_VERSION}", cache)


# Trino's server, for the interoperability script and the reading guide's test (test_reading_trino.py): the release
# tarball on Maven Central (about 800 MB unpacked, every connector's plugin inside); it runs on Java >= 24.
TRINO_VERSION = "476"
TRINO_ARTIFACT = f"io.trino:trino-server:{TRINO_VERSION}:tar.gz"


def fetch_trino(cache: Path | None = None) -> Path:
    """Trino's unpacked server (``bin/launcher``, ``lib/``, ``plugin/``) from Maven Central (``fetch.py trino``, in
    ``all``), fetched if missing."""
    target = (cache or cache_dir()) / "trino" / f"trino-server-{TRINO_VERSION}"
    with _locked(target):
        if (target / ".complete").exists():
            return target
        _log(f"fetching Trino {TRINO_VERSION}'s server from Maven Central")
        with tempfile.TemporaryDirectory(prefix="shale-mvn-") as work:
            _mvn(["dependency:copy", f"-Dartifact={TRINO_ARTIFACT}", f"-DoutputDirectory={work}"], Path(work))
            archives = sorted(Path(work).glob("*.tar.gz"))
            if len(archives) != 1:
                raise FetchError(f"expected one tar.gz from {TRINO_ARTIFACT}, got {archives}")
            unpacked = Path(work) / "unpacked"
            shutil.unpack_archive(archives[0], unpacked)
            if target.exists():
                shutil.rmtree(target)
            shutil.move(unpacked / f"trino-server-{TRINO_VERSION}", target)
        (target / ".complete").write_text(TRINO_VERSION)
        _log(f"Trino ready in {target}")
    return target


def kafka_tools_classpath(cache: Path | None = None) -> str:
    """The classpath that runs Kafka's command-line tools: the broker's jars and ``kafka-tools``."""
    tools = _fetch_jar_set((cache or cache_dir()) / "jars" / f"kafka-tools-{KAFKA_VERSION}", KAFKA_TOOLS_ARTIFACTS,
                           KAFKA_VERSION, f"Apache Kafka {KAFKA_VERSION} tools jar")
    return f"{fetch_kafka(cache)}/*:{tools}/*"


def s3a_jars(cache: Path | None = None) -> list[Path]:
    """Hadoop's S3A connector for pyspark's Hadoop (``hadoop-aws`` and the AWS SDK bundle), fetched if missing."""
    target = (cache or cache_dir()) / "jars" / f"hadoop-aws-{HADOOP_VERSION}"
    return sorted(_fetch_jar_set(target, S3A_ARTIFACTS, HADOOP_VERSION, f"Hadoop {HADOOP_VERSION} S3A jars")
                  .glob("*.jar"))


def iceberg_kafka_connect_dir(cache: Path | None = None) -> Path:
    return (cache or cache_dir()) / "jars" / f"iceberg-kafka-connect-{ICEBERG_KC_VERSION}"


def fetch_iceberg_kafka_connect(cache: Path | None = None) -> Path:
    """The Kafka Connect worker's classpath with the Iceberg sink (every jar with its dependencies), if missing."""
    target = iceberg_kafka_connect_dir(cache)
    with _locked(target):
        if (target / ".complete").exists():
            return target
        _log(f"fetching Kafka Connect {KAFKA_VERSION} and the Apache Iceberg {ICEBERG_KC_VERSION} sink from Maven "
             "Central")
        _maven_copy(target, [_dependency(g, a, v, exclude_all=False) for g, a, v in ICEBERG_KC_ARTIFACTS],
                    boms=ICEBERG_KC_BOMS)
        (target / ".complete").write_text(ICEBERG_KC_VERSION)
        _log(f"Kafka Connect with the Iceberg sink ready in {target}")
    return target


def apicurio_dir(cache: Path | None = None) -> Path:
    return (cache or cache_dir()) / "apicurio" / f"apicurio-registry-{APICURIO_VERSION}"


def apicurio_runner_jar(cache: Path | None = None) -> Path:
    """The Quarkus runner jar of the unzipped registry, fetched if missing."""
    found = sorted(fetch_apicurio(cache).glob("*-runner.jar"))
    if not found:
        raise FetchError(f"no runner jar under {apicurio_dir(cache)}: delete the folder and fetch again")
    return found[0]


def fetch_apicurio(cache: Path | None = None) -> Path:
    """Apicurio Registry's unzipped ``zip:all`` from Maven Central, fetched if missing."""
    target = apicurio_dir(cache)
    with _locked(target):
        if (target / ".complete").exists():
            return target
        _log(f"fetching Apicurio Registry {APICURIO_VERSION} from Maven Central")
        with tempfile.TemporaryDirectory(prefix="shale-mvn-") as work:
            _mvn(["dependency:copy", f"-Dartifact={APICURIO_ARTIFACT}", f"-DoutputDirectory={work}"], Path(work))
            zips = sorted(Path(work).glob("*.zip"))
            if len(zips) != 1:
                raise FetchError(f"expected one zip from {APICURIO_ARTIFACT}, got {zips}")
            if target.exists():
                shutil.rmtree(target)
            shutil.unpack_archive(zips[0], target)
        (target / ".complete").write_text(APICURIO_VERSION)
        _log(f"Apicurio Registry ready in {target}")
    return target


def promtool_binary(cache: Path | None = None) -> Path:
    return (cache or cache_dir()) / "bin" / f"promtool-{PROMTOOL_VERSION}" / "promtool"


def _go_install(binary: Path, module: str, version: str, what: str, tags: str = "") -> Path:
    """Build ``module@version`` with ``go install`` (and the build ``tags``) into ``binary``'s folder, unless a
    completed build is there."""
    with _locked(binary.parent):
        if binary.exists() and (binary.parent / ".complete").exists():
            return binary
        if shutil.which("go") is None:
            raise FetchError("go is not on PATH: install Go 1.26.7 or newer and retry")
        _log(f"building {what} {version} with go install (minutes on a fresh machine)")
        binary.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, GOBIN=str(binary.parent), CGO_ENABLED="0")
        _run(["go", "install", *(["-tags", tags] if tags else []), f"{module}@{version}"], env=env)
        if not binary.exists():
            raise FetchError(f"go install finished but {binary} is missing")
        (binary.parent / ".complete").write_text(version)
        _log(f"{what} ready at {binary}")
    return binary


def fetch_minio(cache: Path | None = None) -> Path:
    """The MinIO server binary, built with ``go install`` at the pinned version if missing."""
    return _go_install(minio_binary(cache), MINIO_MODULE, MINIO_VERSION, "MinIO")


def fetch_promtool(cache: Path | None = None) -> Path:
    """Prometheus's promtool, built with ``go install`` at the pinned version if missing, without Prometheus's
    service discovery providers (``remove_all_sd``, Prometheus 3.10+: Kubernetes, the clouds' SDKs): the tests use
    its rule checks only, and the build takes 179 s instead of 467 s on a cold Go build cache (2026-12-04)."""
    return _go_install(promtool_binary(cache), PROMTOOL_MODULE, PROMTOOL_VERSION, "promtool", tags="remove_all_sd")


FETCHERS = {
    "kafka": fetch_kafka, "spark": fetch_spark_connector, "iceberg": fetch_iceberg, "minio": fetch_minio,
    "promtool": fetch_promtool, "apicurio": fetch_apicurio, "iceberg-kafka-connect": fetch_iceberg_kafka_connect,
    "spark-avro": fetch_spark_avro, "iceberg-rest": fetch_iceberg_rest, "duckdb": fetch_duckdb,
    "chdb": fetch_chdb, "trino": fetch_trino, "nessie": fetch_nessie,
    "spark-cluster-oldest": fetch_spark_cluster_oldest,
}
# Only benchmarks need the first two (make bench-deps); the REST catalog is fetched when first started. Trino, Nessie
# and the older Spark are in ``all`` (``make test`` fetches them while the unit tests run: 1.3 GB together, which the
# integration tests that start them would otherwise download on the suite's critical path).
NOT_IN_ALL = ("iceberg-kafka-connect", "spark-avro", "iceberg-rest", "duckdb", "chdb")


def fetch_all(names: list[str]) -> None:
    """Fetch the named components concurrently; raise the first failure after all have finished."""
    errors: list[str] = []

    def worker(name: str) -> None:
        try:
            FETCHERS[name]()
        except FetchError as exc:
            errors.append(f"{name}: {exc}")

    threads = [threading.Thread(target=worker, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise FetchError("\n".join(errors))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("components", nargs="*", default=["all"], choices=[*FETCHERS, "all"])
    args = parser.parse_args(argv)
    names = [n for n in FETCHERS if n not in NOT_IN_ALL] if "all" in args.components else args.components
    try:
        fetch_all(names)
    except FetchError as exc:
        _log(f"FAILED\n{exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
