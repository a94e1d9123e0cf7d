"""JSON Schemas from a Schema Registry as Arrow types, JSON values validated against them and converted to those
types.

The mapping (docs/DESIGN.md, "Typed tables"):

=============================================  ==========================================================
JSON Schema                                    Arrow
=============================================  ==========================================================
string / integer / number / boolean / null     string / int64 / float64 / bool / null
string with format date-time                   timestamp(us, UTC) (RFC 3339; digits past the microsecond
                                               floored; a time without an offset is refused)
string with format date                        date32
object with properties                         struct, one field per property in the order declared
                                               (other keys of the value are dropped)
object with only additionalProperties: T       map<string, T>
array with items: T                            list<T>
type [T, "null"], oneOf/anyOf [T, null]        T, nullable (every field is nullable: an absent property is
                                               null)
enum or const of strings                       string
local $ref (#/definitions/..., #/$defs/...)    the type it points at
anything else (several non-null types, other   string: the value as JSON text (keys sorted)
unions, allOf, an object without properties,
an array without one items schema)
=============================================  ==========================================================

Recursive references have no Arrow type: ``SchemaError``. Validation uses the schema as written (its draft named by
``$schema``, 2020-12 when absent), with remote references never fetched: a schema that needs one is an error.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Callable
from typing import Any

import jsonschema_rs
import orjson
import pyarrow as pa

from shale.schemas.avro import SchemaError

Converter = Callable[[Any], Any]
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_SCALARS: dict[str, pa.DataType] = {"string": pa.string(), "integer": pa.int64(), "number": pa.float64(),
                                    "boolean": pa.bool_(), "null": pa.null()}


class InvalidValueError(ValueError):
    """A value that does not validate against its schema, or that its typed column cannot hold; ``str`` says why."""


def _json_text(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def _timestamp(value: Any) -> int:
    if not isinstance(value, str):
        raise InvalidValueError(f"{value!r} is not a date-time string")
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        raise InvalidValueError(f"{value!r} is not an RFC 3339 date-time") from None
    if parsed.tzinfo is None:
        raise InvalidValueError(f"{value!r} has no UTC offset (RFC 3339 date-time requires one)")
    return (parsed - _EPOCH) // dt.timedelta(microseconds=1)


def _date(value: Any) -> dt.date:
    if not isinstance(value, str) or len(value) != 10:
        raise InvalidValueError(f"{value!r} is not a date (YYYY-MM-DD)")
    try:
        return dt.date.fromisoformat(value)
    except ValueError:
        raise InvalidValueError(f"{value!r} is not a date (YYYY-MM-DD)") from None


def _integer(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value  # 1.0 is an integer to JSON Schema


def _number(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        if float(value) != value:  # a float64 column would hold another number
            raise InvalidValueError(f"{value} is an integer a double does not hold exactly (it would be "
                                    f"{float(value)!r})")
        return float(value)
    return value


class _Compiler:
    def __init__(self, root: Any) -> None:
        self.root = root
        self.open: set[str] = set()

    def _resolve(self, ref: str) -> Any:
        if not ref.startswith("#"):
            raise SchemaError(f"reference {ref!r} is not local to the schema (registry references are not built)")
        found = self.root
        for part in [p for p in ref[1:].split("/") if p]:
            key = part.replace("~1", "/").replace("~0", "~")
            if isinstance(found, dict) and key in found:
                found = found[key]
            elif isinstance(found, list) and key.isdigit() and int(key) < len(found):
                found = found[int(key)]
            else:
                raise SchemaError(f"reference {ref!r} points at nothing in the schema")
        return found

    def compile(self, schema: Any) -> tuple[pa.DataType, Converter | None]:
        """The Arrow type of ``schema`` and a converter of JSON values to it (None: usable as they are)."""
        if schema is True or schema == {}:
            return pa.string(), _json_text
        if not isinstance(schema, dict):
            raise SchemaError(f"not a JSON Schema: {schema!r}")
        if "$ref" in schema:
            ref = str(schema["$ref"])
            if ref in self.open:
                raise SchemaError(f"reference {ref!r} is recursive: a recursive schema has no Arrow type")
            self.open.add(ref)
            try:
                return self.compile(self._resolve(ref))
            finally:
                self.open.discard(ref)
        for keyword in ("oneOf", "anyOf"):
            if keyword in schema:
                branches = [b for b in schema[keyword] if not (isinstance(b, dict) and b.get("type") == "null")]
                if len(branches) == 1 and set(schema) - {keyword, "title", "description", "$schema", "$id",
                                                          "definitions", "$defs"} <= {"type"}:
                    return self.compile(branches[0])
                return pa.string(), _json_text
        if "allOf" in schema:
            return pa.string(), _json_text
        kind = schema.get("type")
        if isinstance(kind, list):
            kinds = [k for k in kind if k != "null"]
            if len(kinds) != 1:
                return (pa.null(), None) if not kinds else (pa.string(), _json_text)
            kind = kinds[0]
        if kind is None:
            values = schema.get("enum", [schema["const"]] if "const" in schema else None)
            if values and all(isinstance(v, str) for v in values):
                return pa.string(), None
            return pa.string(), _json_text
        if kind == "string":
            if schema.get("format") == "date-time":
                return pa.timestamp("us", tz="UTC"), _timestamp
            if schema.get("format") == "date":
                return pa.date32(), _date
            return pa.string(), None
        if kind == "number":
            return pa.float64(), _number
        if kind == "integer":
            return pa.int64(), _integer
        if kind in _SCALARS:
            return _SCALARS[kind], None
        if kind == "array":
            items = schema.get("items")
            if not isinstance(items, dict):
                return pa.list_(pa.string()), lambda vs: [_json_text(v) for v in vs]
            item_type, item = self.compile(items)
            if item is None:
                return pa.list_(item_type), None
            each = item
            return pa.list_(item_type), lambda vs: [None if v is None else each(v) for v in vs]
        if kind == "object":
            return self._object(schema)
        raise SchemaError(f"unknown JSON Schema type {kind!r}")

    def _object(self, schema: dict[str, Any]) -> tuple[pa.DataType, Converter | None]:
        properties = schema.get("properties")
        if not properties:
            extra = schema.get("additionalProperties")
            if isinstance(extra, dict):
                value_type, value = self.compile(extra)
                each: Converter = value or (lambda v: v)
                return pa.map_(pa.string(), value_type), \
                    lambda d: [(k, None if v is None else each(v)) for k, v in d.items()]
            return pa.string(), _json_text
        fields, converters = [], []
        for name, sub in properties.items():
            arrow, convert = self.compile(sub)
            fields.append(pa.field(str(name), arrow))
            converters.append((str(name), convert))

        def record(value: dict[str, Any]) -> dict[str, Any]:
            out = {}
            for name, convert in converters:
                found = value.get(name)
                if found is not None and convert is not None:
                    try:
                        found = convert(found)
                    except InvalidValueError as exc:
                        raise InvalidValueError(f"{name}: {exc}") from None
                out[name] = found
            return out
        return pa.struct(fields), record


def _no_remote(uri: str) -> Any:
    raise ValueError(f"remote reference {uri} is not fetched")


def arrow_type(schema: Any) -> pa.DataType:
    return _Compiler(schema).compile(schema)[0]


def fingerprint(schema: Any) -> str:
    """SHA-256 of the schema as canonical JSON (keys sorted, no spaces), 16 hex digits."""
    return hashlib.sha256(_json_text(schema).encode()).hexdigest()[:16]


class Decoder:
    """Reads one JSON value written with ``schema`` (its text from the registry): validated, then converted into a
    value of ``arrow`` (a struct for an object schema)."""

    def __init__(self, text: str) -> None:
        try:
            self.schema = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SchemaError(f"the schema is not JSON: {exc}") from None
        try:
            self._validator = jsonschema_rs.validator_for(self.schema, retriever=_no_remote)
        except (jsonschema_rs.ValidationError, ValueError, TypeError) as exc:
            raise SchemaError(f"invalid JSON Schema: {str(exc).splitlines()[0]}"[:600]) from None
        self.arrow, convert = _Compiler(self.schema).compile(self.schema)
        self._convert = convert or (lambda v: v)

    def decode(self, body: bytes | memoryview) -> Any:
        """The value; ``InvalidValueError`` with the reason: not JSON, not valid, or not convertible."""
        return self.convert(self.read(body))

    def convert(self, value: Any) -> Any:
        """A valid JSON value (of this schema or of an older version's) as a value of ``arrow``; the JSON value is
        what its writer meant, so a version's columns convert it from the JSON, never from another version's
        typed value. ``InvalidValueError`` when the column cannot hold it."""
        return self._convert(value) if value is not None else None

    def read(self, body: bytes | memoryview) -> Any:
        """The JSON value, validated against this schema; ``InvalidValueError`` with the reason."""
        try:
            value = orjson.loads(body)
        except orjson.JSONDecodeError:
            try:  # json reads what orjson refuses but JSON allows (integers past 64 bits)
                value = json.loads(bytes(body))
            except (ValueError, UnicodeDecodeError) as exc:
                raise InvalidValueError(f"the payload is not JSON: {exc}") from None
        for error in self._validator.iter_errors(value):
            where = "/".join(str(p) for p in error.instance_path) or "the value"
            raise InvalidValueError(f"{where}: {error.message}"[:1000])
        return value
