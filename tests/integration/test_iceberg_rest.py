"""Iceberg tables published through a real REST catalog (Apache Iceberg 1.11's ``RESTCatalogServer`` on loopback,
warehouse on MinIO, an OAuth2 client credential exchanged for a token) and read by three engines through that
catalog: Spark SQL (Iceberg's REST catalog), DuckDB 1.5.5 with its Iceberg extension (its own environment, a
subprocess) and Polars (a pyiceberg scan). Each answers the same questions as ``shale query`` over the same blocks,
value for value: the row count, a decimal summed per level, timestamps, a nested field, every row's typed columns
of each schema version, and a record-type table's rows, before and after a schema evolution and a compaction. A
second Shale process, in another working directory with no file of the first, reads the tables through the catalog;
a commit conflict (another writer advancing the table between Shale's load and its commit: HTTP 409) costs a retry
and no duplicate snapshot."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from tests.iceberg_helpers import IDS, commit, typed_block, v2_columns
from tests.iceberg_questions import (
    CREDENTIAL,
    ORDERS,
    RECORDS,
    SHOP,
    TYPED,
    World,
    duckdb_answers,
    duckdb_types,
    iceberg_and_polars_types,
    plain,
    polars_answers,
    questions_sql,
    rest_config,
    shale_answers,
    with_level,
)

from shale.config import BucketConfig
from shale.dev import MinioServer
from shale.dev.iceberg_rest import IcebergRestCatalog
from shale.iceberg import open_catalog, spark_catalog_conf
from shale.iceberg.catalog import SUMMARY_INDEX
from shale.iceberg.publisher import RETRIES

ROOT = Path(__file__).resolve().parents[2]
SPARK_CATALOG = "shale_rest"


@pytest.fixture(scope="module")
def world(minio: MinioServer, iceberg_rest: IcebergRestCatalog, tmp_path_factory: pytest.TempPathFactory) -> World:
    name = f"rest-{uuid.uuid4().hex[:10]}"
    minio.create_bucket(name)
    bucket = BucketConfig(url=f"s3://{name}", endpoint=minio.endpoint, access_key_id=minio.access_key,
                          secret_access_key=minio.secret_key, allow_http=True)
    work = tmp_path_factory.mktemp("rest")
    return World(rest_config(bucket, iceberg_rest.url, work), work)


def spark_answers(spark: Any, evolved: bool) -> dict[str, Any]:
    c = SPARK_CATALOG
    sql = questions_sql(f"{c}.{TYPED}.{ORDERS}", f"{c}.`{RECORDS}`.{SHOP}__shop_Order",
                        f"{c}.`{RECORDS}`.{SHOP}__shop_Refund", "`", "unix_micros({})", evolved)
    return plain({name: [list(row) for row in spark.sql(text).collect()] for name, text in sql.items()})


def engine_types(w: World, spark: Any, catalog: IcebergRestCatalog) -> dict[str, dict[str, str]]:
    """The type each engine shows for the typed columns (docs/design/iceberg.md 16.8 lists them)."""
    spark_types = dict(spark.table(f"{SPARK_CATALOG}.{TYPED}.{ORDERS}").dtypes)
    duck = duckdb_types(w, catalog.url)
    return {c: {**t, "spark": spark_types[c], "duckdb": duck[c]}
            for c, t in iceberg_and_polars_types(w.config).items() }


def _agree(w: World, spark: Any, catalog: IcebergRestCatalog, stage: str, evolved: bool) -> dict[str, Any]:
    w.publisher.sync()
    expected = shale_answers(w, evolved)
    assert expected["count"] > 0, stage
    for engine, answers in (("spark", spark_answers(spark, evolved)),
                            ("duckdb", duckdb_answers(w, catalog.url, evolved)),
                            ("polars", polars_answers(w.config, evolved))):
        for question, value in expected.items():
            assert answers[question] == value, f"{stage}: {engine} differs from shale query on {question}"
    return expected


def _one_snapshot_per_change(w: World, *name: str) -> list[int]:
    table = open_catalog(w.config).load_table(name)
    indexes = [int(s.summary.additional_properties[SUMMARY_INDEX]) for s in table.snapshots()]
    assert indexes == sorted(set(indexes))
    return indexes


def test_spark_duckdb_and_polars_agree_with_shale_query_through_the_rest_catalog(
        world: World, spark: Any, iceberg_rest: IcebergRestCatalog, output_dir: Path) -> None:
    w = world
    for key, value in spark_catalog_conf(w.config, SPARK_CATALOG).items():
        spark.conf.set(key, value)
    w.version_1()
    before = _agree(w, spark, iceberg_rest, "version 1", evolved=False)
    assert before["count"] == 6
    assert before["amount_by_level"] == {"error": "7.50", "info": "3.50", "warn": "5.50"}
    assert len(_one_snapshot_per_change(w, TYPED, ORDERS)) == 2
    assert len(_one_snapshot_per_change(w, RECORDS, f"{SHOP}__shop_Order")) == 2

    w.evolve()
    evolved = _agree(w, spark, iceberg_rest, "after an evolution", evolved=True)
    assert evolved["count"] == 9
    assert [r[3] for r in evolved["versions"]] == [None] * 6 + ["n6", "n7", "n8"]  # each version's rows
    assert [r[1] for r in evolved["versions"]][-1] == 2**40 + 8  # int -> long widened, the new value exact
    types = engine_types(w, spark, iceberg_rest)
    (output_dir / "types.json").write_text(json.dumps(types, indent=1))
    assert types["amount"]["spark"] == "decimal(10,2)"
    assert types["amount"]["duckdb"] == "DECIMAL(10,2)"
    assert types["big"]["iceberg"] == "decimal(20, 0)"

    w.compact_all()
    compacted = _agree(w, spark, iceberg_rest, "after a compaction", evolved=True)
    assert compacted == evolved
    table = open_catalog(w.config).load_table((TYPED, ORDERS))
    assert table.current_snapshot().summary.operation.value == "overwrite"
    assert len(_one_snapshot_per_change(w, TYPED, ORDERS)) == 4  # two ingests, one evolution, one compaction
    assert table.properties["gc.enabled"] == "false"
    assert table.metadata_location.startswith("s3://iceberg-rest/warehouse/")  # the catalog's warehouse


SECOND_PROCESS = """
import json, sys
from shale.config import load_config
from shale.iceberg import open_catalog
catalog = open_catalog(load_config(sys.argv[1]))
out = {}
for namespace in ("typed", "default"):
    for name in sorted(catalog.list_tables(namespace)):
        table = catalog.load_table(name).scan().to_arrow()
        out[".".join(name)] = sorted(table.column("offset").to_pylist())
print(json.dumps(out))
"""


def test_a_second_shale_process_elsewhere_reads_the_tables_through_the_catalog(
        world: World, tmp_path: Path) -> None:
    """Another "machine": a fresh working directory holding only a configuration (the catalog's URL and credential,
    the bucket), no metastore, no catalog file; it finds every table through the REST catalog."""
    w = world
    assert open_catalog(w.config).list_tables(TYPED), "run after the engines test (it publishes the tables)"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    config = elsewhere / "shale.toml"
    bucket = w.config.bucket
    config.write_text(
        f'[bucket]\nurl = "{bucket.url}"\nendpoint = "{bucket.endpoint}"\nallow_http = true\n'
        f'access_key_id = "{bucket.access_key_id}"\n'
        f'[iceberg]\ncatalog = "rest"\ncatalog_uri = "{w.config.iceberg.catalog_uri}"\n'
        f'oauth2_server_uri = "{w.config.iceberg.oauth2_server_uri}"\n')
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SHALE_")},
           "SHALE_ICEBERG__CREDENTIAL": CREDENTIAL,
           "SHALE_BUCKET__SECRET_ACCESS_KEY": bucket.secret_access_key.get_secret_value(),
           "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, "-c", SECOND_PROCESS, str(config)], cwd=elsewhere, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in elsewhere.iterdir()) == ["shale.toml"]  # it kept nothing of its own
    seen = json.loads(done.stdout)
    here = open_catalog(w.config)
    assert seen == {".".join(n): sorted(here.load_table(n).scan().to_arrow().column("offset").to_pylist())
                    for ns in (TYPED, RECORDS) for n in sorted(here.list_tables(ns))}
    assert len(seen["typed.orders"]) == 9
    assert set(seen) == {"typed.orders", *(f"default.shop__{k.replace('.', '_')}" for k in IDS)}


def test_a_commit_conflict_through_rest_is_retried_without_a_duplicate_snapshot(world: World) -> None:
    """Another writer advances the table between Shale's load and its commit: the REST catalog answers 409, the
    publisher reloads the table, plans the change again, and the change is one snapshot."""
    w = world
    w.publisher.sync()  # the publisher holds the table as loaded
    other = open_catalog(w.config).load_table((TYPED, ORDERS))
    with other.transaction() as tx, tx.update_snapshot(snapshot_properties={"writer": "other"}).fast_append():
        pass
    commit(w.service, [typed_block(w.bucket, TYPED, ORDERS, 9, 2, with_level(v2_columns(9, 2), 9))])
    retries = RETRIES._value.get()
    assert w.publisher.run_once() == 1
    assert RETRIES._value.get() == retries + 1  # one 409, one retry
    table = open_catalog(w.config).load_table((TYPED, ORDERS))
    summaries = [s.summary.additional_properties for s in table.snapshots()]
    assert summaries[-2].get("writer") == "other"
    published = [int(s[SUMMARY_INDEX]) for s in summaries if SUMMARY_INDEX in s]
    assert published == sorted(set(published))  # no entry twice
    assert sorted(table.scan().to_arrow().column("offset").to_pylist()) == list(range(11))


def test_the_catalog_server_listens_on_loopback_only(iceberg_rest: IcebergRestCatalog) -> None:
    assert iceberg_rest.process is not None
    listening = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, check=True).stdout
    ours = [line for line in listening.splitlines() if f":{iceberg_rest.port} " in line]
    assert ours, listening
    # Java shows an IPv4 socket as IPv4-mapped: [::ffff:127.0.0.1]:PORT; never 0.0.0.0, * or [::]
    assert all(re.search(rf"\s(\[::ffff:)?127\.0\.0\.1\]?:{iceberg_rest.port}\s", line) for line in ours), ours
