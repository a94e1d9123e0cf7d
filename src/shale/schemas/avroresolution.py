"""How a value an older Avro writer schema wrote becomes a value of the reader schema's Arrow column: only where its
meaning is kept (docs/DESIGN.md, "A value is what its writer meant"), else ``ConversionError`` and the record is
quarantined with the reason. fastavro reads each value as its writer schema means it (the writer's logical types);
these converters take that value into the reader's column.

``FastavroSchemas`` fits the writer and reader schemas given to fastavro so that it reads what was written (a
logical type removed, an integer read as a float kept for the exact check, an enum default not substituted). Also
the Avro specification's rule for invalid decimals: such a logical type is ignored (``valid_decimal``,
``without_invalid_decimals``).
"""

from __future__ import annotations

import datetime as dt
import decimal
import struct
import uuid
from collections.abc import Callable
from typing import Any

Converter = Callable[[Any], Any]
_PRIMITIVE_NAMES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})


class SchemaError(ValueError):
    """An Avro schema that is invalid or has no Arrow type (a recursive record, a decimal of over 76 digits)."""


class ConversionError(ValueError):
    """A value an older writer schema wrote that its column (the reader schema's type) cannot hold with the same
    meaning; the record is quarantined with this reason, never stored as another value."""


def valid_decimal(schema: dict[str, Any]) -> bool:
    """Whether a decimal logical type is valid (the Avro specification: a positive precision, a scale from 0 to
    the precision, digits a fixed's size holds). An invalid one is ignored, as the specification says: the value is
    its underlying bytes or fixed."""
    precision, scale = schema.get("precision"), schema.get("scale", 0)
    if not isinstance(precision, int) or isinstance(precision, bool) or precision < 1:
        return False
    if not isinstance(scale, int) or isinstance(scale, bool) or not 0 <= scale <= precision:
        return False
    size = schema.get("size")
    if schema.get("type") == "fixed":
        return isinstance(size, int) and size > 0 and 10 ** precision <= 2 ** (8 * size - 1)
    return True


def without_invalid_decimals(schema: Any) -> Any:
    """``schema`` without its invalid decimal logical types (what fastavro is given, so that it reads such a value
    as the bytes it is rather than failing on it)."""
    if isinstance(schema, list):
        return [without_invalid_decimals(b) for b in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: (without_invalid_decimals(v) if k in ("type", "items", "values") else v) for k, v in schema.items()}
    if isinstance(schema.get("fields"), list):
        out["fields"] = [{**f, "type": without_invalid_decimals(f["type"])}
                         if isinstance(f, dict) and "type" in f else f for f in schema["fields"]]
    if out.get("logicalType") == "decimal" and not valid_decimal(out):
        del out["logicalType"]
    return out


# What an older writer schema may put where the reader has a logical type: its own logical type's value, which must
# mean the same kind of thing, or a number written without a logical type, which takes the reader's (Avro's
# resolution: the reader's logical type says what the number is). Integers are converted to what Arrow's column
# type takes as an integer (microseconds for a timestamp, days for a date, the unit for a time).

def _instant(scale: int, aware: bool) -> Converter:
    word = "an instant (timestamp)" if aware else "a local date and time (local-timestamp)"

    def convert(value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            return value * scale
        if isinstance(value, dt.datetime) and (value.tzinfo is not None) == aware:
            return value
        raise ConversionError(f"{value!r} was written as another kind of value than {word}: its meaning would change")
    return convert


def _day(value: Any) -> Any:
    if (isinstance(value, int) and not isinstance(value, bool)) \
            or (isinstance(value, dt.date) and not isinstance(value, dt.datetime)):
        return value
    raise ConversionError(f"{value!r} was written as another kind of value than a date: its meaning would change")


def _clock(millis: bool) -> Converter:
    day = 86_400_000 if millis else 86_400_000_000

    def convert(value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < day:
            return value
        if isinstance(value, dt.time) and not (millis and value.microsecond % 1000):
            return value
        raise ConversionError(f"{value!r} was written as another kind of value than a time of day"
                              f"{' in milliseconds' if millis else ''}: its meaning would change")
    return convert


TIME_CONVERTERS: dict[str, Converter] = {
    "timestamp-millis": _instant(1000, aware=True), "timestamp-micros": _instant(1, aware=True),
    "local-timestamp-millis": _instant(1000, aware=False), "local-timestamp-micros": _instant(1, aware=False),
    "date": _day, "time-millis": _clock(millis=True), "time-micros": _clock(millis=False),
}


def decimal_converter(scale: int) -> Converter:
    def convert(value: Any) -> Any:
        if isinstance(value, decimal.Decimal):
            return value  # Arrow refuses one its precision and scale do not hold exactly: quarantined
        if isinstance(value, bytes):  # written without the logical type: the reader's scale says what it is
            return decimal.Decimal(int.from_bytes(value, "big", signed=True)).scaleb(
                -scale, context=decimal.Context(prec=len(value) * 3 + 2))
        raise ConversionError(f"{value!r} was written as another kind of value than a decimal")
    return convert


def _float32(value: Any) -> Any:
    if isinstance(value, float) or value is None:
        return value
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConversionError(f"{value!r} was written as another kind of value than a number")
    exact = struct.unpack("f", struct.pack("f", float(value)))[0]
    if exact != value:
        raise ConversionError(f"{value} was written as an integer that a float (32 bits) does not hold exactly "
                              f"(it would be {exact!r})")
    return exact


def _float64(value: Any) -> Any:
    if isinstance(value, float) or value is None:
        return value
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConversionError(f"{value!r} was written as another kind of value than a number")
    if float(value) != value:
        raise ConversionError(f"{value} was written as an integer that a double does not hold exactly "
                              f"(it would be {float(value)!r})")
    return float(value)


def _text(value: Any) -> Any:
    if isinstance(value, str):
        return value
    if isinstance(value, uuid.UUID):  # a uuid read as a plain string: its text, as written
        return str(value)
    raise ConversionError(f"{value!r} was written as another kind of value than a string")


EXACT: dict[str, Converter] = {"float": _float32, "double": _float64, "string": _text}


def _base(schema: Any) -> tuple[Any, str | None]:
    """A schema's Avro type (a name, a list for a union) and its logical type."""
    if isinstance(schema, dict):
        kind = schema.get("type")
        return (_base(kind)[0] if isinstance(kind, dict) else kind), schema.get("logicalType")
    return schema, None


_NAMED = ("record", "error", "enum", "fixed")
_INTEGER_MATCHES = {"int": ("int", "long", "float", "double"), "long": ("long", "float", "double")}


def _integer_first(kind: str, union: list[Any]) -> list[Any]:
    """A reader union given to fastavro in which a writer's ``kind`` (int or long) matches an integer branch
    before any float or double one (fastavro takes the first branch that matches, and would promote unchecked):
    the union's own integer branch moved ahead of it, or the writer's type added there. The union's Arrow column
    is the reader's own; its float and double branches take an integer only when it is held exactly."""
    matches = [i for i, b in enumerate(union) if _base(b)[0] in _INTEGER_MATCHES[kind] and _base(b)[1] is None]
    if not matches or _base(union[matches[0]])[0] in ("int", "long"):
        return union
    first = matches[0]
    own = next((i for i in matches if _base(union[i])[0] in ("int", "long")), None)
    if own is None:
        return [*union[:first], kind, *union[first:]]
    return [*union[:first], union[own], *(b for i, b in enumerate(union[first:], first) if i != own)]


def _short(schema: Any) -> str:
    return str(schema.get("name", "")).rpartition(".")[2] if isinstance(schema, dict) else str(schema)


class FastavroSchemas:
    """fastavro promotes an int or long read as a float or double without checking that the number survives
    (2**60 + 1 would become 2**60). This rewrites the reader schema given to fastavro so that such a position keeps
    the writer's integer and the column's converter checks it (``_float64``); where the integer would go into a
    union, the writer version cannot be read without that risk and is refused (``SchemaError``)."""

    def __init__(self, resolve: Callable[[str, str], tuple[Any, str]]) -> None:
        self.resolve = resolve
        """Finds a named type the writer schema defined, by a reference and the namespace it appears in."""

    def rewrite(self, writer: Any, reader: Any, namespace: str = "") -> Any:
        if isinstance(writer, str) and writer not in _PRIMITIVE_NAMES:
            try:
                writer, namespace = self.resolve(writer, namespace)
            except SchemaError:
                return reader
        kind, logical = _base(writer)
        if isinstance(kind, list):
            integers = [b for b in kind if _base(b) in (("int", None), ("long", None))]
            if integers and isinstance(reader, list):
                for branch in integers:
                    reader = _integer_first(_base(branch)[0], reader)
                return reader
            if integers and self._promotes(reader):
                raise SchemaError("an integer branch of the writer's union would be read as a float or double by "
                                  "fastavro, unchecked: this writer version cannot be read into the newest one "
                                  "exactly")
            return reader
        rkind, rlogical = _base(reader)
        if kind in ("int", "long") and logical is None:
            if rkind in ("float", "double") and rlogical is None:
                return kind if isinstance(reader, str) else {**reader, "type": kind}
            return _integer_first(kind, reader) if isinstance(reader, list) else reader
        if not isinstance(writer, dict) or not isinstance(reader, dict) or rkind != kind:
            return reader
        if kind == "enum" and "default" in reader:
            # Avro reads a symbol the reader lacks as the reader enum's default: another value than the one written.
            # Without it fastavro refuses the record, which is quarantined with the symbol named.
            return {k: v for k, v in reader.items() if k != "default"}
        if kind == "array":
            return {**reader, "items": self.rewrite(writer["items"], reader["items"], namespace)}
        if kind == "map":
            return {**reader, "values": self.rewrite(writer["values"], reader["values"], namespace)}
        if kind in ("record", "error"):
            own = str(writer.get("namespace", namespace)) if "." not in str(writer.get("name")) \
                else str(writer["name"]).rpartition(".")[0]
            written = {str(f["name"]): f for f in writer.get("fields", [])}
            fields = []
            for field in reader.get("fields", []):
                found = next((written[n] for n in [field["name"], *field.get("aliases", [])] if n in written), None)
                fields.append(field if found is None else {**field, "type": self.rewrite(found["type"], field["type"],
                                                                                          own)})
            return {**reader, "fields": fields}
        return reader

    def unlogical(self, writer: Any, reader: Any) -> Any:
        """The writer schema given to fastavro: without a logical type where the reader reads the same Avro type
        without one (a logical type removed), so that the value is the number, bytes or string written (Avro's
        resolution) rather than the writer's typed value, which the plain column could not hold."""
        if isinstance(writer, list):
            return [self.unlogical(b, reader) for b in writer]
        if not isinstance(writer, dict):
            return writer  # a primitive, or a named type defined (and rewritten) where it first appears
        if isinstance(reader, list):  # fastavro reads into the first branch that matches: the same kind here
            kind = _base(writer)[0]
            reader = next((b for b in reader if _base(b)[0] == kind
                           and (kind not in _NAMED or _short(b) == _short(writer))), None)
        if not isinstance(reader, dict | str):
            return writer
        kind, logical = _base(writer)
        rkind, rlogical = _base(reader)
        if logical is not None and isinstance(kind, str) and rlogical is None \
                and (rkind == kind or (kind, rkind) == ("int", "long")) and not isinstance(writer.get("type"), dict):
            return {k: v for k, v in writer.items() if k not in ("logicalType", "precision", "scale")}
        if not isinstance(reader, dict) or rkind != kind:
            return writer
        if kind == "array":
            return {**writer, "items": self.unlogical(writer["items"], reader["items"])}
        if kind == "map":
            return {**writer, "values": self.unlogical(writer["values"], reader["values"])}
        if kind in ("record", "error"):
            readers = {str(n): f for f in reader.get("fields", []) for n in [f["name"], *f.get("aliases", [])]}
            return {**writer, "fields": [{**f, "type": self.unlogical(f["type"], readers[f["name"]]["type"])}
                                         if f.get("name") in readers else f for f in writer.get("fields", [])]}
        return writer

    @staticmethod
    def _promotes(union: Any) -> bool:
        """Whether a union would take an integer into a float or double branch (it has one and no integer one)."""
        kinds = [_base(b)[0] for b in union] if isinstance(union, list) else [_base(union)[0]]
        return any(k in ("float", "double") for k in kinds) and not any(k in ("int", "long") for k in kinds)
