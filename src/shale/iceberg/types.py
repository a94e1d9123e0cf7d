"""The Iceberg types of a dataset's columns, and which type changes keep one table (docs/DESIGN.md 16.7).

A column's Iceberg type comes from its recorded Arrow type (``Dataset.column_types``; absent: string) through
one Arrow type Iceberg stores exactly (``iceberg_arrow``), which pyiceberg then converts. pyiceberg alone would map
uint32 to int and uint64 to long (lossy) and has no type for time-millis, so Shale converts first, as its Spark
data source does: uint8 and uint16 → int, uint32 → long, uint64 → decimal(20, 0); every timestamp → microseconds
(UTC when it has a zone); time-of-day → long microseconds since midnight (Spark cannot read Iceberg's ``time``);
an all-null column → string. A block whose object holds a type that differs from its Iceberg form is registered as
a converted copy (``needs_copy``).

Type changes between blocks are compared by name (``conflicts``): a type the table already holds or can widen to
(int → long, float → double, a decimal's precision growing, a struct gaining fields, a new column) evolves the
table; a narrower one (long → int) is read as the wider type, exactly; anything else conflicts.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from shale.block import PARTITION_BASE_FIELDS


def iceberg_arrow(t: pa.DataType, *, nullable: bool = False) -> pa.DataType:
    """``t`` as an Arrow type Iceberg stores exactly; with ``nullable`` every nested field is made nullable (a
    table's declaration, so a later version may drop a nested field), else nullability is kept (a copy)."""
    if pa.types.is_dictionary(t):
        return iceberg_arrow(t.value_type, nullable=nullable)
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", tz="UTC" if t.tz else None)
    if pa.types.is_uint64(t):
        return pa.decimal128(20, 0)
    if pa.types.is_uint32(t):
        return pa.int64()
    if pa.types.is_uint16(t) or pa.types.is_uint8(t):
        return pa.int32()
    if pa.types.is_time(t):
        return pa.int64()
    if pa.types.is_null(t) or pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_binary(t):
        return pa.binary()

    def field(f: pa.Field) -> pa.Field:
        return f.with_type(iceberg_arrow(f.type, nullable=nullable)).with_nullable(nullable or f.nullable)

    if pa.types.is_struct(t):
        return pa.struct([field(t.field(i)) for i in range(t.num_fields)])
    if pa.types.is_map(t):
        return pa.map_(t.key_field.with_type(iceberg_arrow(t.key_type, nullable=nullable)), field(t.item_field))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(field(t.value_field))
    return t


def table_schema(columns: list[str], types: dict[str, pa.DataType] | None = None) -> pa.Schema:
    """A table's Arrow schema: the partition group's base columns, then the parser's columns with their Iceberg
    types (string when untyped), all nullable."""
    known = types or {}
    return pa.schema([*PARTITION_BASE_FIELDS,
                      *(pa.field(c, iceberg_arrow(known.get(c, pa.string()), nullable=True)) for c in columns)])


def needs_copy(schema: pa.Schema) -> bool:
    """Whether an object of this schema must be converted (``to_iceberg``) before Iceberg can read it."""
    return any(iceberg_arrow(f.type) != f.type for f in schema)


def _times_as_micros(t: pa.DataType) -> pa.DataType:
    """``t`` with every time-of-day type as time64(us) (a cast that scales), nested ones included."""
    if pa.types.is_time(t):
        return pa.time64("us")
    if pa.types.is_struct(t):
        return pa.struct([t.field(i).with_type(_times_as_micros(t.field(i).type)) for i in range(t.num_fields)])
    if pa.types.is_map(t):
        return pa.map_(t.key_field, t.item_field.with_type(_times_as_micros(t.item_type)))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(t.value_field.with_type(_times_as_micros(t.value_type)))
    return t


def to_iceberg(table: pa.Table) -> pa.Table:
    """``table`` with every column in its Iceberg form (values exact: unsigned integers widen, times scale to
    microseconds first, then become their long count)."""
    if not needs_copy(table.schema):
        return table
    scaled = pa.schema([f.with_type(_times_as_micros(f.type)) for f in table.schema])
    table = table.cast(scaled)
    return table.cast(pa.schema([f.with_type(iceberg_arrow(f.type)) for f in table.schema]))


def conflicts(table: Any, schema: Any, path: str = "") -> list[str]:
    """Where pyiceberg types ``schema`` (a block's, converted) cannot join ``table`` (the table's), by name:
    ``"column: table type T, block type B"``. A field only one side has, a type either side can be promoted to
    (the table widens, or reads the narrower block type as its own) and equal types join."""
    from pyiceberg.exceptions import ResolveError
    from pyiceberg.schema import Schema, promote
    from pyiceberg.types import DecimalType, ListType, MapType, StructType

    table = table.as_struct() if isinstance(table, Schema) else table
    schema = schema.as_struct() if isinstance(schema, Schema) else schema
    if isinstance(table, StructType) and isinstance(schema, StructType):
        left = {f.name: f.field_type for f in table.fields}
        right = {f.name: f.field_type for f in schema.fields}
        return [c for name in left if name in right
                for c in conflicts(left[name], right[name], f"{path}.{name}" if path else name)]
    if isinstance(table, ListType) and isinstance(schema, ListType):
        return conflicts(table.element_type, schema.element_type, f"{path}.element")
    if isinstance(table, MapType) and isinstance(schema, MapType):
        return [*conflicts(table.key_type, schema.key_type, f"{path}.key"),
                *conflicts(table.value_type, schema.value_type, f"{path}.value")]
    if table == schema:
        return []
    if table.is_primitive and schema.is_primitive:
        for source, target in ((schema, table), (table, schema)):
            if isinstance(source, DecimalType) and isinstance(target, DecimalType) and source.scale != target.scale:
                continue  # pyiceberg 0.12's promote() compares a decimal's scale with itself: a scale never changes
            try:
                promote(source, target)
                return []
            except ResolveError:
                pass
    return [f"{path}: table type {table}, block type {schema}"]


ICEBERG_MAX_PRECISION = 38
"""Iceberg's widest decimal (its spec: precision at most 38)."""


def unrepresentable(schema: pa.Schema) -> list[str]:
    """The columns (nested ones by path) of ``schema`` no Iceberg type holds, each as ``"column: why"``: a decimal of
    more than 38 digits (Avro and JSON Schema allow any precision; Arrow stores it as decimal256)."""
    out: list[str] = []

    def visit(t: pa.DataType, path: str) -> None:
        if pa.types.is_decimal(t) and t.precision > ICEBERG_MAX_PRECISION:
            out.append(f"{path}: decimal({t.precision}, {t.scale}) has more digits than Iceberg's widest decimal "
                       f"({ICEBERG_MAX_PRECISION})")
        elif pa.types.is_struct(t):
            for i in range(t.num_fields):
                visit(t.field(i).type, f"{path}.{t.field(i).name}")
        elif pa.types.is_map(t):
            visit(t.key_type, f"{path}.key")
            visit(t.item_type, f"{path}.value")
        elif pa.types.is_list(t) or pa.types.is_large_list(t):
            visit(t.value_type, f"{path}.element")
        elif pa.types.is_dictionary(t):
            visit(t.value_type, path)

    for f in schema:
        visit(f.type, f.name)
    return out


def iceberg_schema(schema: pa.Schema) -> Any:
    """The pyiceberg schema (field ids not yet assigned) of an Arrow schema in its Iceberg form."""
    from pyiceberg.io.pyarrow import _ConvertToIcebergWithoutIDs, visit_pyarrow

    return visit_pyarrow(schema, _ConvertToIcebergWithoutIDs())
