"""Typed parser columns in Iceberg tables (issue 31), through the publisher on a SQLite catalog: the table declares
each column's type, evolves by name (field ids kept) when a newer block's types change compatibly, and leaves out,
loudly, a block whose types conflict, the table staying readable."""

from __future__ import annotations

import datetime as dt
import decimal
import logging
from pathlib import Path

import pyarrow as pa
import pytest
from tests.iceberg_helpers import HOUR, T0, commit, publisher_setup, typed_block, v1_columns, v2_columns

from shale.iceberg import IcebergPublisher
from shale.iceberg.catalog import identifier
from shale.iceberg.publisher import REFUSED
from shale.metastore import MetastoreService
from shale.objstore import Bucket
from shale.query import Query, run_query

TENANT, TOPIC = "acme", "orders"
@pytest.fixture
def setup(tmp_path: Path) -> tuple[MetastoreService, IcebergPublisher, Bucket]:
    return publisher_setup(tmp_path)[1:]


def by_offset(table: pa.Table) -> dict[int, dict[str, object]]:
    return {r["offset"]: r for r in table.to_pylist()}


def test_typed_columns_evolve_compatibly_and_a_conflict_is_left_out_loudly(setup, caplog) -> None:
    service, publisher, bucket = setup
    commit(service, [typed_block(bucket, TENANT, TOPIC, 0, 3, v1_columns(0, 3))])
    assert publisher.run_once() == 1
    table = publisher.catalog.load_table(identifier(TENANT, TOPIC))
    schema = table.schema()
    assert {name: str(schema.find_field(name).field_type) for name in
            ("amount", "placed", "qty", "ratio", "big", "tags", "attrs")} == {
        "amount": "decimal(10, 2)", "placed": "timestamptz", "qty": "int", "ratio": "float",
        "big": "decimal(20, 0)", "tags": "list<string>", "attrs": "map<string, long>"}
    assert [(f.name, str(f.field_type)) for f in schema.find_field("address").field_type.fields] == [
        ("city", "string"), ("zip", "int")]
    assert all(schema.find_field(n).optional for n in ("amount", "address", "address.zip", "qty"))
    ids = {name: schema.find_field(name).field_id for name in ("qty", "ratio", "address", "address.zip", "amount")}
    rows = by_offset(table.scan().to_arrow())
    assert rows[2]["amount"] == decimal.Decimal("2.25")
    assert rows[2]["placed"] == dt.datetime(2026, 1, 1, 12, 0, 0, 2, tzinfo=dt.UTC)
    assert rows[2]["address"] == {"city": "c2", "zip": 2}
    assert rows[2]["big"] == decimal.Decimal(2**64 - 3)  # uint64, exact (a copy converted it)
    assert rows[2]["attrs"] == [("k", 2)]

    # A compatible evolution: one table, the same field ids, old and new rows typed.
    commit(service, [typed_block(bucket, TENANT, TOPIC, 3, 2, v2_columns(3, 2))])
    assert publisher.run_once() == 1
    table = publisher.catalog.load_table(identifier(TENANT, TOPIC))
    schema = table.schema()
    assert {name: schema.find_field(name).field_id for name in ids} == ids
    assert str(schema.find_field("qty").field_type) == "long"
    assert str(schema.find_field("ratio").field_type) == "double"
    assert str(schema.find_field("address.zip").field_type) == "long"
    assert str(schema.find_field("address.country").field_type) == "string"
    assert str(schema.find_field("note").field_type) == "string"
    rows = by_offset(table.scan().to_arrow())
    assert (rows[1]["qty"], rows[4]["qty"]) == (1, 2**40 + 4)
    assert (rows[1]["ratio"], rows[4]["ratio"]) == (0.25, 4 / 3)
    assert rows[1]["address"] == {"city": "c1", "zip": 1, "country": None}
    assert rows[4]["address"] == {"city": "c4", "zip": 2**40 + 4, "country": "NZ"}
    assert (rows[1]["amount"], rows[4]["amount"]) == (decimal.Decimal("1.25"), None)  # dropped: null for new rows
    assert (rows[1]["note"], rows[4]["note"]) == (None, "n4")

    # A narrower type later (long -> int) joins the wider column: read as long, exactly.
    narrow = v2_columns(5, 1) | {"qty": pa.array([5], pa.int32())}
    commit(service, [typed_block(bucket, TENANT, TOPIC, 5, 1, narrow)])
    assert publisher.run_once() == 1
    table = publisher.catalog.load_table(identifier(TENANT, TOPIC))
    assert str(table.schema().find_field("qty").field_type) == "long"
    assert by_offset(table.scan().to_arrow())[5]["qty"] == 5
    before = table.scan().to_arrow()
    schema_before = table.schema()

    # An incompatible change (qty long -> string): that block is left out, logged and counted; the table keeps
    # its schema and rows; shale query still serves the block.
    refused = REFUSED._value.get()
    broken = v2_columns(6, 2) | {"qty": pa.array(["six", "seven"], pa.string())}
    block = typed_block(bucket, TENANT, TOPIC, 6, 2, broken)
    commit(service, [block])
    with caplog.at_level(logging.ERROR, logger="shale.iceberg.publisher"):
        assert publisher.run_once() == 0
    assert REFUSED._value.get() == refused + 1
    assert publisher.status()["refused_files"] == 1
    assert any(block.id in r.getMessage() and "qty: table type long, block type string" in r.getMessage()
               for r in caplog.records)
    table = publisher.catalog.load_table(identifier(TENANT, TOPIC))
    assert table.schema() == schema_before
    assert table.scan().to_arrow().sort_by("offset").equals(before.sort_by("offset"))
    served = run_query(Query(TENANT, 0, T0 + HOUR, f'{{topic="{TOPIC}"}}'), service, bucket).read_all()
    assert sorted(served.column("offset").to_pylist()) == list(range(8))

    # The publisher is not stuck: a later compatible block is published.
    commit(service, [typed_block(bucket, TENANT, TOPIC, 8, 1, v2_columns(8, 1))])
    assert publisher.run_once() == 1
    table = publisher.catalog.load_table(identifier(TENANT, TOPIC))
    assert sorted(table.scan().to_arrow().column("offset").to_pylist()) == [0, 1, 2, 3, 4, 5, 8]
