"""How a value an older Avro writer schema wrote becomes a value of the reader schema's Arrow column: only where its
meaning is kept (docs/DESIGN.md, "A value is what its writer meant"), else ``ConversionError`` and the record is
quarantined with the reason. fastavro reads each value as its writer schema means it (the writer's logical types);
these converters take that value into the reader's column.

Also the Avro specification's rule for invalid decimals: such a logical type is ignored (``valid_decimal``,
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
