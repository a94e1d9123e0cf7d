"""Any JSON Schema built from the mapped kinds, and any value valid against it, framed as the standard serializer
frames it, comes back from the partition group's blocks with the declared Arrow type and the value; values that do not
validate are quarantined with the validator's reason; random bytes never raise out of the parser."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import uuid
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.factories import BASE_MS, backup_table

from shale.block import read_dataset
from shale.config import BucketConfig, IngestConfig, ParserRule, SchemaRegistryConfig
from shale.encoder.chunks import Chunk, GroupSpec, write_chunk
from shale.objstore import open_bucket
from shale.schemas import jsonschema
from shale.schemas.avro import SchemaError
from shale.schemas.registry import RegisteredSchema, RegistryClient, RegistryUnavailableError
from shale.schemas.wire import frame

READ_MS = BASE_MS + 7 * 86_400_000
REGISTRY = SchemaRegistryConfig(url="http://127.0.0.1:1/apis/ccompat/v7", timeout=2.0)
_ids = itertools.count(9000)

# --- schemas and their values ------------------------------------------------------------------------------------

LEAVES: list[tuple[dict[str, Any], pa.DataType]] = [
    ({"type": "string"}, pa.string()), ({"type": "integer"}, pa.int64()), ({"type": "number"}, pa.float64()),
    ({"type": "boolean"}, pa.bool_()), ({"type": "string", "format": "date-time"}, pa.timestamp("us", tz="UTC")),
    ({"type": "string", "format": "date"}, pa.date32()), ({"enum": ["a", "b"]}, pa.string()),
    ({"type": ["integer", "string"]}, pa.string()), ({}, pa.string()),
]
Schema = tuple[dict[str, Any], pa.DataType]


def _nullable(leaf: Schema, how: int) -> Schema:
    schema, arrow = leaf
    if how == 1 and isinstance(schema.get("type"), str):
        return {**schema, "type": [schema["type"], "null"]}, arrow
    if how == 2 and schema:
        return {"oneOf": [{"type": "null"}, schema]}, arrow
    return leaf


def _extend(inner: st.SearchStrategy[Schema]) -> st.SearchStrategy[Schema]:
    objects = st.lists(inner, min_size=1, max_size=3).map(lambda fields: (
        {"type": "object", "properties": {f"p{i}": s for i, (s, _) in enumerate(fields)}},
        pa.struct([pa.field(f"p{i}", a) for i, (_, a) in enumerate(fields)])))
    arrays = inner.map(lambda s: ({"type": "array", "items": s[0]}, pa.list_(s[1])))
    maps = inner.map(lambda s: ({"type": "object", "additionalProperties": s[0]}, pa.map_(pa.string(), s[1])))
    return objects | arrays | maps


TYPES = st.recursive(st.tuples(st.sampled_from(LEAVES), st.integers(0, 2)).map(lambda t: _nullable(*t)), _extend,
                     max_leaves=6)
ROOTS = st.lists(TYPES, min_size=1, max_size=4).map(lambda fields: (
    {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
     "properties": {f"f{i}": s for i, (s, _) in enumerate(fields)}},
    pa.struct([pa.field(f"f{i}", a) for i, (_, a) in enumerate(fields)])))

TIMES = st.datetimes(min_value=dt.datetime(1900, 1, 1), max_value=dt.datetime(2200, 1, 1),
                     timezones=st.sampled_from([dt.UTC, dt.timezone(dt.timedelta(hours=5, minutes=30)),
                                                dt.timezone(-dt.timedelta(hours=8))]))
ANY_JSON = st.recursive(st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=5),
                        lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=3), inner,
                                                                                   max_size=2), max_leaves=4)


def _text(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def values(schema: dict[str, Any]) -> st.SearchStrategy[tuple[Any, Any]]:
    """(the JSON value, what Arrow gives back)."""
    if "oneOf" in schema:
        return st.just((None, None)) | values(schema["oneOf"][1])
    kind = schema.get("type")
    if isinstance(kind, list):
        if "null" in kind:
            return st.just((None, None)) | values({**schema, "type": kind[0]})
        return (st.integers(-(2**40), 2**40) | st.text(max_size=5)).map(lambda v: (v, _text(v)))
    if "enum" in schema:
        return st.sampled_from(schema["enum"]).map(lambda v: (v, v))
    if not schema:
        return ANY_JSON.map(lambda v: (v, None if v is None else _text(v)))
    if kind == "string" and schema.get("format") == "date-time":
        return TIMES.map(lambda t: (t.isoformat(), t.astimezone(dt.UTC)))
    if kind == "string" and schema.get("format") == "date":
        return st.dates().map(lambda d: (d.isoformat(), d))
    if kind == "string":
        return st.text(max_size=8).map(lambda v: (v, v))
    if kind == "integer":
        return st.integers(-(2**63), 2**63 - 1).map(lambda v: (v, v))
    if kind == "number":
        return st.floats(allow_nan=False, allow_infinity=False).map(lambda v: (v, v)) | \
            st.integers(-(2**50), 2**50).map(lambda v: (v, float(v)))
    if kind == "boolean":
        return st.booleans().map(lambda v: (v, v))
    if kind == "array":
        return st.lists(values(schema["items"]), max_size=3).map(lambda pairs: ([p[0] for p in pairs],
                                                                              [p[1] for p in pairs]))
    if "additionalProperties" in schema:
        return st.dictionaries(st.text(max_size=4), values(schema["additionalProperties"]), max_size=3).map(
            lambda d: ({k: v[0] for k, v in d.items()}, [(k, v[1]) for k, v in d.items()]))
    props = schema["properties"]
    present = st.fixed_dictionaries({k: values(s) for k, s in props.items()})
    return st.tuples(present, st.sets(st.sampled_from(sorted(props)))).map(lambda t: (
        {k: v[0] for k, v in t[0].items() if k not in t[1]},  # some properties left out: they read as null
        {k: (None if k in t[1] else v[1]) for k, v in t[0].items()}))


# --- the parser path ---------------------------------------------------------------------------------------------

def _register(schema: dict[str, Any] | str) -> int:
    sid = next(_ids)
    text = schema if isinstance(schema, str) else json.dumps(schema)
    RegistryClient(REGISTRY).remember(RegisteredSchema(sid, "JSON", text))
    return sid


def _store(values_: list[bytes | None]) -> tuple[pa.Table | None, list[str]]:
    table = backup_table("app", 0, 0, len(values_))
    table = table.set_column(table.schema.get_field_index("value"), "value", pa.array(values_, pa.binary()))
    rule = ParserRule(parser="json_schema", options={})
    spec = GroupSpec("partition", 1, BucketConfig(url=f"memory://jsonschema-{uuid.uuid4().hex}"),
                     IngestConfig(parsers=[rule], schema_registry=REGISTRY))
    bucket = open_bucket(spec.bucket)
    written = write_chunk(spec, bucket, table, Chunk("app", 0, "", 0, len(values_), READ_MS))
    rows = [read_dataset(bucket, m, d) for m in written.blocks for d in m.datasets if d.kind == "records"]
    reasons = [r for m in written.blocks for d in m.datasets if d.kind == "quarantine"
               for r in read_dataset(bucket, m, d).column("reason").to_pylist()]
    assert sum(m.rows for m in written.blocks) == len(values_)
    return (pa.concat_tables(rows) if rows else None), reasons


def _framed(sid: int, value: Any) -> bytes:
    return frame(sid, json.dumps(value).encode())


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_any_valid_value_of_any_schema_comes_back_typed_and_equal(draw: st.DataObject) -> None:
    schema, arrow = draw.draw(ROOTS)
    value, want = draw.draw(values(schema))
    assert jsonschema.arrow_type(schema) == arrow
    sid = _register(schema)
    stored, reasons = _store([_framed(sid, value)])
    assert reasons == []
    assert stored is not None
    for field in arrow:
        assert stored.schema.field(field.name).type == field.type
        assert stored.column(field.name).to_pylist() == [want[field.name]]


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_random_bytes_never_raise_out_of_the_parser(draw: st.DataObject) -> None:
    schema, _ = draw.draw(ROOTS)
    sid = _register(schema)
    payloads = st.binary(max_size=40) | ANY_JSON.map(lambda v: json.dumps(v).encode())
    records = st.one_of(st.none(), st.binary(max_size=40), payloads.map(lambda b: frame(sid, b)))
    values_ = draw.draw(st.lists(records, min_size=1, max_size=5))
    try:
        _store(values_)
    except RegistryUnavailableError:
        assert any(v is not None and len(v) >= 5 and v[0] == 0 and int.from_bytes(v[1:5], "big") != sid
                   for v in values_)


ORDER = {"type": "object", "properties": {
    "id": {"type": "integer"}, "ts": {"type": "string", "format": "date-time"},
    "day": {"type": ["string", "null"], "format": "date"},
    "customer": {"$ref": "#/$defs/customer"}, "items": {"type": "array", "items": {"type": "string"}}},
    "required": ["id", "ts"], "$defs": {"customer": {"type": "object", "properties": {"name": {"type": "string"}}}}}


def test_invalid_values_are_quarantined_with_the_validators_reason() -> None:
    sid = _register(ORDER)
    good = {"id": 1, "ts": "2026-11-24T08:30:00.123456789Z", "day": None, "customer": {"name": "c"}, "items": ["a"]}
    stored, reasons = _store([
        _framed(sid, good), _framed(sid, {"id": "x", "ts": "2026-11-24T08:30:00Z"}), _framed(sid, {"id": 2}),
        _framed(sid, {"id": 3, "ts": "yesterday"}), _framed(sid, {"id": 4, "ts": "2026-11-24T08:30:00"}),
        _framed(sid, [1]), frame(sid, b"{not json"), b"\x01{}    ",
        _framed(sid, {"id": 2**70, "ts": "2026-11-24T08:30Z"})])
    assert stored is not None
    assert stored.to_pylist()[0]["ts"] == dt.datetime(2026, 11, 24, 8, 30, 0, 123456, tzinfo=dt.UTC)
    assert stored.column("customer").to_pylist() == [{"name": "c"}]
    assert len(reasons) == 8
    joined = "\n".join(reasons)
    assert '"x" is not of type "integer"' in joined
    assert '"ts" is a required property' in joined
    assert "'yesterday' is not an RFC 3339 date-time" in joined
    assert "has no UTC offset" in joined
    assert "is not of type \"object\"" in joined
    assert "not JSON" in joined
    assert "magic byte" in joined
    assert "does not fit int64" in joined


def test_an_older_version_is_read_into_the_newest_columns_by_name() -> None:
    old = {"type": "object", "properties": {"id": {"type": "integer"}, "note": {"type": "string"}}}
    new = {"type": "object", "properties": {"id": {"type": "integer"}, "channel": {"type": "string"}}}
    old_id, new_id = _register(old), _register(new)
    stored, reasons = _store([_framed(old_id, {"id": 1, "note": "n"}), _framed(new_id, {"id": 2, "channel": "web"})])
    assert reasons == []
    assert stored is not None
    assert stored.column_names[-2:] == ["id", "channel"]
    assert stored.column("channel").to_pylist() == [None, "web"]


def test_schemas_that_cannot_be_used_quarantine_their_records() -> None:
    recursive = {"type": "object", "properties": {"next": {"$ref": "#"}}}
    remote = {"type": "object", "properties": {"x": {"$ref": "http://127.0.0.1:1/x.json"}}}
    scalar = {"type": "string"}
    ids = [_register(recursive), _register(remote), _register(scalar), _register("{not json")]
    stored, reasons = _store([frame(sid, b"{}") for sid in ids])
    assert stored is None
    assert any("recursive" in r for r in reasons)
    assert any("not local" in r or "not fetched" in r for r in reasons)
    assert any("does not describe an object" in r for r in reasons)
    assert any("is not JSON" in r for r in reasons)


def test_a_registry_that_does_not_answer_fails_the_chunk_and_quarantines_nothing() -> None:
    sid = _register(ORDER)
    with pytest.raises(RegistryUnavailableError, match=r"127\.0\.0\.1:1"):
        _store([_framed(sid, {"id": 1}), _framed(sid + 10**6, {"id": 2})])


def test_unions_and_objects_without_properties_are_json_text() -> None:
    assert jsonschema.arrow_type({"anyOf": [{"type": "string"}, {"type": "integer"}]}) == pa.string()
    assert jsonschema.arrow_type({"type": "object"}) == pa.string()
    with pytest.raises(SchemaError, match="recursive"):
        jsonschema.arrow_type({"$ref": "#"})
