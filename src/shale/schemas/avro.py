"""Avro writer schemas as Arrow types, and fastavro's decoded values as values of those types.

The mapping (docs/DESIGN.md, "Typed tables"):

=========================================  ==========================================================
Avro                                       Arrow
=========================================  ==========================================================
null, boolean, int, long, float, double    null, bool, int32, int64, float32, float64
string, bytes, fixed                       string, binary, binary
null inside an array or a map              bool, always null (Arrow 26 cannot cast a list of null)
record                                     struct (one field per Avro field, same order); a record with
                                           no fields inside another: ``EMPTY_RECORD`` (``schemas.empty``)
array, map                                 list, map<string, _>
enum                                       string (the symbol)
union [null, T] (either order)             T, nullable
any other union                            struct with one field per non-null branch, named by the branch
                                           (a named type's name, its full name when two branches share a
                                           short name, otherwise its Avro type name); the branch the value
                                           was written with is set, the others are null
decimal(p, s) on bytes or fixed            decimal128(p, s) (decimal256 beyond 38 digits; over 76 digits:
                                           ``SchemaError``; an invalid decimal is its bytes or fixed)
date                                       date32
time-millis, time-micros                   time32(ms), time64(us)
timestamp-millis, timestamp-micros         timestamp(us, UTC)
local-timestamp-millis, -micros            timestamp(us) (no time zone)
uuid                                       string
=========================================  ==========================================================

A union of both ``int`` and ``long`` (or ``float`` and ``double``) cannot tell its two numeric branches apart after
fastavro decodes them: such a value goes to the first of the two branches (its value is kept exactly).
Recursive schemas have no Arrow type: ``SchemaError``. A value an older writer schema wrote is converted into the
reader's column only where its meaning is kept (docs/DESIGN.md, "A value is what its writer meant"), else
``ConversionError``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import io
import json
import uuid
from collections.abc import Callable
from typing import Any

import fastavro
import pyarrow as pa
from fastavro.schema import fingerprint as _fingerprint
from fastavro.schema import to_parsing_canonical_form

from shale.schemas.avro_versions import columns_schema, reader_for, renames, same, tree
from shale.schemas.avroresolution import (
    EXACT,
    TIME_CONVERTERS,
    ConversionError,
    Converter,
    FastavroSchemas,
    SchemaError,
    decimal_converter,
    valid_decimal,
    without_invalid_decimals,
)
from shale.schemas.empty import EMPTY_RECORD, EMPTY_RECORD_VALUE

__all__ = ["MAX_DECIMAL_DIGITS", "PRIMITIVES", "ConversionError", "Decoder", "SchemaError", "aliases", "arrow_type",
           "columns_schema", "fingerprint", "full_name", "parse", "reader_for", "renames", "same", "tree"]

PRIMITIVES: dict[str, pa.DataType] = {
    "null": pa.null(), "boolean": pa.bool_(), "int": pa.int32(), "long": pa.int64(), "float": pa.float32(),
    "double": pa.float64(), "bytes": pa.binary(), "string": pa.string(),
}
_TIME_TYPES: dict[str, pa.DataType] = {
    "date": pa.date32(), "time-millis": pa.time32("ms"), "time-micros": pa.time64("us"),
    "timestamp-millis": pa.timestamp("us", tz="UTC"), "timestamp-micros": pa.timestamp("us", tz="UTC"),
    "local-timestamp-millis": pa.timestamp("us"), "local-timestamp-micros": pa.timestamp("us"),
}
_LOGICAL_BASE = {"date": "int", "time-millis": "int", "time-micros": "long", "timestamp-millis": "long",
                 "timestamp-micros": "long", "local-timestamp-millis": "long", "local-timestamp-micros": "long"}


MAX_DECIMAL_DIGITS = 76
"""The most digits an Arrow decimal (decimal256) holds."""


def _identity(value: Any) -> Any:
    return value


class _Walker:
    """Walks one schema, resolving references to named types it defined earlier."""

    def __init__(self, resolving: bool = False) -> None:
        self.named: dict[str, dict[str, Any]] = {}
        self.open: set[str] = set()
        self.resolving = resolving
        """Whether values come from another (older) writer schema: each converter then also takes what a
        compatible writer may have written there and converts it losslessly or raises ``ConversionError``."""

    def _full(self, schema: dict[str, Any], namespace: str) -> str:
        name = str(schema["name"])
        if "." in name:
            return name
        space = schema.get("namespace", namespace)
        return f"{space}.{name}" if space else name

    def resolve(self, schema: Any, namespace: str) -> tuple[Any, str]:
        """The schema a reference names (with the namespace it lives in), or ``schema`` itself."""
        if isinstance(schema, str) and schema not in PRIMITIVES:
            for key in (f"{namespace}.{schema}" if namespace else schema, schema):
                if key in self.named:
                    if key in self.open:
                        raise SchemaError(f"type {key!r} is recursive: a recursive schema has no Arrow type")
                    found = self.named[key]
                    return found, key.rpartition(".")[0]
            raise SchemaError(f"unknown type {schema!r}")
        return schema, namespace

    def branch_name(self, schema: Any, namespace: str) -> str:
        schema, namespace = self.resolve(schema, namespace)
        if isinstance(schema, str):
            return schema
        if isinstance(schema, list):
            raise SchemaError("a union cannot hold a union")
        if schema.get("type") in ("record", "error", "enum", "fixed"):
            return str(schema["name"]).rpartition(".")[2]
        return self.branch_name(schema["type"], namespace) if isinstance(schema["type"], str) \
            and schema["type"] in PRIMITIVES else str(schema["type"])

    def full_name(self, schema: Any, namespace: str) -> str | None:
        schema, namespace = self.resolve(schema, namespace)
        if isinstance(schema, dict) and schema.get("type") in ("record", "error", "enum", "fixed"):
            return self._full(schema, namespace)
        return None

    def compile(self, schema: Any, namespace: str = "") -> tuple[pa.DataType, Converter | None]:
        """The Arrow type of ``schema`` and a converter of fastavro's values to it (None: values are usable
        as they are)."""
        schema, namespace = self.resolve(schema, namespace)
        if isinstance(schema, str):
            return PRIMITIVES[schema], (EXACT.get(schema) if self.resolving else None)
        if isinstance(schema, list):
            return self._union(schema, namespace)
        if not isinstance(schema, dict) or "type" not in schema:
            raise SchemaError(f"not an Avro schema: {schema!r}")
        kind = schema["type"]
        logical = schema.get("logicalType")
        if logical == "decimal" and kind in ("bytes", "fixed") and valid_decimal(schema):
            if kind == "fixed":
                self._define(schema, namespace)
            precision, scale = int(schema["precision"]), int(schema.get("scale", 0))
            if precision > MAX_DECIMAL_DIGITS:
                raise SchemaError(f"decimal({precision}, {scale}) has more digits than the {MAX_DECIMAL_DIGITS} an "
                                  "Arrow decimal holds: register a version whose decimals have at most "
                                  f"{MAX_DECIMAL_DIGITS} digits and read these records again with `shale reprocess "
                                  "--schema-id` (values that do not fit it are quarantined with the reason)")
            arrow = pa.decimal128(precision, scale) if precision <= 38 else pa.decimal256(precision, scale)
            return arrow, (decimal_converter(scale) if self.resolving else None)
        if logical in _TIME_TYPES and kind == _LOGICAL_BASE[logical]:
            return _TIME_TYPES[logical], (TIME_CONVERTERS[logical] if self.resolving else None)
        if logical == "uuid" and kind in ("string", "fixed"):
            if kind == "fixed":
                self._define(schema, namespace)
            return pa.string(), _uuid_text
        if self.resolving and kind in EXACT:
            return PRIMITIVES[kind], EXACT[kind]
        if isinstance(kind, str) and kind in PRIMITIVES:
            return PRIMITIVES[kind], None
        if kind in ("record", "error"):
            return self._record(schema, namespace)
        if kind == "enum":
            self._define(schema, namespace)
            return pa.string(), None
        if kind == "fixed":
            self._define(schema, namespace)
            return pa.binary(), None
        if kind == "array":
            item_type, item = self.compile(schema["items"], namespace)
            return pa.list_(without_null_type(item_type)), None if item is None else _each(item)
        if kind == "map":
            value_type, value = self.compile(schema["values"], namespace)
            return pa.map_(pa.string(), without_null_type(value_type)), _entries(value or _identity)
        if isinstance(kind, dict | list | str):
            return self.compile(kind, namespace)
        raise SchemaError(f"not an Avro schema: {schema!r}")

    def _define(self, schema: dict[str, Any], namespace: str) -> str:
        full = self._full(schema, namespace)
        self.named[full] = schema
        return full

    def _record(self, schema: dict[str, Any], namespace: str) -> tuple[pa.DataType, Converter | None]:
        full = self._define(schema, namespace)
        own = full.rpartition(".")[0]
        self.open.add(full)
        fields, converters = [], {}
        for f in schema.get("fields", []):
            arrow, convert = self.compile(f["type"], own)
            fields.append(pa.field(str(f["name"]), arrow))
            if convert is not None:
                converters[str(f["name"])] = convert
        self.open.discard(full)
        if not fields:  # Parquet cannot write a struct without children: the marker stands for the empty record
            return EMPTY_RECORD, _empty_record
        if not converters:
            return pa.struct(fields), None

        def record(value: dict[str, Any]) -> dict[str, Any]:
            out = dict(value)
            for name, convert in converters.items():
                if out.get(name) is not None:
                    out[name] = convert(out[name])
            return out
        return pa.struct(fields), record

    def _union(self, branches: list[Any], namespace: str) -> tuple[pa.DataType, Converter | None]:
        others = [b for b in branches if b != "null"]
        if not others:
            return pa.null(), None
        if len(others) == 1:
            arrow, convert = self.compile(others[0], namespace)
            named = self.full_name(others[0], namespace)
            if named is None:
                return arrow, convert
            inner = convert or _identity
            return arrow, lambda v: None if v is None else inner(v[1] if isinstance(v, tuple) else v)  # (name, value)
        compiled, fields = [], []
        short = [self.branch_name(b, namespace) for b in others]
        if self.resolving and len(set(short)) < len(short):
            raise SchemaError(f"the union holds named types of one short name {short}: fastavro resolves an older "
                              "writer's branch by short name and could pick the wrong one, so this writer version "
                              "cannot be read into the newest one; read its records as their own schema with `shale "
                              "reprocess --schema-id`")
        for b, brief in zip(others, short, strict=True):
            # Two named types of one short name (in different namespaces) are told apart by their full names.
            name = self.full_name(b, namespace) or brief if short.count(brief) > 1 else brief
            arrow, convert = self.compile(b, namespace)
            fields.append(pa.field(name, arrow))
            matcher = _matcher(self.resolve(b, namespace)[0])
            if self.resolving and brief in ("float", "double") and not {"int", "long"} & set(short):
                matcher = _number  # an older writer's integer (fastavro keeps it: ``_integer_first``), checked exact
            compiled.append((name, self.full_name(b, namespace), matcher,
                             convert or _identity))
        names = [c[0] for c in compiled]
        if len(set(names)) < len(names):
            raise SchemaError(f"the union's branches {names} cannot be told apart by name: a union needs one "
                              "column field per branch")
        struct = pa.struct(fields)

        def union(value: Any) -> dict[str, Any] | None:
            if value is None:  # the null branch: the struct itself is null
                return None
            out: dict[str, Any] = dict.fromkeys(names)
            if isinstance(value, tuple):  # a named type's value: (full name, value)
                for name, full, _, convert in compiled:
                    if full == value[0]:
                        out[name] = convert(value[1])
                        return out
            for name, full, matches, convert in compiled:
                if full is None and matches(value):
                    out[name] = convert(value)
                    return out
            raise SchemaError(f"no branch of the union holds a {type(value).__name__}")
        return struct, union


def without_null_type(t: pa.DataType) -> pa.DataType:
    """``t`` with every ``null`` type inside it an always-null boolean: Arrow 26 cannot cast a list or map holding a
    null-typed column to its own type (the cast leaves the child one value short), and ingest and queries cast each
    column; the values, all null, are the same."""
    if pa.types.is_null(t):
        return pa.bool_()
    if pa.types.is_struct(t):
        return pa.struct([t.field(i).with_type(without_null_type(t.field(i).type)) for i in range(t.num_fields)])
    if pa.types.is_map(t):
        return pa.map_(t.key_type, without_null_type(t.item_type))
    if pa.types.is_list(t):
        return pa.list_(without_null_type(t.value_type))
    return t


def _empty_record(value: Any) -> dict[str, bool]:
    return EMPTY_RECORD_VALUE


def _each(convert: Converter) -> Converter:
    return lambda values: [None if x is None else convert(x) for x in values]


def _entries(convert: Converter) -> Converter:
    return lambda values: [(k, None if x is None else convert(x)) for k, x in values.items()]


def _uuid_text(value: Any) -> str:
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, bytes):
        return str(uuid.UUID(bytes=value))
    if isinstance(value, str):
        return value
    raise ConversionError(f"{value!r} was written as another kind of value than a uuid")


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _matcher(schema: Any) -> Callable[[Any], bool]:
    """Does a decoded value belong to this (unnamed) union branch? Checked in branch order."""
    kind = schema if isinstance(schema, str) else schema.get("type")
    logical = None if isinstance(schema, str) else schema.get("logicalType")
    if logical == "decimal":
        return lambda v: isinstance(v, decimal.Decimal)
    if logical == "uuid":
        return lambda v: isinstance(v, uuid.UUID | str)
    if logical == "date":
        return lambda v: isinstance(v, dt.date) and not isinstance(v, dt.datetime)
    if logical in ("time-millis", "time-micros"):
        return lambda v: isinstance(v, dt.time)
    if logical in ("timestamp-millis", "timestamp-micros"):
        return lambda v: isinstance(v, dt.datetime) and v.tzinfo is not None
    if logical in ("local-timestamp-millis", "local-timestamp-micros"):
        return lambda v: isinstance(v, dt.datetime) and v.tzinfo is None
    checks: dict[str, Callable[[Any], bool]] = {
        "boolean": lambda v: isinstance(v, bool),
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "long": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "float": lambda v: isinstance(v, float),
        "double": lambda v: isinstance(v, float),
        "string": lambda v: isinstance(v, str),
        "bytes": lambda v: isinstance(v, bytes),
        "array": lambda v: isinstance(v, list),
        "map": lambda v: isinstance(v, dict),
    }
    return checks.get(str(kind), lambda v: False)


def parse(text: str | dict[str, Any] | list[Any]) -> Any:
    """A schema as JSON data (from the registry's text)."""
    if isinstance(text, str):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise SchemaError(f"the schema is not JSON: {exc}") from None
    return text


def full_name(schema: Any) -> str:
    """A named schema's full name (``namespace.name``); a primitive's type name; '' when it is neither."""
    try:
        found = parse(schema)
    except SchemaError:
        return ""
    if isinstance(found, str):
        return found
    if not isinstance(found, dict) or not isinstance(found.get("name", found.get("type")), str):
        return ""
    name = str(found.get("name") or found["type"])
    namespace = found.get("namespace")
    return f"{namespace}.{name}" if "name" in found and namespace and "." not in name else name


def aliases(schema: Any) -> set[str]:
    """The full names a named schema answers to besides its own (its ``aliases``: a renamed record)."""
    try:
        found = parse(schema)
    except SchemaError:
        return set()
    if not isinstance(found, dict) or not isinstance(found.get("aliases"), list):
        return set()
    namespace = found.get("namespace")
    return {a if "." in a or not namespace else f"{namespace}.{a}" for a in found["aliases"] if isinstance(a, str)}


def _compile(schema: Any, resolving: bool = False) -> tuple[pa.DataType, Converter | None]:
    """``_Walker.compile``, every failure a ``SchemaError``: a schema the registry accepted must quarantine its
    records with the reason, never fail the task (which would stall the group)."""
    try:
        arrow, convert = _Walker(resolving).compile(without_invalid_decimals(schema))
        if arrow == EMPTY_RECORD:  # a top-level record with no fields: a value with no columns, nothing to mark
            return pa.struct([]), lambda value: {}
        return arrow, convert
    except SchemaError:
        raise
    except (KeyError, ValueError, TypeError, IndexError, AttributeError, pa.ArrowException) as exc:
        raise SchemaError(f"the schema has no Arrow type: {type(exc).__name__}: {exc}"[:600]) from None


def arrow_type(schema: Any) -> pa.DataType:
    """The Arrow type of an Avro schema (see the table above)."""
    return _compile(parse(schema))[0]


def fingerprint(schema: Any) -> str:
    """SHA-256 of the schema's Parsing Canonical Form (the Avro specification's fingerprint), 16 hex digits."""
    try:
        parsed = fastavro.parse_schema(without_invalid_decimals(parse(schema)), _write_hint=False)
        canonical = to_parsing_canonical_form(parsed)
    except Exception as exc:  # fastavro raises several kinds on a bad schema
        raise SchemaError(f"invalid Avro schema: {exc}") from None
    return str(_fingerprint(canonical, "SHA-256"))[:16]


class Decoder:
    """Decodes Avro binary written with ``writer`` into Python values of ``arrow_type(reader)``; the reader schema
    (default: the writer's) resolves a compatible older writer schema into the newer one (defaults filled in)."""

    def __init__(self, writer: Any, reader: Any = None) -> None:
        self.writer_json = parse(writer)
        self.reader_json = parse(reader) if reader is not None else self.writer_json
        try:
            writer_json, reader_json = without_invalid_decimals(self.writer_json), without_invalid_decimals(
                self.reader_json)
            if reader is not None:  # what fastavro is given to resolve with (see ``FastavroSchemas``)
                names = _Walker()
                with contextlib.suppress(SchemaError, KeyError, TypeError, ValueError):
                    names.compile(writer_json)  # defines the writer's named types, to follow its references
                fit = FastavroSchemas(names.resolve)
                writer_json = fit.unlogical(writer_json, reader_json)
                reader_json = fit.rewrite(writer_json, reader_json)
            self._writer = fastavro.parse_schema(writer_json)
            self._reader = None if reader is None else fastavro.parse_schema(reader_json)
        except SchemaError:
            raise
        except Exception as exc:  # fastavro raises several kinds on a bad schema
            raise SchemaError(f"invalid Avro schema: {exc}") from None
        # fastavro reads each value as its WRITER schema means it (the writer's logical types); an older writer's
        # value is then converted to the reader's column only where that keeps its meaning (``ConversionError``).
        self.arrow, convert = _compile(self.reader_json, resolving=reader is not None)
        self._convert = convert or _identity

    def decode(self, body: bytes | memoryview) -> Any:
        """The datum; ``ValueError`` (or any other exception of fastavro) on bytes that are not one datum."""
        stream = io.BytesIO(body)
        datum = fastavro.schemaless_reader(stream, self._writer, self._reader, return_named_type=True)
        if stream.tell() != len(body):
            raise ValueError(f"{len(body) - stream.tell()} bytes follow the Avro datum")
        return self._convert(datum)
