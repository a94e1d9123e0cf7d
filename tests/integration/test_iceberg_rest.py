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

import decimal
import json
import os
import re
import subprocess
import sys
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from tests.iceberg_helpers import (
    HOUR,
    IDS,
    T0,
    commit,
    compact,
    record_type_blocks,
    typed_block,
    v1_columns,
    v2_columns,
)

from shale.compactor.merge import merge_blocks
from shale.config import BucketConfig, ShaleConfig
from shale.dev import MinioServer
from shale.dev.fetch import fetch_duckdb
from shale.dev.iceberg_rest import IcebergRestCatalog
from shale.iceberg import IcebergPublisher, open_catalog, spark_catalog_conf
from shale.iceberg.catalog import SUMMARY_INDEX
from shale.iceberg.publisher import RETRIES
from shale.metastore import MetastoreService, ReplaceBlocks, SingleNodeLog, StateMachine
from shale.objstore import open_bucket
from shale.query import Query, run_query

ROOT = Path(__file__).resolve().parents[2]
TYPED, ORDERS = "typed", "orders"
RECORDS, SHOP = "default", "shop"
CREDENTIAL = "shale-publisher:rest-secret-5c1e"
LEVELS = ("info", "warn", "error")
END = T0 + 10 * HOUR
SPARK_CATALOG = "shale_rest"


def _config(bucket: BucketConfig, catalog: IcebergRestCatalog, work: Path) -> ShaleConfig:
    return ShaleConfig.model_validate({
        "bucket": bucket.model_dump(), "metastore": {"data_dir": str(work / "metastore")},
        "iceberg": {"enabled": True, "catalog": "rest", "catalog_uri": catalog.url, "credential": CREDENTIAL,
                    "oauth2_server_uri": f"{catalog.url}/v1/oauth/tokens"}})


def _with_level(columns: dict[str, pa.Array], start: int) -> dict[str, pa.Array]:
    return {**columns, "level": pa.array([LEVELS[o % 3] for o in range(start, start + len(columns["big"]))])}


class World:
    def __init__(self, config: ShaleConfig, work: Path) -> None:
        self.config = config
        self.bucket = open_bucket(config.bucket)
        self.state = StateMachine(work / "metastore" / "state.db")
        self.service = MetastoreService(self.state, SingleNodeLog(self.state))
        self.publisher = IcebergPublisher(config, self.state.reader, self.service.submit, self.bucket)


@pytest.fixture(scope="module")
def world(minio: MinioServer, iceberg_rest: IcebergRestCatalog, tmp_path_factory: pytest.TempPathFactory) -> World:
    name = f"rest-{uuid.uuid4().hex[:10]}"
    minio.create_bucket(name)
    bucket = BucketConfig(url=f"s3://{name}", endpoint=minio.endpoint, access_key_id=minio.access_key,
                          secret_access_key=minio.secret_key, allow_http=True)
    work = tmp_path_factory.mktemp("rest")
    return World(_config(bucket, iceberg_rest, work), work)


# -- the questions, answered by shale query ------------------------------------------------------------------------

def _micros(column: pa.ChunkedArray) -> list[int | None]:
    return column.cast(pa.timestamp("us")).cast(pa.int64()).to_pylist()


def _answers_from_rows(rows: list[dict[str, Any]], order: list[dict[str, Any]],
                       refund: list[dict[str, Any]], evolved: bool) -> dict[str, Any]:
    """Plain answers (decimals as text, times as microseconds) from rows already holding micros in ``placed_us`` and
    ``event_us``."""
    rows = sorted(rows, key=lambda r: r["offset"])
    sums: dict[str, decimal.Decimal | None] = defaultdict(lambda: None)
    for r in rows:
        if r.get("amount") is not None:
            sums[r["level"]] = (sums[r["level"]] or decimal.Decimal(0)) + decimal.Decimal(str(r["amount"]))
    return {
        "count": len(rows),
        "amount_by_level": {level: None if s is None else str(s) for level, s in sorted(sums.items())},
        "times": [[r["offset"], r["placed_us"], r["event_us"]] for r in rows],
        "nested": [[r["offset"], r["city"], r["zip"]] for r in rows],
        "versions": [[r["offset"], r["qty"], r["ratio"], *([r.get("note")] if evolved else [])] for r in rows],
        "orders": sorted([r["id"], r["amount"]] for r in order),
        "refunds": sorted([r["id"], r["why"]] for r in refund),
    }


def shale_answers(w: World, evolved: bool) -> dict[str, Any]:
    def query(tenant: str, selector: str) -> pa.Table:
        return run_query(Query(tenant, 0, END, selector), w.service, w.bucket).read_all()

    orders = query(TYPED, f'{{topic="{ORDERS}"}}')
    rows = orders.to_pylist()
    for r, placed, event in zip(rows, _micros(orders.column("placed")), _micros(orders.column("event_time")),
                                strict=True):
        r.update(placed_us=placed, event_us=event, city=r["address"]["city"], zip=r["address"]["zip"])
    return _answers_from_rows(rows, query(RECORDS, f'{{topic="{SHOP}", record="shop.Order"}}').to_pylist(),
                              query(RECORDS, f'{{topic="{SHOP}", record="shop.Refund"}}').to_pylist(), evolved)


# -- ... by engines reading through the catalog ----------------------------------------------------------------------

def _sql(table: str, order: str, refund: str, quote: str, micros: str, evolved: bool) -> dict[str, str]:
    """The questions in SQL; ``note`` exists once the schema has evolved (version 2 added it)."""
    q = quote
    note = ", note" if evolved else ""
    return {
        "count": f"SELECT count(*) FROM {table}",
        "amount_by_level": f"SELECT level, sum(amount) FROM {table} GROUP BY level",
        "times": f"SELECT {q}offset{q}, {micros}(placed), {micros}(event_time) FROM {table} ORDER BY {q}offset{q}",
        "nested": f"SELECT {q}offset{q}, address.city, address.zip FROM {table} ORDER BY {q}offset{q}",
        "versions": f"SELECT {q}offset{q}, qty, ratio{note} FROM {table} ORDER BY {q}offset{q}",
        "orders": f"SELECT id, amount FROM {order} ORDER BY id",
        "refunds": f"SELECT id, why FROM {refund} ORDER BY id",
    }


def _plain(answers: dict[str, list[list[Any]]]) -> dict[str, Any]:
    def text(value: Any) -> Any:
        return None if value is None else str(value)

    return {
        "count": answers["count"][0][0],
        "amount_by_level": {level: text(s) for level, s in sorted(answers["amount_by_level"])},
        **{k: [list(r) for r in answers[k]] for k in ("times", "nested", "versions")},
        "orders": sorted([r[0], r[1]] for r in answers["orders"]),
        "refunds": sorted([r[0], r[1]] for r in answers["refunds"]),
    }


def spark_answers(spark: Any, evolved: bool) -> dict[str, Any]:
    c = SPARK_CATALOG
    sql = _sql(f"{c}.{TYPED}.{ORDERS}", f"{c}.`{RECORDS}`.{SHOP}__shop_Order",
               f"{c}.`{RECORDS}`.{SHOP}__shop_Refund", "`", "unix_micros", evolved)
    return _plain({name: [list(row) for row in spark.sql(text).collect()] for name, text in sql.items()})


def _duckdb(w: World, catalog: IcebergRestCatalog, queries: dict[str, str]) -> dict[str, list[list[Any]]]:
    bucket = w.config.bucket
    client_id, client_secret = CREDENTIAL.split(":", 1)
    spec = {"catalog": catalog.url, "client_id": client_id, "client_secret": client_secret,
            "s3": {"endpoint": bucket.endpoint.removeprefix("http://"), "key_id": bucket.access_key_id,
                   "secret": bucket.secret_access_key.get_secret_value(), "region": bucket.region},
            "queries": queries}
    script = ROOT / "src" / "shale" / "dev" / "duckdb_iceberg.py"
    done = subprocess.run([str(fetch_duckdb()), str(script)], input=json.dumps(spec), capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    assert bucket.secret_access_key.get_secret_value() not in done.stderr
    result: dict[str, list[list[Any]]] = json.loads(done.stdout)
    return result


def duckdb_answers(w: World, catalog: IcebergRestCatalog, evolved: bool) -> dict[str, Any]:
    return _plain(_duckdb(w, catalog, _sql(f"shale.{TYPED}.{ORDERS}", f'shale."{RECORDS}".{SHOP}__shop_Order',
                                           f'shale."{RECORDS}".{SHOP}__shop_Refund', '"', "epoch_us", evolved)))


TYPED_COLUMNS = ("amount", "placed", "event_time", "big", "attrs", "tags", "address", "qty", "ratio")


def engine_types(w: World, spark: Any, catalog: IcebergRestCatalog) -> dict[str, dict[str, str]]:
    """The type each engine shows for the typed columns (docs/DESIGN.md 16.8 lists them)."""
    spark_types = dict(spark.table(f"{SPARK_CATALOG}.{TYPED}.{ORDERS}").dtypes)
    duck = _duckdb(w, catalog, {"types": f"DESCRIBE shale.{TYPED}.{ORDERS}"})
    duck_types = {row[0]: row[1] for row in duck["types"]}
    schema = open_catalog(w.config).load_table((TYPED, ORDERS)).scan().to_polars().schema
    return {c: {"iceberg": str(open_catalog(w.config).load_table((TYPED, ORDERS)).schema().find_field(c).field_type),
                "spark": spark_types[c], "duckdb": duck_types[c], "polars": str(schema[c])} for c in TYPED_COLUMNS}


def polars_answers(config: ShaleConfig, evolved: bool) -> dict[str, Any]:
    import polars as pl

    catalog = open_catalog(config)

    def frame(*name: str) -> pl.DataFrame:
        return catalog.load_table(name).scan().to_polars()

    orders = frame(TYPED, ORDERS).with_columns(
        placed_us=pl.col("placed").dt.epoch("us"), event_us=pl.col("event_time").dt.epoch("us"),
        city=pl.col("address").struct.field("city"), zip=pl.col("address").struct.field("zip"))
    order = frame(RECORDS, f"{SHOP}__shop_Order")
    refund = frame(RECORDS, f"{SHOP}__shop_Refund")
    sums = orders.group_by("level").agg(pl.col("amount").sum().alias("s")).sort("level")
    rows = orders.sort("offset")
    return {
        "count": orders.height,
        "amount_by_level": {r["level"]: None if r["s"] is None else str(r["s"]) for r in sums.iter_rows(named=True)},
        "times": [list(r) for r in rows.select("offset", "placed_us", "event_us").iter_rows()],
        "nested": [list(r) for r in rows.select("offset", "city", "zip").iter_rows()],
        "versions": [list(r) for r in rows.select("offset", "qty", "ratio", *["note"][:evolved]).iter_rows()],
        "orders": sorted(list(r) for r in order.select("id", "amount").iter_rows()),
        "refunds": sorted(list(r) for r in refund.select("id", "why").iter_rows()),
    }


def _agree(w: World, spark: Any, catalog: IcebergRestCatalog, stage: str, evolved: bool) -> dict[str, Any]:
    w.publisher.sync()
    expected = shale_answers(w, evolved)
    assert expected["count"] > 0, stage
    for engine, answers in (("spark", spark_answers(spark, evolved)), ("duckdb", duckdb_answers(w, catalog, evolved)),
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
    first = [typed_block(w.bucket, TYPED, ORDERS, s, 3, _with_level(v1_columns(s, 3), s)) for s in (0, 3)]
    for block in first:
        commit(w.service, [block])
    kinds = [record_type_blocks(w.config, w.bucket, 0, 3), record_type_blocks(w.config, w.bucket, 3, 6)]
    for blocks in kinds:
        commit(w.service, blocks)
    before = _agree(w, spark, iceberg_rest, "version 1", evolved=False)
    assert before["count"] == 6
    assert before["amount_by_level"] == {"error": "7.50", "info": "3.50", "warn": "5.50"}
    assert len(_one_snapshot_per_change(w, TYPED, ORDERS)) == 2
    assert len(_one_snapshot_per_change(w, RECORDS, f"{SHOP}__shop_Order")) == 2

    commit(w.service, [typed_block(w.bucket, TYPED, ORDERS, 6, 3, _with_level(v2_columns(6, 3), 6))])
    evolved = _agree(w, spark, iceberg_rest, "after an evolution", evolved=True)
    assert evolved["count"] == 9
    assert [r[3] for r in evolved["versions"]] == [None] * 6 + ["n6", "n7", "n8"]  # each version's rows
    assert [r[1] for r in evolved["versions"]][-1] == 2**40 + 8  # int -> long widened, the new value exact
    types = engine_types(w, spark, iceberg_rest)
    (output_dir / "types.json").write_text(json.dumps(types, indent=1))
    assert types["amount"]["spark"] == "decimal(10,2)"
    assert types["amount"]["duckdb"] == "DECIMAL(10,2)"
    assert types["big"]["iceberg"] == "decimal(20, 0)"

    compact(w.service, w.bucket, first)
    merged = merge_blocks(w.bucket, [m for blocks in kinds for m in blocks], job="rest", token=1, level=0).output
    w.service.submit(ReplaceBlocks(tenant=RECORDS, sources=[m.id for blocks in kinds for m in blocks],
                                   blocks=[merged])).raise_for_rejection()
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
    commit(w.service, [typed_block(w.bucket, TYPED, ORDERS, 9, 2, _with_level(v2_columns(9, 2), 9))])
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
