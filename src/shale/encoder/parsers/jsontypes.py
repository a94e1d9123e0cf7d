"""Declared types of ``json`` and ``msgpack`` fields (a rule's ``types``): a field's value is stored in its declared
column type only when the type holds it exactly; otherwise the record is quarantined naming the column, the value
and the type. Nothing is coerced: a string is not read as a number, a boolean is not an integer, a fraction is not
rounded.

* ``string`` (undeclared fields too): a string as it is, any other value as its JSON text.
* ``long``: an integer in 64 bits.
* ``double``: a number the double nearest to it holds as written (``to_double``): an integer literal exactly (2**53 + 1
  is refused); a literal with a fraction or an exponent (``0.1``, ``1e300``) is read as the nearest double, as every
  JSON reader does, unless that double, rounded to the literal's significant digits, is not the literal: it
  overflows to infinity (``1e400``), underflows to zero (``1e-400``) or drops a digit the writer wrote
  (``9007199254740993.0``, ``0.12345678901234567891``). A msgpack float is a double already; ``NaN`` and
  ``Infinity`` (Python's JSON extension) are the doubles they name.
* ``boolean``: true or false.
* ``timestamp``: an ISO 8601 string (a time without a zone is in the rule's ``timezone``), stored in microseconds.
* ``decimal(P,S)``: a number or a numeric string, read from its text (never through a float), with at most S
  fraction digits and P digits in all. A msgpack float is read from its shortest text (``repr``).
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
import re
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from shale.encoder.parsers.base import ParseError

DECIMAL = re.compile(r"^decimal\((\d+),\s*(\d+)\)$")
NAMES = ("string", "long", "double", "boolean", "timestamp")
TYPE_HELP = "string, long, double, boolean, timestamp or decimal(P,S) (1 <= P <= 38, S <= P)"
TIMESTAMP_US = pa.timestamp("us", tz="UTC")
DOUBLE_DIGITS = 15
"""A decimal of at most 15 significant digits in the normal range comes back from its nearest double when rounded
to those digits (C's ``DBL_DIG``): such a literal is always the nearest double's text."""
NORMAL = (-306, 308)
"""Exclusive bounds of a literal's decimal point position (its digits times 10**position) inside the normal range
of doubles (2.2e-308 to 1.8e308), where ``DOUBLE_DIGITS`` holds."""


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
    shown = str(value) if isinstance(value, decimal.Decimal) else repr(value)  # a number as its JSON text
    return ParseError(f"column {column!r}: {shown} is not a {name} (declared in the rule's types)"[:1000])


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
            if type(value) is float:  # a binary double (msgpack), or NaN or Infinity: nothing was rounded
                return value
            if type(value) is int and abs(value) <= 2**1023 and int(float(value)) == value:
                return float(value)
            if isinstance(value, decimal.Decimal):  # a JSON literal with a fraction or an exponent, as written
                return literal_double(column, value)
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


def literal_double(column: str, literal: decimal.Decimal) -> float:
    """The double a JSON number literal with a fraction or an exponent means: the nearest one, when that double
    rounded to the literal's significant digits is the literal (``0.1``, ``1e300``, ``0.10000000000000001``); else a
    ParseError naming why (overflow, underflow, a digit the double drops)."""
    number = float(literal)  # correctly rounded (Python reads the decimal text)
    _, digits, exponent = literal.as_tuple()
    if len(digits) <= DOUBLE_DIGITS and isinstance(exponent, int) and NORMAL[0] < len(digits) + exponent < NORMAL[1]:
        return number  # the common case, decided without arithmetic: see DOUBLE_DIGITS
    if decimal.Decimal(repr(number)) == literal:  # the double's shortest text, what most writers of doubles write
        return number
    if math.isinf(number):
        raise _refuse(column, literal, "double: it overflows to infinity (a double holds at most 1.8e308)")
    if number == 0 and not literal.is_zero():
        raise _refuse(column, literal, "double: it underflows to 0 (a double holds no less than 4.9e-324)")
    held = decimal.Decimal(number)  # the double's exact binary value
    if held == literal:
        return number
    with decimal.localcontext(prec=len(digits), rounding=decimal.ROUND_HALF_EVEN):
        if +held == literal:  # unary plus rounds to the context's precision: the literal's digits
            return number
    raise _refuse(column, literal, f"double: the nearest double is {number!r}, which drops digits written")


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
