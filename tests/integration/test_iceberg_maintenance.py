"""A user's standard Iceberg maintenance and another engine's row-level DELETE on a table Shale owns, with the real
engines through the real REST catalog (Apache Iceberg 1.11's server on loopback, warehouse and Shale's bucket on
MinIO): what each does, and that none deletes or changes a file Shale still needs.

* Spark (Iceberg 1.11's runtime and SQL extensions): ``expire_snapshots`` and ``remove_orphan_files`` are refused
  (the table's ``gc.enabled=false``); ``rewrite_manifests`` changes no row and Shale publishes on top of it;
  ``rewrite_data_files`` writes new files under the table's location in place of Shale's, deleting none: the
  publisher finds that snapshot at its next change and stops writing the table (leaving it current, named in its
  status), until the table is rolled back to Shale's snapshot and a full sync repairs it.
* DuckDB 1.5.5 (its Iceberg extension): ``DELETE`` writes position-delete files; the publisher stops writing that
  table the same way, every engine reading the table sees the delete, and ``shale query`` still serves every row.

Shale's bucket holds exactly the same objects before and after every one of these."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from tests.iceberg_helpers import HOUR, T0, commit, duckdb_catalog_queries, query_rows, write_records_block

from shale.config import BucketConfig, ShaleConfig
from shale.dev import MinioServer
from shale.dev.iceberg_rest import IcebergRestCatalog
from shale.iceberg import IcebergPublisher, open_catalog, spark_catalog_conf
from shale.iceberg.catalog import SUMMARY_INDEX
from shale.iceberg.publisher import STOPPED
from shale.metastore import MetastoreService, SingleNodeLog, StateMachine
from shale.objstore import Bucket, open_bucket

ROOT = Path(__file__).resolve().parents[2]
CREDENTIAL = "shale-publisher:maint-secret-7a2d"
CATALOG = "shale_maint"
TENANT = "acme"
FAR = "TIMESTAMP '2999-01-01 00:00:00'"


class World:
    def __init__(self, config: ShaleConfig, work: Path) -> None:
        self.config = config
        self.bucket = open_bucket(config.bucket)
        state = StateMachine(work / "metastore" / "state.db")
        self.service = MetastoreService(state, SingleNodeLog(state))
        self.publisher = IcebergPublisher(config, state.reader, self.service.submit, self.bucket)

    def publish(self, topic: str, start: int, count: int) -> None:
        """A block of ``count`` records of ``topic`` committed; the publisher's next round publishes it."""
        commit(self.service, [write_records_block(self.bucket, TENANT, topic, 0, start, count,
                                                  T0 + start * 1000)])

    def shale_count(self, topic: str) -> int:
        return sum(query_rows(self.service, self.bucket, TENANT, topic, 0, T0 + HOUR).values())

    def own_snapshot(self, topic: str) -> int:
        table = open_catalog(self.config).load_table((TENANT, topic))
        snapshot = table.current_snapshot()
        assert SUMMARY_INDEX in snapshot.summary.additional_properties
        return int(snapshot.snapshot_id)


@pytest.fixture(scope="module")
def world(minio: MinioServer, iceberg_rest: IcebergRestCatalog, tmp_path_factory: pytest.TempPathFactory) -> World:
    name = f"maint-{uuid.uuid4().hex[:10]}"
    minio.create_bucket(name)
    bucket = BucketConfig(url=f"s3://{name}", endpoint=minio.endpoint, access_key_id=minio.access_key,
                          secret_access_key=minio.secret_key, allow_http=True)
    work = tmp_path_factory.mktemp("maint")
    config = ShaleConfig.model_validate({
        "bucket": bucket.model_dump(), "metastore": {"data_dir": str(work / "metastore")},
        "iceberg": {"enabled": True, "catalog": "rest", "catalog_uri": iceberg_rest.url, "credential": CREDENTIAL,
                    "oauth2_server_uri": f"{iceberg_rest.url}/v1/oauth/tokens"}})
    return World(config, work)


@pytest.fixture(scope="module")
def maint_spark(spark: Any, world: World) -> Any:
    for key, value in spark_catalog_conf(world.config, CATALOG).items():
        spark.conf.set(key, value)
    return spark


def _objects(bucket: Bucket) -> dict[str, str]:
    return {o.key: o.etag for o in bucket.list("")}


def _spark_count(spark: Any, topic: str) -> int:
    return int(spark.sql(f"SELECT count(*) AS n FROM {CATALOG}.{TENANT}.{topic}").first().n)


def _call(spark: Any, procedure: str, args: str) -> list[Any]:
    return list(spark.sql(f"CALL {CATALOG}.system.{procedure}({args})").collect())


def test_spark_maintenance_procedures_on_a_shale_table(world: World, maint_spark: Any) -> None:
    w, spark, topic = world, maint_spark, "maint"
    for i in range(3):
        w.publish(topic, i * 10, 10)
    w.publisher.sync()
    objects = _objects(w.bucket)
    assert _spark_count(spark, topic) == w.shale_count(topic) == 30
    table = f"'{TENANT}.{topic}'"

    # Refused: both would delete files, and the table says Iceberg must not (gc.enabled=false).
    with pytest.raises(Exception, match="GC is disabled") as expired:
        _call(spark, "expire_snapshots", f"table => {table}, older_than => {FAR}, retain_last => 1")
    with pytest.raises(Exception, match="GC is disabled") as orphans:
        _call(spark, "remove_orphan_files", f"table => {table}")
    with pytest.raises(Exception, match="GC is disabled"):
        _call(spark, "remove_orphan_files", f"table => {table}, dry_run => true")
    refusals = {name: next(line for line in str(e.value).splitlines() if "GC is disabled" in line)
                for name, e in (("expire_snapshots", expired), ("remove_orphan_files", orphans))}

    # rewrite_manifests: the same rows in other manifests; Shale publishes on top of it.
    _call(spark, "rewrite_manifests", table)
    w.publish(topic, 30, 10)
    assert w.publisher.run_once() == 1
    assert w.publisher.status()["stopped_tables"] == []
    assert _spark_count(spark, topic) == w.shale_count(topic) == 40
    own = w.own_snapshot(topic)

    # rewrite_data_files: Shale's four files replaced in the table by one of Spark's, under the table's location.
    rewrite = _call(spark, "rewrite_data_files", f"table => {table}, options => map('min-input-files', '2')")
    assert rewrite[0].rewritten_data_files_count == 4
    assert rewrite[0].added_data_files_count == 1
    files = [r.file_path for r in spark.sql(f"SELECT file_path FROM {CATALOG}.{TENANT}.{topic}.files").collect()]
    assert len(files) == 1
    assert not files[0].startswith(w.config.bucket.url)  # not in Shale's bucket: the table's location
    assert _spark_count(spark, topic) == 40
    rewritten = open_catalog(w.config).load_table((TENANT, topic)).current_snapshot().snapshot_id

    w.publish(topic, 40, 10)
    assert w.publisher.run_once() == 0  # not committed over the rewrite
    stopped = w.publisher.status()["stopped_tables"]
    assert len(stopped) == 1
    assert str(rewritten) in stopped[0]
    assert "replace, spark" in stopped[0]
    assert STOPPED._value.get() == 1
    assert open_catalog(w.config).load_table((TENANT, topic)).current_snapshot().snapshot_id == rewritten
    assert _spark_count(spark, topic) == 40
    assert w.shale_count(topic) == 50  # shale query serves every row all along

    # Shale's bucket: every object as it was (one more block, nothing deleted or rewritten).
    now = _objects(w.bucket)
    assert {k: now[k] for k in objects} == objects
    assert len(now) > len(objects)

    # The owner hands the table back: rolled back to Shale's snapshot, then a full sync repairs it.
    _call(spark, "rollback_to_snapshot", f"{table}, {own}")
    assert w.publisher.sync(full=True)["repaired"] == 1
    assert w.publisher.status()["stopped_tables"] == []
    assert _spark_count(spark, topic) == w.shale_count(topic) == 50
    snapshots = open_catalog(w.config).load_table((TENANT, topic)).snapshots()
    assert rewritten in {s.snapshot_id for s in snapshots}  # the rewrite's snapshot is kept, not current
    out = ROOT / "test-output" / "test_spark_maintenance_procedures_on_a_shale_table"
    out.mkdir(parents=True, exist_ok=True)
    (out / "what-happened.json").write_text(json.dumps({**refusals, "stopped": stopped[0]}, indent=1))


def _duckdb(w: World, catalog: IcebergRestCatalog, queries: dict[str, str]) -> dict[str, list[list[Any]]]:
    return duckdb_catalog_queries(w.config.bucket, catalog.url, CREDENTIAL, queries)


def test_a_duckdb_delete_stops_publishing_that_table_and_deletes_nothing_of_shale(
        world: World, maint_spark: Any, iceberg_rest: IcebergRestCatalog) -> None:
    w, spark, topic = world, maint_spark, "deleted"
    for i in range(2):
        w.publish(topic, i * 10, 10)
    w.publisher.sync()
    objects = _objects(w.bucket)
    name = f"shale.{TENANT}.{topic}"
    deleted = _duckdb(w, iceberg_rest, {"delete": f'DELETE FROM {name} WHERE "offset" < 5'})
    assert deleted["delete"] == [[5]]
    snapshot = open_catalog(w.config).load_table((TENANT, topic)).current_snapshot()
    summary = snapshot.summary.additional_properties
    assert (summary["added-delete-files"], summary["added-position-deletes"]) == ("1", "5")  # one position-delete file

    w.publish(topic, 20, 10)
    w.publisher.run_once()
    stopped = [m for m in w.publisher.status()["stopped_tables"] if f"{TENANT}.{topic} " in m]
    assert len(stopped) == 1
    assert str(snapshot.snapshot_id) in stopped[0]
    assert "delete file" in stopped[0]
    table = open_catalog(w.config).load_table((TENANT, topic))
    assert table.current_snapshot().snapshot_id == snapshot.snapshot_id  # DuckDB's delete stays current
    assert _duckdb(w, iceberg_rest, {"n": f"SELECT count(*) FROM {name}"})["n"] == [[15]]
    assert _spark_count(spark, topic) == 15  # Spark applies DuckDB's position deletes
    assert w.shale_count(topic) == 30
    now = _objects(w.bucket)
    assert {k: now[k] for k in objects} == objects  # nothing of Shale deleted or changed
    out = ROOT / "test-output" / "test_a_duckdb_delete_stops_publishing_that_table_and_deletes_nothing_of_shale"
    out.mkdir(parents=True, exist_ok=True)
    (out / "stopped.txt").write_text(stopped[0] + "\n")
