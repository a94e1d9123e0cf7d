"""Iceberg types of typed parser columns (``shale.iceberg.types``): every Arrow type the parsers produce gets an
Iceberg type that holds its values exactly, and a block's objects convert into it without loss."""

from __future__ import annotations

import datetime as dt
import decimal
from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st
from pyiceberg.io.pyarrow import _check_pyarrow_schema_compatible
from pyiceberg.schema import assign_fresh_schema_ids
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
)

from shale.iceberg.types import conflicts, iceberg_schema, needs_copy, table_schema, to_iceberg

UTC_US = pa.timestamp("us", tz="UTC")
# The scalar types the avro, protobuf and json_schema parsers produce (DESIGN 10.8), with a value strategy, the
# Iceberg type the table must declare, and the exact value it must hold.
SCALARS: list[tuple[pa.DataType, st.SearchStrategy[Any], type[IcebergType] | IcebergType, Any]] = [
    (pa.bool_(), st.booleans(), BooleanType, lambda v: v),
    (pa.int32(), st.integers(-2**31, 2**31 - 1), IntegerType, lambda v: v),
    (pa.int64(), st.integers(-2**63, 2**63 - 1), LongType, lambda v: v),
    (pa.uint32(), st.integers(0, 2**32 - 1), LongType, lambda v: v),
    (pa.uint64(), st.integers(0, 2**64 - 1), DecimalType(20, 0), decimal.Decimal),
    (pa.float32(), st.floats(width=32, allow_nan=False), FloatType, lambda v: v),
    (pa.float64(), st.floats(allow_nan=False), DoubleType, lambda v: v),
    (pa.decimal128(10, 2), st.decimals(-10**8 + 1, 10**8 - 1, places=2), DecimalType(10, 2), lambda v: v),
    (pa.decimal128(38, 9), st.decimals(-10**29 + 1, 10**29 - 1, places=9), DecimalType(38, 9), lambda v: v),
    (pa.string(), st.text(max_size=5), StringType, lambda v: v),
    (pa.binary(), st.binary(max_size=5), BinaryType, lambda v: v),
    (pa.date32(), st.dates(), DateType, lambda v: v),
    (UTC_US, st.datetimes(timezones=st.just(dt.UTC)), TimestamptzType, lambda v: v),
    (pa.timestamp("us"), st.datetimes(), TimestampType, lambda v: v),
    (pa.time32("ms"), st.times().map(lambda t: t.replace(microsecond=t.microsecond // 1000 * 1000)), LongType,
     lambda t: ((t.hour * 60 + t.minute) * 60 + t.second) * 1_000_000 + t.microsecond),
    (pa.time64("us"), st.times(), LongType,
     lambda t: ((t.hour * 60 + t.minute) * 60 + t.second) * 1_000_000 + t.microsecond),
]


def _nullable(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | strategy


def _column(depth: int = 2) -> st.SearchStrategy[tuple[pa.DataType, st.SearchStrategy[Any], Any, Any]]:
    """(Arrow type, value strategy, expected Iceberg type, expected value): scalars, and structs, lists and
    maps<string, _> of them (nested up to ``depth``)."""
    scalar = st.sampled_from(SCALARS).map(lambda s: (s[0], s[1], s[2] if isinstance(s[2], IcebergType) else s[2](),
                                                     s[3]))
    if depth == 0:
        return scalar

    def struct(parts: list[Any]) -> Any:
        names = [f"f{i}" for i in range(len(parts))]
        t = pa.struct([pa.field(n, p[0], nullable=True) for n, p in zip(names, parts, strict=True)])
        values = st.fixed_dictionaries({n: _nullable(p[1]) for n, p in zip(names, parts, strict=True)})
        return (t, values, ("struct", [(n, p[2]) for n, p in zip(names, parts, strict=True)]),
                lambda v: None if v is None else {n: None if v[n] is None else p[3](v[n])
                                                  for n, p in zip(names, parts, strict=True)})

    def list_(p: Any) -> Any:
        return (pa.list_(p[0]), st.lists(_nullable(p[1]), max_size=3), ("list", p[2]),
                lambda v: [None if x is None else p[3](x) for x in v])

    def map_(p: Any) -> Any:
        return (pa.map_(pa.string(), p[0]), st.dictionaries(st.text(max_size=3), _nullable(p[1]), max_size=3),
                ("map", p[2]), lambda v: [(k, None if x is None else p[3](x)) for k, x in v.items()])

    inner = _column(depth - 1)
    return scalar | st.lists(inner, min_size=1, max_size=3).map(struct) | inner.map(list_) | inner.map(map_)


def _matches(actual: IcebergType, expected: Any) -> bool:
    if isinstance(expected, tuple) and expected[0] == "struct":
        return isinstance(actual, StructType) and [(f.name, f.optional) for f in actual.fields] == [
            (n, True) for n, _ in expected[1]] and all(
            _matches(f.field_type, e) for f, (_, e) in zip(actual.fields, expected[1], strict=True))
    if isinstance(expected, tuple) and expected[0] == "list":
        return isinstance(actual, ListType) and actual.element_field.optional and _matches(actual.element_type,
                                                                                            expected[1])
    if isinstance(expected, tuple) and expected[0] == "map":
        return isinstance(actual, MapType) and isinstance(actual.key_type, StringType) and _matches(
            actual.value_type, expected[1])
    return bool(actual == expected)


@settings(max_examples=150, deadline=None)
@given(column=_column(), data=st.data())
def test_every_parser_type_gets_an_iceberg_type_that_holds_its_values_exactly(column: Any, data: Any) -> None:
    arrow_type, values_strategy, expected_type, expected_value = column
    values = data.draw(st.lists(_nullable(values_strategy), min_size=1, max_size=4))
    schema = assign_fresh_schema_ids(iceberg_schema(table_schema(["c"], {"c": arrow_type})))
    field = schema.find_field("c")
    assert field.optional
    assert _matches(field.field_type, expected_type), (arrow_type, field.field_type)

    # A block's object of that type converts (a copy) into the table's type, each value exact.
    block = pa.table({"c": pa.array(values, arrow_type)})
    converted = to_iceberg(block)
    assert needs_copy(block.schema) == (converted is not block)
    _check_pyarrow_schema_compatible(schema.select("c"), converted.schema)
    assert converted.column("c").to_pylist() == [None if v is None else expected_value(v) for v in values]


def test_untyped_columns_stay_strings_and_base_columns_keep_their_types() -> None:
    schema = assign_fresh_schema_ids(iceberg_schema(table_schema(["level", "msg"])))
    assert [str(f.field_type) for f in schema.fields[-2:]] == ["string", "string"]
    assert str(schema.find_field("offset").field_type) == "long"
    assert schema.find_field("event_time").required


def test_conflicts_name_the_column_and_both_types() -> None:
    table = iceberg_schema(pa.schema([pa.field("n", pa.int64()), pa.field("s", pa.struct([("q", pa.string())])),
                                      pa.field("x", pa.float32()), pa.field("d", pa.decimal128(10, 2))]))
    widened = iceberg_schema(pa.schema([pa.field("n", pa.int32()), pa.field("x", pa.float64()),
                                        pa.field("d", pa.decimal128(12, 2)), pa.field("new", pa.date32()),
                                        pa.field("s", pa.struct([("q", pa.string()), ("r", pa.int32())]))]))
    assert conflicts(table, widened) == []
    broken = iceberg_schema(pa.schema([pa.field("n", pa.string()), pa.field("s", pa.struct([("q", pa.int32())])),
                                       pa.field("d", pa.decimal128(10, 3))]))
    assert conflicts(table, broken) == ["n: table type long, block type string", "s.q: table type string, block "
                                        "type int", "d: table type decimal(10, 2), block type decimal(10, 3)"]
    assert conflicts(table, iceberg_schema(pa.schema([pa.field("s", pa.int32())]))) == [
        "s: table type struct<-1: q: optional string>, block type int"]
