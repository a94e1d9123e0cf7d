"""Declared types of ``json`` and ``msgpack`` fields (a rule's ``types``): a field's value is stored in its declared
column type only when the type holds it exactly; otherwise the record is quarantined naming the column, the value
and the type. Nothing is coerced: a string is not read as a number, a boolean is not an integer, a fraction is not
rounded.

* ``string`` (undeclared fields too): a string as it is, any other value as its JSON text.
* ``long``: an integer in 64 bits.
* ``double``: a number whose value a double holds exactly (an integer beyond 2**53 that it would round is refused).
* ``boolean``: true or false.
* ``timestamp``: an ISO 8601 string (a time without a zone is in the rule's ``timezone``), stored in microseconds.
* ``decimal(P,S)``: a number or a numeric string, read from its text (never through a float), with at most S
  fraction digits and P digits in all. A msgpack float is read from its shortest text (``repr``).
"""

from __future__ import annotations

import datetime as dt
import decimal
import re
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from shale.encoder.parsers.base import ParseError

DECIMAL = re.compile(r"^decimal\((\d+),\s*(\d+)\)$")
NAMES = ("string", "long", "double", "boolean", "timestamp")
TYPE_HELP = "string, long, double, boolean, timestamp or decimal(P,S) (1 <= P <= 38, S <= P)"
TIMESTAMP_US = pa.timestamp("us", tz="UTC")


def check_type(name: str) -> str:
    """The declared type's name, or a ValueError naming what is allowed."""
    found = DECIMAL.match(name)
    if name in NAMES or (found and 1 <= int(found[1]) <= 38 and int(found[2]) <= int(found[1])):
        return name
    raise ValueError(f"type {name!r} is not one of {TYPE_HELP}")


def arrow_type(name: str) -> pa.DataType:
    found = DECIMAL.match(name)
    if found:
        return pa.decimal128(int(found[1]), int(found[2]))
    return {"string": pa.string(), "long": pa.int64(), "double": pa.float64(), "boolean": pa.bool_(),
            "timestamp": TIMESTAMP_US}[name]


def _refuse(column: str, value: Any, name: str) -> ParseError:
    return ParseError(f"column {column!r}: {value!r} is not a {name} (declared in the rule's types)"[:1000])


def converter(name: str, timestamp: Callable[[str], int]) -> Callable[[str, Any], Any]:
    """The function that makes a field's value (as decoded, never None) its declared type's value, or raises a
    ParseError. ``timestamp`` reads an ISO 8601 string into microseconds."""
    if name == "long":
        def to_long(column: str, value: Any) -> Any:
            if type(value) is int and -2**63 <= value < 2**63:
                return value
            raise _refuse(column, value, "64-bit integer")
        return to_long
    if name == "double":
        def to_double(column: str, value: Any) -> Any:
            if type(value) is float:
                return value
            if type(value) is int and abs(value) <= 2**1023 and int(float(value)) == value:
                return float(value)
            raise _refuse(column, value, "number a double holds exactly")
        return to_double
    if name == "boolean":
        def to_boolean(column: str, value: Any) -> Any:
            if type(value) is bool:
                return value
            raise _refuse(column, value, "boolean")
        return to_boolean
    if name == "timestamp":
        def to_timestamp(column: str, value: Any) -> Any:
            if isinstance(value, str):
                try:
                    return timestamp(value)
                except ParseError as exc:
                    raise ParseError(f"column {column!r}: {exc.reason}") from None
            raise _refuse(column, value, "ISO 8601 time")
        return to_timestamp
    found = DECIMAL.match(name)
    assert found is not None, name
    precision, scale = int(found[1]), int(found[2])

    def to_decimal(column: str, value: Any) -> Any:
        text = repr(value) if type(value) is float else value if isinstance(value, str) else None
        if type(value) is int or isinstance(value, decimal.Decimal):
            text = str(value)
        try:
            number = decimal.Decimal(text) if text is not None else None
        except decimal.InvalidOperation:
            number = None
        if number is None or not number.is_finite():
            raise _refuse(column, value, name)
        _, digits, exponent = number.as_tuple()
        assert isinstance(exponent, int)
        excess = -exponent - scale  # fraction digits beyond the scale: they must all be zeros
        if excess > 0 and any(digits[-excess:]):
            raise _refuse(column, value, f"{name} without rounding")
        whole = 0 if number.is_zero() else max(0, len(digits) + exponent)
        if whole > precision - scale:
            raise _refuse(column, value, f"{name} (too many digits)")
        with decimal.localcontext(prec=80):  # exact: the default context's 28 digits would refuse decimal(38, S)
            return number.quantize(decimal.Decimal(1).scaleb(-scale))
    return to_decimal


def iso_timestamp(tz: dt.tzinfo) -> Callable[[str], int]:
    def read(text: str) -> int:
        try:
            parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError as exc:
            raise ParseError(f"time {text!r} is not ISO 8601: {exc}") from None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=tz)
        delta = parsed - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return read
