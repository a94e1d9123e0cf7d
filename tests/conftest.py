"""Shared fixtures. Real services (Kafka, MinIO, Spark in local mode, a Spark standalone cluster) start once per
session, on free loopback ports, when a test first asks for them. If one cannot start, the fixture raises and
every test that needs it errors: nothing is skipped."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, settings

from shale.config import BucketConfig, SparkConfig
from shale.dev import KafkaBroker, MinioServer, SchemaRegistry, SparkStandalone, connector_conf
from shale.dev.iceberg_rest import IcebergRestCatalog
from shale.dev.nessie import NessieServer

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ROOT = Path(__file__).resolve().parent.parent

# Property-based tests run on a fixed budget in `make test` ("ci", the default) and longer nightly
# (HYPOTHESIS_PROFILE=nightly). "ci" draws the same examples on every run (derandomized), so a commit's verdict does
# not depend on the seed: a main that passed stays passing, and the search for new inputs is the nightly profile's
# (random, 2,000 examples). Examples that failed once are replayed from .hypothesis/ (git-ignored); a property that
# finds a bug keeps that input as a named example test.
settings.register_profile("ci", max_examples=60, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("nightly", max_examples=2000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config: pytest.Config) -> None:
    """Every Spark driver of the session, in process or a ``shale`` command it starts, maps Spark's classes from the
    class archive when ``make test`` has built it (``shale.dev.spark_classes``)."""
    from shale.dev.spark_classes import archive_path
    from shale.spark import CLASS_ARCHIVE_ENV

    if archive_path().is_file():
        os.environ.setdefault(CLASS_ARCHIVE_ENV, str(archive_path()))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    _longest_files_first(items)
    for item in items:
        parts = Path(str(item.fspath)).parts
        if "integration" in parts:
            item.add_marker(pytest.mark.integration)
        elif "unit" in parts:
            # `make unit` needs nothing but the virtual environment: a test that starts a fetched or built service
            # (every one starts under services_dir) is an integration test, and lives there.
            if "services_dir" in getattr(item, "fixturenames", ()):
                raise pytest.UsageError(f"{item.nodeid} starts a service: move it to tests/integration")
            item.add_marker(pytest.mark.unit)


def _longest_files_first(items: list[pytest.Item]) -> None:
    """Integration test files in the order of the seconds they last took in a fresh clone's run
    (tests/integration/seconds.json: the slowest 100 of a run, ``--durations=100``, per file), then by their number
    of tests. ``make test`` hands whole files to two workers in
    this order (``--dist loadfile --no-loadscope-reorder``), so the longest start first and no long file is left
    to run alone at the end while the other worker idles."""
    import json

    seconds = json.loads((ROOT / "tests" / "integration" / "seconds.json").read_text())
    files = [Path(str(item.fspath)) for item in items]
    counts = {f: files.count(f) for f in set(files)}
    order = {id(item): (-seconds.get(f.name, 0), -counts[f], f.name) if "integration" in f.parts else (1, 0, "")
             for item, f in zip(items, files, strict=True)}
    items.sort(key=lambda item: order[id(item)])  # stable: a file's tests keep their order, the unit tests theirs


@pytest.fixture(scope="session")
def services_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("services")


@pytest.fixture(scope="session")
def kafka(services_dir: Path) -> Iterator[KafkaBroker]:
    broker = KafkaBroker(services_dir / "kafka").start()
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def minio(services_dir: Path) -> Iterator[MinioServer]:
    server = MinioServer(services_dir / "minio").start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def schema_registry(services_dir: Path) -> Iterator[SchemaRegistry]:
    """Apicurio Registry 3.0.9 (its Confluent-compatible API: ``schema_registry.url``), storage in memory."""
    registry = SchemaRegistry(services_dir / "registry").start()
    yield registry
    registry.stop()


@pytest.fixture(scope="session")
def iceberg_rest(services_dir: Path, minio: MinioServer) -> Iterator[IcebergRestCatalog]:
    """Apache Iceberg 1.11's REST catalog server on loopback (shale.dev.iceberg_rest), its warehouse in a bucket of
    the session's MinIO. A server that cannot start raises here, and every test that needs it errors."""
    minio.create_bucket("iceberg-rest")
    catalog = IcebergRestCatalog(services_dir / "iceberg-rest", "s3://iceberg-rest/warehouse", minio.endpoint,
                                 minio.access_key, minio.secret_key).start()
    yield catalog
    catalog.stop()


@pytest.fixture(scope="session")
def nessie(services_dir: Path, minio: MinioServer) -> Iterator[NessieServer]:
    """Project Nessie 0.99.0, a production Iceberg REST catalog, on loopback (shale.dev.nessie), its warehouse in a
    bucket of the session's MinIO. A server that cannot start raises here, and every test that needs it errors."""
    minio.create_bucket("nessie")
    server = NessieServer(services_dir / "nessie", "s3://nessie/warehouse", minio.endpoint, minio.access_key,
                          minio.secret_key).start()
    yield server
    server.stop()


@pytest.fixture
def minio_bucket(minio: MinioServer) -> BucketConfig:
    """A fresh, empty MinIO bucket for one test."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    minio.create_bucket(name)
    return BucketConfig(url=f"s3://{name}", endpoint=minio.endpoint, access_key_id=minio.access_key,
                        secret_access_key=minio.secret_key, allow_http=True)


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    from shale.dev.fetch import iceberg_jars
    from shale.spark import spark_session

    # One SparkContext per test process: it carries the Kafka connector and Iceberg's runtime (test_iceberg reads
    # the published tables through it, its catalog set at run time) with Iceberg's SQL extensions (its stored
    # procedures: test_iceberg_maintenance).
    jars = ",".join([connector_conf()["spark.jars"], *(str(p) for p in iceberg_jars())])
    extensions = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
    session = spark_session("shale-tests", SparkConfig(master="local[2]", conf={
        "spark.jars": jars, "spark.sql.extensions": extensions}))
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spark_cluster(services_dir: Path) -> Iterator[SparkStandalone]:
    """A Spark standalone master and two one-core workers, each its own JVM (see shale.dev.spark_cluster). Tests
    that kill a worker restart it with ``ensure_workers``. A test process can hold one SparkContext at a time, so
    tests on the cluster run their Spark applications as ``shale`` commands in their own processes."""
    cluster = SparkStandalone(services_dir / "spark", workers=2).start()
    yield cluster
    cluster.stop()


@pytest.fixture
def output_dir(request: pytest.FixtureRequest) -> Path:
    """A folder kept after the run (screenshots, reports): test-output/<test name>/."""
    path = ROOT / "test-output" / request.node.name.replace("/", "_")
    path.mkdir(parents=True, exist_ok=True)
    return path
