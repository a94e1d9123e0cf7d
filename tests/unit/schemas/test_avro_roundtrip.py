"""Any Avro schema built from the mapped types, and any datum of it, written with fastavro in the Confluent wire
format, comes back from the partition group's blocks with the declared Arrow type and the datum's value; random
bytes never raise out of the parser (they are stored or quarantined)."""

from __future__ import annotations

import datetime as dt
import decimal
import io
import itertools
import json
import struct
import uuid
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from fastavro.validation import validate
from hypothesis import given
from hypothesis import strategies as st
from tests.factories import BASE_MS, backup_table

from shale.block import read_dataset
from shale.config import BucketConfig, IngestConfig, ParserRule, SchemaRegistryConfig
from shale.encoder.chunks import Chunk, GroupSpec, write_chunk
from shale.objstore import open_bucket
from shale.schemas import EMPTY_RECORD, arrow_type, fingerprint, frame, read_type
from shale.schemas.avro import MAX_DECIMAL_DIGITS, Decoder
from shale.schemas.registry import RegisteredSchema, RegistryClient, RegistryUnavailableError

READ_MS = BASE_MS + 7 * 86_400_000
_names = itertools.count()

# --- schemas -------------------------------------------------------------------------------------------------------

PRIMITIVES = ["boolean", "int", "long", "float", "double", "string", "bytes"]
LOGICAL = [
    {"type": "int", "logicalType": "date"},
    {"type": "int", "logicalType": "time-millis"},
    {"type": "long", "logicalType": "time-micros"},
    {"type": "long", "logicalType": "timestamp-millis"},
    {"type": "long", "logicalType": "timestamp-micros"},
    {"type": "long", "logicalType": "local-timestamp-millis"},
    {"type": "long", "logicalType": "local-timestamp-micros"},
    {"type": "string", "logicalType": "uuid"},
]


def _name(prefix: str) -> str:
    return f"{prefix}{next(_names)}"


@st.composite
def decimals(draw: st.DrawFn) -> dict[str, Any]:
    precision = draw(st.integers(1, 38) | st.integers(39, MAX_DECIMAL_DIGITS))  # the widest too: decimal256
    scale = draw(st.integers(0, precision))
    if draw(st.booleans()):
        return {"type": "bytes", "logicalType": "decimal", "precision": precision, "scale": scale}
    return {"type": "fixed", "name": _name("D"), "size": 16 if precision <= 38 else 32, "logicalType": "decimal",
            "precision": precision, "scale": scale}


def enums() -> st.SearchStrategy[dict[str, Any]]:
    return st.integers(1, 4).map(lambda n: {"type": "enum", "name": _name("E"), "symbols": [f"S{i}" for i in range(n)]})


LEAVES = (st.sampled_from(PRIMITIVES) | st.sampled_from(LOGICAL) | decimals() | enums() | st.just("null")
          | st.integers(1, 8).map(lambda n: {"type": "fixed", "name": _name("F"), "size": n}))


def records(inner: st.SearchStrategy[Any], min_size: int = 0) -> st.SearchStrategy[dict[str, Any]]:
    """Records of up to three fields; with none (valid, and a registry accepts it) unless ``min_size``."""
    return st.lists(inner, min_size=min_size, max_size=3).map(lambda types: {
        "type": "record", "name": _name("R"), "fields": [{"name": f"f{i}", "type": t} for i, t in enumerate(types)]})


def _is_union(schema: Any) -> bool:
    return isinstance(schema, list)


# Branches of "other" unions: kinds fastavro can tell apart after decoding (never both int and long, or both float
# and double: the documented limit), named records (written with fastavro's (name, value) notation) and enums.
BRANCH_KINDS = ["boolean", "int", "long", "float", "double", "string", "bytes", "enum", "record", "array", "map"]


@st.composite
def other_unions(draw: st.DrawFn, inner: st.SearchStrategy[Any]) -> list[Any]:
    kinds = draw(st.lists(st.sampled_from(BRANCH_KINDS), min_size=2, max_size=4, unique=True)
                 .filter(lambda ks: not {"int", "long"} <= set(ks) and not {"float", "double"} <= set(ks)))
    branches: list[Any] = []
    for kind in kinds:
        if kind == "enum":
            branches.append(draw(enums()))
        elif kind == "record":
            branches.append(draw(records(inner.filter(lambda t: not _is_union(t)))))
        elif kind == "array":
            branches.append({"type": "array", "items": draw(inner)})
        elif kind == "map":
            branches.append({"type": "map", "values": draw(inner)})
        else:
            branches.append(kind)
    if draw(st.booleans()):
        branches.insert(draw(st.integers(0, len(branches))), "null")
    return branches


def _extend(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    plain = inner.filter(lambda t: not _is_union(t) and t != "null")
    return (records(inner)
            | inner.map(lambda t: {"type": "array", "items": t})
            | inner.map(lambda t: {"type": "map", "values": t})
            | plain.flatmap(lambda t: st.sampled_from([["null", t], [t, "null"]]))
            | other_unions(inner))


TYPES = st.recursive(LEAVES, _extend, max_leaves=6)
SCHEMAS = records(TYPES, min_size=1)

# --- data ----------------------------------------------------------------------------------------------------------

UTC_TIMES = st.datetimes(min_value=dt.datetime(1900, 1, 1), max_value=dt.datetime(2200, 1, 1))


def _ms(value: dt.datetime | dt.time) -> Any:
    return value.replace(microsecond=value.microsecond // 1000 * 1000)


def data(schema: Any) -> st.SearchStrategy[Any]:
    """Values of ``schema`` as fastavro writes them (named union branches as (name, value))."""
    if isinstance(schema, list):
        return st.one_of(*[_branch_data(b) for b in schema])
    if isinstance(schema, str):
        return {
            "null": st.none(), "boolean": st.booleans(), "int": st.integers(-(2**31), 2**31 - 1),
            "long": st.integers(-(2**63), 2**63 - 1), "float": st.floats(width=32, allow_nan=False),
            "double": st.floats(allow_nan=False), "string": st.text(max_size=8), "bytes": st.binary(max_size=8),
        }[schema]
    logical, kind = schema.get("logicalType"), schema["type"]
    if logical == "decimal":
        digits, scale = schema["precision"], schema["scale"]
        # Exact: the default context (28 digits) would round 36 nines up to 10**36, which no longer fits.
        exact = decimal.Context(prec=digits + 2)
        return st.integers(-(10**digits) + 1, 10**digits - 1).map(
            lambda n: decimal.Decimal(n).scaleb(-scale, context=exact))
    if logical == "date":
        return st.dates()
    if logical == "time-millis":
        return st.times().map(_ms)
    if logical == "time-micros":
        return st.times()
    if logical in ("timestamp-millis", "timestamp-micros"):
        times = UTC_TIMES.map(lambda t: t.replace(tzinfo=dt.UTC))
        return times.map(_ms) if logical.endswith("millis") else times
    if logical in ("local-timestamp-millis", "local-timestamp-micros"):
        return UTC_TIMES.map(_ms) if logical.endswith("millis") else UTC_TIMES
    if logical == "uuid":
        return st.uuids().map(str)
    if kind == "record":
        return st.fixed_dictionaries({f["name"]: data(f["type"]) for f in schema["fields"]})
    if kind == "enum":
        return st.sampled_from(schema["symbols"])
    if kind == "fixed":
        return st.binary(min_size=schema["size"], max_size=schema["size"])
    if kind == "array":
        return st.lists(data(schema["items"]), max_size=3)
    if kind == "map":
        return st.dictionaries(st.text(max_size=4).map(lambda k: "k" + k), data(schema["values"]), max_size=3)
    return data(kind)


def _branch_data(branch: Any) -> st.SearchStrategy[Any]:
    # fastavro's (name, value) notation picks a record branch only; an enum's symbol goes to the first branch that
    # accepts it (``_accepts``), as any other value does.
    if isinstance(branch, dict) and branch["type"] == "record":
        return data(branch).map(lambda v: (branch["name"], v))
    if branch == "string":
        return st.text(max_size=8).map(lambda s: "~" + s)  # never an enum's symbol
    return data(branch)


# --- what the datum reads back as ----------------------------------------------------------------------------------

def _accepts(branch: Any, value: Any) -> bool:
    """Does fastavro's writer put ``value`` into this branch (it takes the first whose validation passes: bytes
    pass as an array of ints, an int as a double)?"""
    if isinstance(value, tuple):
        return isinstance(branch, dict) and branch.get("name") == value[0]
    return bool(validate(value, fastavro.parse_schema(branch), raise_errors=False))


def _branch_name(branch: Any) -> str:
    return branch if isinstance(branch, str) else branch.get("name", branch["type"])


EPOCH = dt.datetime(1970, 1, 1)
RAW_LOGICAL = {
    "date": lambda n: EPOCH.date() + dt.timedelta(days=n),
    "time-millis": lambda n: (EPOCH + dt.timedelta(milliseconds=n)).time(),
    "time-micros": lambda n: (EPOCH + dt.timedelta(microseconds=n)).time(),
    "timestamp-millis": lambda n: (EPOCH + dt.timedelta(milliseconds=n)).replace(tzinfo=dt.UTC),
    "timestamp-micros": lambda n: (EPOCH + dt.timedelta(microseconds=n)).replace(tzinfo=dt.UTC),
    "local-timestamp-millis": lambda n: EPOCH + dt.timedelta(milliseconds=n),
    "local-timestamp-micros": lambda n: EPOCH + dt.timedelta(microseconds=n),
}
"""A logical value fastavro writes as its raw number: the bytes of a ``bytes`` datum become the ints of an array
branch that comes first in a union."""


def expected(schema: Any, value: Any) -> Any:
    """The Python value Arrow gives back for ``value`` of ``schema``."""
    if value is None:
        return None
    if isinstance(schema, list):
        branches = [b for b in schema if b != "null"]
        inner = value[1] if isinstance(value, tuple) else value
        if len(branches) == 1:
            return expected(branches[0], inner)
        chosen = next(b for b in schema if _accepts(b, value))
        return {_branch_name(b): (expected(b, inner) if b is chosen else None) for b in branches}
    kind = schema if isinstance(schema, str) else schema["type"]
    logical = None if isinstance(schema, str) else schema.get("logicalType")
    if logical == "uuid":
        return str(uuid.UUID(value))
    if isinstance(value, int) and logical in RAW_LOGICAL:
        return RAW_LOGICAL[logical](value)
    if kind == "float" and logical is None:
        return struct.unpack("f", struct.pack("f", value))[0]
    if kind == "double":
        return float(value)
    if kind == "record" and logical is None:
        return {f["name"]: expected(f["type"], value[f["name"]]) for f in schema["fields"]}
    if kind == "array":
        return [expected(schema["items"], v) for v in value]
    if kind == "map":
        return [(k, expected(schema["values"], v)) for k, v in value.items()]
    if isinstance(kind, dict | list):
        return expected(kind, value)
    return value


# --- the parser path -----------------------------------------------------------------------------------------------

REGISTRY = SchemaRegistryConfig(url="http://127.0.0.1:1/apis/ccompat/v7", timeout=2.0)
"""Nothing listens there: schemas are remembered in the cache; an id not remembered finds the registry down."""


def _spec(**options: Any) -> GroupSpec:
    rule = ParserRule(parser="avro", options=options)
    return GroupSpec("partition", 1, BucketConfig(url=f"memory://avro-{uuid.uuid4().hex}"),
                     IngestConfig(parsers=[rule], schema_registry=REGISTRY))


def _register(schema: dict[str, Any]) -> int:
    sid = next(_names) + 1000
    RegistryClient(REGISTRY).remember(RegisteredSchema(sid, "AVRO", json.dumps(schema)))
    return sid


def _encode(schema: dict[str, Any], datum: Any) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), datum)
    return out.getvalue()


def _store(values: list[bytes | None]) -> tuple[pa.Table | None, list[str]]:
    table = backup_table("app", 0, 0, len(values))
    table = table.set_column(table.schema.get_field_index("value"), "value", pa.array(values, pa.binary()))
    spec = _spec()
    bucket = open_bucket(spec.bucket)
    written = write_chunk(spec, bucket, table, Chunk("app", 0, "", 0, len(values), READ_MS))
    rows = [read_dataset(bucket, m, d) for m in written.blocks for d in m.datasets if d.kind == "records"]
    reasons = [r for m in written.blocks for d in m.datasets if d.kind == "quarantine"
               for r in read_dataset(bucket, m, d).column("reason").to_pylist()]
    assert sum(m.rows for m in written.blocks) == len(values)
    return (pa.concat_tables(rows) if rows else None), reasons


@given(st.data())
def test_any_datum_of_any_schema_comes_back_typed_and_equal(draw: st.DataObject) -> None:
    schema = draw.draw(SCHEMAS)
    _roundtrip(schema, draw.draw(data(schema)))


def _roundtrip(schema: Any, datum: Any) -> None:
    sid = _register(schema)
    stored, reasons = _store([frame(sid, _encode(schema, datum))])
    assert reasons == []
    assert stored is not None
    declared = arrow_type(schema)
    for field in schema["fields"]:
        name = field["name"]
        assert stored.schema.field(name).type == declared.field(name).type
        # As readers return it: an empty record, stored with a marker (shale.schemas.empty), is the writer's {}.
        column = stored.column(name).cast(read_type(declared.field(name).type))
        assert column.to_pylist() == [expected(field["type"], datum[name])]


EMPTY: dict[str, Any] = {"type": "record", "name": "Nothing", "fields": []}


@pytest.mark.parametrize(("field", "value"), [
    (EMPTY, {}),
    (["null", EMPTY], None),
    (["null", EMPTY], {}),
    ({"type": "array", "items": EMPTY}, [{}, {}]),
    ({"type": "map", "values": EMPTY}, {"k": {}}),
    (["string", EMPTY, "long"], ("Nothing", {})),
    ({"type": "record", "name": "Outer", "fields": [{"name": "inner", "type": EMPTY}, {"name": "n", "type": "int"}]},
     {"inner": {}, "n": 3}),
])
def test_a_record_with_no_fields_is_stored_and_read_back_as_an_empty_record(field: Any, value: Any) -> None:
    """Parquet cannot write a struct without children: before the marker, every block holding one failed, and the
    batch with it, for ever."""
    schema = {"type": "record", "name": _name("R"),
              "fields": [{"name": "e", "type": field}, {"name": "n", "type": "long"}]}
    _roundtrip(schema, {"e": value, "n": 1})
    assert str(EMPTY_RECORD) in str(arrow_type(schema))  # stored with its marker


@pytest.mark.parametrize(("field", "value"), [
    ({"type": "array", "items": "null"}, [None, None]),  # found by the property: ingest's cast failed, for ever
    ({"type": "map", "values": "null"}, {"a": None, "b": None}),
    ({"type": "array", "items": {"type": "record", "name": "HasNull", "fields": [{"name": "n", "type": "null"}]}},
     [{"n": None}, {"n": None}]),
])
def test_a_null_inside_an_array_or_a_map_is_stored(field: Any, value: Any) -> None:
    schema = {"type": "record", "name": _name("R"), "fields": [{"name": "e", "type": field}]}
    _roundtrip(schema, {"e": value})


def test_a_top_level_record_with_no_fields_has_no_columns() -> None:
    schema = {"type": "record", "name": _name("R"), "fields": []}
    assert arrow_type(schema) == pa.struct([])
    stored, reasons = _store([frame(_register(schema), _encode(schema, {}))])
    assert reasons == []
    assert stored is not None
    assert stored.num_rows == 1


@given(st.data())
def test_random_bytes_never_raise_out_of_the_parser(draw: st.DataObject) -> None:
    schema = draw.draw(SCHEMAS)
    sid = _register(schema)
    values = draw.draw(st.lists(st.one_of(st.none(), st.binary(max_size=40),
                                          st.binary(max_size=40).map(lambda b: frame(sid, b))), min_size=1, max_size=5))
    try:
        _store(values)  # every record stored or quarantined, nothing raised
    except RegistryUnavailableError:
        # Bytes framed with an id this process never saw: only the registry can say whether it exists, and this test
        # has none to ask, so the batch is retried (nothing quarantined, nothing lost). Any other error is a bug.
        assert any(v is not None and len(v) >= 5 and v[0] == 0 and int.from_bytes(v[1:5], "big") != sid
                   for v in values)


def test_bytes_without_the_magic_byte_are_quarantined_with_the_reason() -> None:
    schema = {"type": "record", "name": _name("R"), "fields": [{"name": "n", "type": "long"}]}
    sid = _register(schema)
    body = _encode(schema, {"n": 7})
    stored, reasons = _store([frame(sid, body), b"\x01" + bytes(8), b"{}", None])
    assert stored is not None
    assert stored.column("n").to_pylist() == [7]
    assert len(reasons) == 3
    assert any("magic byte" in r for r in reasons)
    assert any("shorter than the 5-byte" in r for r in reasons)
    assert any("no value" in r for r in reasons)


def test_a_registry_that_does_not_answer_fails_the_chunk_and_quarantines_nothing() -> None:
    schema = {"type": "record", "name": _name("R"), "fields": [{"name": "n", "type": "long"}]}
    sid = _register(schema)
    unknown_to_the_cache = sid + 10**6
    with pytest.raises(RegistryUnavailableError, match=r"127\.0\.0\.1:1"):
        _store([frame(sid, _encode(schema, {"n": 1})), frame(unknown_to_the_cache, _encode(schema, {"n": 2}))])


def test_an_older_version_fills_the_columns_of_its_own_field_names_in_the_chunk() -> None:
    """A field a later version added is null in an older record, not its default: a record of the older version
    alone in a chunk has no such column, so its value would depend on the chunk."""
    old = {"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"}]}
    new = {"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"},
                                                          {"name": "note", "type": "string", "default": "none"}]}
    old_id, new_id = _register(old), _register(new)
    stored, reasons = _store([frame(old_id, _encode(old, {"id": 1})), frame(new_id, _encode(new, {"id": 2,
                                                                                                    "note": "x"}))])
    assert reasons == []
    assert stored is not None
    assert stored.column("id").to_pylist() == [1, 2]
    assert stored.column("note").to_pylist() == [None, "x"]


def test_the_block_records_schema_ids_types_and_fingerprint() -> None:
    schema = {"type": "record", "name": _name("R"), "fields": [
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}}]}
    sid = _register(schema)
    spec = _spec()
    bucket = open_bucket(spec.bucket)
    table = backup_table("app", 0, 0, 1)
    table = table.set_column(table.schema.get_field_index("value"), "value",
                             pa.array([frame(sid, _encode(schema, {"amount": decimal.Decimal("12.34")}))]))
    written = write_chunk(spec, bucket, table, Chunk("app", 0, "", 0, 1, READ_MS))
    (dataset,) = [d for m in written.blocks for d in m.datasets if d.kind == "records"]
    assert dataset.schema_ids == [sid]
    assert dataset.schema_fingerprint == fingerprint(schema)
    assert dataset.column_types is not None


@pytest.mark.parametrize(("schema", "arrow"), [
    ({"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}, pa.decimal128(10, 2)),
    ({"type": "long", "logicalType": "timestamp-millis"}, pa.timestamp("us", tz="UTC")),
    ({"type": "long", "logicalType": "local-timestamp-micros"}, pa.timestamp("us")),
    ({"type": "enum", "name": "E", "symbols": ["A"]}, pa.string()),
    (["null", "string"], pa.string()),
    (["int", "string"], pa.struct([("int", pa.int32()), ("string", pa.string())])),
    ({"type": "map", "values": "int"}, pa.map_(pa.string(), pa.int32())),
])
def test_the_mapping_table(schema: Any, arrow: pa.DataType) -> None:
    assert arrow_type(schema) == arrow


def test_a_recursive_schema_has_no_arrow_type() -> None:
    node = {"type": "record", "name": "Node", "fields": [{"name": "next", "type": ["null", "Node"]}]}
    with pytest.raises(ValueError, match="recursive"):
        Decoder(node)


def test_compaction_merges_blocks_of_two_versions_into_one_typed_block() -> None:
    from shale.compactor.merge import merge_blocks

    old = {"type": "record", "name": "Pay", "fields": [
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}}]}
    new = {**old, "fields": [*old["fields"], {"name": "note", "type": "string", "default": "-"}]}
    old_id, new_id = _register(old), _register(new)
    spec = _spec()
    bucket = open_bucket(spec.bucket)
    blocks = []
    for start, (sid, schema, datum) in enumerate([(old_id, old, {"amount": decimal.Decimal("1.50")}),
                                                  (new_id, new, {"amount": decimal.Decimal("2.25"), "note": "n"})]):
        table = backup_table("app", 0, start, 1)
        table = table.set_column(table.schema.get_field_index("value"), "value",
                                 pa.array([frame(sid, _encode(schema, datum))]))
        written = write_chunk(spec, bucket, table, Chunk("app", 0, "", start, start + 1, READ_MS))
        blocks += [m for m in written.blocks if any(d.kind == "records" for d in m.datasets)]
    merged = merge_blocks(bucket, blocks, job="j", token=1, level=0).output
    (dataset,) = merged.datasets
    assert dataset.schema_ids == [old_id, new_id]
    assert dataset.schema_fingerprint == fingerprint(new)
    rows = read_dataset(bucket, merged, dataset).sort_by("offset")
    assert rows.schema.field("amount").type == pa.decimal128(9, 2)
    assert rows.column("amount").to_pylist() == [decimal.Decimal("1.50"), decimal.Decimal("2.25")]
    assert rows.column("note").to_pylist() == [None, "n"]  # a block of the old version alone has no note column


def test_a_record_of_an_incompatible_older_version_is_quarantined_with_the_reason() -> None:
    old = {"type": "record", "name": "Reading", "fields": [{"name": "reading", "type": "string"}]}
    new = {"type": "record", "name": "Reading", "fields": [{"name": "reading", "type": "long"}]}  # no resolution
    old_id, new_id = _register(old), _register(new)
    stored, reasons = _store([frame(old_id, _encode(old, {"reading": "x"})),
                              frame(new_id, _encode(new, {"reading": 5}))])
    assert stored is not None
    assert stored.column("reading").to_pylist() == [5]
    assert len(reasons) == 1
    assert f"schema id {old_id} cannot be read as the newest schema id {new_id}" in reasons[0]


def test_a_field_named_like_a_built_in_column_needs_a_prefix() -> None:
    schema = {"type": "record", "name": _name("R"), "fields": [{"name": "offset", "type": "long"}]}
    sid = _register(schema)
    body = frame(sid, _encode(schema, {"offset": 3}))
    stored, reasons = _store([body])
    assert stored is None
    assert "column_prefix" in reasons[0]


def test_an_enum_in_a_union_with_a_record_inside_an_array() -> None:
    """Found by the property: the datum generator wrote the enum branch in (name, value) notation, which fastavro
    accepts for records only."""
    schema = {"type": "record", "name": "R6", "fields": [{"name": "f0", "type": ["null", {"type": "array", "items": [
        {"type": "record", "name": "R4", "fields": [{"name": "f0", "type": "boolean"}]},
        {"type": "enum", "name": "E5", "symbols": ["S0"]}]}]}]}
    _roundtrip(schema, {"f0": ["S0"]})


def test_a_decimal_of_full_precision_is_stored_exactly() -> None:
    """Found by the property: 36 nines at precision 36 (the generator had rounded it to 10**36 in the default
    28-digit context, which the parser rightly quarantined as too wide)."""
    schema = {"type": "record", "name": "R4w", "fields": [{"name": "f0", "type": {"type": "array", "items": {
        "type": "fixed", "name": "D3w", "size": 16, "logicalType": "decimal", "precision": 36, "scale": 0}}}]}
    _roundtrip(schema, {"f0": [decimal.Decimal(10**36 - 1)]})


def test_bytes_written_into_an_earlier_array_of_dates_branch_read_back_as_dates() -> None:
    """Found by the property: fastavro's writer puts ``b"\\x00"`` into the first union branch that accepts it, an
    array of dates (bytes are a sequence of ints); the oracle expected the raw int 0, the block rightly holds
    1970-01-01."""
    schema = {"type": "record", "name": "R1495", "fields": [{"name": "f0", "type": {"type": "array", "items": {
        "type": "map", "values": ["null", {"type": "array", "items": {"type": "int", "logicalType": "date"}},
                                  "bytes", "boolean", {"type": "enum", "name": "E1494", "symbols": ["S0"]}]}}}]}
    _roundtrip(schema, {"f0": [{"k": b"\x00"}]})
