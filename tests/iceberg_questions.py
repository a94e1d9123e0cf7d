"""The typed tables published through an Iceberg REST catalog, and the questions every engine reading them answers
as ``shale query`` does (tests/integration/test_iceberg_rest.py asks Spark, DuckDB and Polars; bench/interop.py asks
Trino and ClickHouse): the row count, a decimal summed per level, timestamps as microseconds, a nested field, every
row's typed columns of each schema version, and a record-type table's rows.

The tables are built in three changes, each one step of a table's life: ``version_1`` (two blocks of the typed topic
at schema version 1, two chunks of a topic of several record types), ``evolve`` (a block at version 2: a column
dropped, two widened, a struct field added, a column added) and ``compact_all`` (every block replaced by a merged
one)."""

from __future__ import annotations

import decimal
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa

from shale.block import BlockMeta
from shale.compactor.merge import merge_blocks
from shale.config import BucketConfig, ShaleConfig
from shale.iceberg import IcebergPublisher, open_catalog
from shale.metastore import MetastoreService, ReplaceBlocks, SingleNodeLog, StateMachine
from shale.objstore import open_bucket
from shale.query import Query, run_query
from tests.iceberg_helpers import (
    HOUR,
    T0,
    commit,
    compact,
    duckdb_catalog_queries,
    record_type_blocks,
    typed_block,
    v1_columns,
    v2_columns,
)

ROOT = Path(__file__).resolve().parents[1]
TYPED, ORDERS = "typed", "orders"
RECORDS, SHOP = "default", "shop"
CREDENTIAL = "shale-publisher:rest-secret-5c1e"
LEVELS = ("info", "warn", "error")
END = T0 + 10 * HOUR
TYPED_COLUMNS = ("amount", "placed", "event_time", "big", "attrs", "tags", "address", "qty", "ratio")


def rest_config(bucket: BucketConfig, catalog_url: str, work: Path) -> ShaleConfig:
    return ShaleConfig.model_validate({
        "bucket": bucket.model_dump(), "metastore": {"data_dir": str(work / "metastore")},
        "iceberg": {"enabled": True, "catalog": "rest", "catalog_uri": catalog_url, "credential": CREDENTIAL,
                    "oauth2_server_uri": f"{catalog_url}/v1/oauth/tokens"}})


def with_level(columns: dict[str, pa.Array], start: int) -> dict[str, pa.Array]:
    return {**columns, "level": pa.array([LEVELS[o % 3] for o in range(start, start + len(columns["big"]))])}


class World:
    """An embedded metastore, its bucket and the Iceberg publisher, in ``work``."""

    def __init__(self, config: ShaleConfig, work: Path) -> None:
        self.config = config
        self.bucket = open_bucket(config.bucket)
        self.state = StateMachine(work / "metastore" / "state.db")
        self.service = MetastoreService(self.state, SingleNodeLog(self.state))
        self.publisher = IcebergPublisher(config, self.state.reader, self.service.submit, self.bucket)
        self.first: list[BlockMeta] = []
        self.kinds: list[list[BlockMeta]] = []

    def version_1(self) -> None:
        """Six records of the typed topic at schema version 1 in two blocks; six of the record-type topic in two."""
        self.first = [typed_block(self.bucket, TYPED, ORDERS, s, 3, with_level(v1_columns(s, 3), s)) for s in (0, 3)]
        for block in self.first:
            commit(self.service, [block])
        self.kinds = [record_type_blocks(self.config, self.bucket, 0, 3),
                      record_type_blocks(self.config, self.bucket, 3, 6)]
        for blocks in self.kinds:
            commit(self.service, blocks)

    def evolve(self) -> None:
        """Three more records of the typed topic, at schema version 2."""
        commit(self.service, [typed_block(self.bucket, TYPED, ORDERS, 6, 3, with_level(v2_columns(6, 3), 6))])

    def compact_all(self) -> None:
        """The typed topic's version-1 blocks merged into one; the record-type topic's blocks merged into one."""
        compact(self.service, self.bucket, self.first)
        sources = [m for blocks in self.kinds for m in blocks]
        merged = merge_blocks(self.bucket, sources, job="rest", token=1, level=0).output
        self.service.submit(ReplaceBlocks(tenant=RECORDS, sources=[m.id for m in sources],
                                          blocks=[merged])).raise_for_rejection()


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

def questions_sql(table: str, order: str, refund: str, quote: str, micros: str, evolved: bool) -> dict[str, str]:
    """The questions in SQL; ``micros`` turns a timestamp into microseconds since the epoch (``{}`` is the column);
    ``note`` exists once the schema has evolved (version 2 added it)."""
    q = quote
    note = ", note" if evolved else ""
    placed, event = micros.format("placed"), micros.format("event_time")
    return {
        "count": f"SELECT count(*) FROM {table}",
        "amount_by_level": f"SELECT level, sum(amount) FROM {table} GROUP BY level",
        "times": f"SELECT {q}offset{q}, {placed}, {event} FROM {table} ORDER BY {q}offset{q}",
        "nested": f"SELECT {q}offset{q}, address.city, address.zip FROM {table} ORDER BY {q}offset{q}",
        "versions": f"SELECT {q}offset{q}, qty, ratio{note} FROM {table} ORDER BY {q}offset{q}",
        "orders": f"SELECT id, amount FROM {order} ORDER BY id",
        "refunds": f"SELECT id, why FROM {refund} ORDER BY id",
    }


def plain(answers: dict[str, list[list[Any]]]) -> dict[str, Any]:
    """Rows of the SQL questions in the shape of ``shale_answers``."""
    def text(value: Any) -> Any:
        return None if value is None else str(value)

    return {
        "count": answers["count"][0][0],
        "amount_by_level": {level: text(s) for level, s in sorted(answers["amount_by_level"])},
        **{k: [list(r) for r in answers[k]] for k in ("times", "nested", "versions")},
        "orders": sorted([r[0], r[1]] for r in answers["orders"]),
        "refunds": sorted([r[0], r[1]] for r in answers["refunds"]),
    }


def run_duckdb(w: World, catalog_url: str, queries: dict[str, str]) -> dict[str, list[list[Any]]]:
    """DuckDB's rows for ``queries``, the catalog attached as ``shale``."""
    return duckdb_catalog_queries(w.config.bucket, catalog_url, CREDENTIAL, queries)


def duckdb_answers(w: World, catalog_url: str, evolved: bool) -> dict[str, Any]:
    return plain(run_duckdb(w, catalog_url, questions_sql(
        f"shale.{TYPED}.{ORDERS}", f'shale."{RECORDS}".{SHOP}__shop_Order', f'shale."{RECORDS}".{SHOP}__shop_Refund',
        '"', "epoch_us({})", evolved)))


def duckdb_types(w: World, catalog_url: str) -> dict[str, str]:
    rows = run_duckdb(w, catalog_url, {"types": f"DESCRIBE shale.{TYPED}.{ORDERS}"})["types"]
    return {row[0]: row[1] for row in rows}


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


def iceberg_and_polars_types(config: ShaleConfig) -> dict[str, dict[str, str]]:
    """Each typed column's Iceberg type as the table declares it, and Polars's type through pyiceberg."""
    table = open_catalog(config).load_table((TYPED, ORDERS))
    schema = table.scan().to_polars().schema
    return {c: {"iceberg": str(table.schema().find_field(c).field_type), "polars": str(schema[c])}
            for c in TYPED_COLUMNS}
