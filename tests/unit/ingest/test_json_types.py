"""Declared types of json and msgpack fields: a value is stored in its declared type only when the type holds it
exactly, else the record is quarantined with the reason: never a different value."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
from typing import Any

import msgpack
import pyarrow as pa
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from tests.factories import BASE_MS, backup_table

from shale.config import IngestConfig, ParserRule
from shale.encoder.chunks import Chunk, GroupSpec, write_chunk
from shale.encoder.parsers import ParseError, load_parser
from shale.errors import ConfigError
from shale.objstore import open_bucket_url

TYPES = {"n": "long", "x": "double", "ok": "boolean", "at": "timestamp", "amount": "decimal(12,2)"}
OPTIONS = {"time_field": "t", "time_format": "epoch_ms", "fields": ["n", "x", "ok", "at", "amount", "note"],
           "types": TYPES}
SPECIAL = st.sampled_from(["12.50", "1e3", "0.001", "NaN", "2026-11-27T10:00Z"])
json_values = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
                           | st.text(max_size=8) | SPECIAL, lambda inner: st.lists(inner, max_size=2), max_leaves=4)


def meant(kind: str, value: Any) -> Any:
    """What a value written as JSON means in a declared type, or None when the type cannot hold it exactly."""
    if kind == "long":
        return value if type(value) is int and -2**63 <= value < 2**63 else None
    if kind == "double":
        if type(value) is float:
            return value
        return float(value) if type(value) is int and abs(value) <= 2**1023 and float(value) == value else None
    if kind == "boolean":
        return value if type(value) is bool else None
    if kind == "timestamp":
        if not isinstance(value, str):
            return None
        try:
            parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)
    if type(value) is bool or not isinstance(value, int | float | str):
        return None
    try:
        number = decimal.Decimal(repr(value) if isinstance(value, float) else str(value))
    except decimal.InvalidOperation:
        return None
    if not number.is_finite() or abs(number) >= 10**10:
        return None
    with decimal.localcontext(prec=200):
        return number if number == round(number, 2) else None


@given(st.sampled_from(sorted(TYPES)), json_values)
@example("amount", 0.1)  # a float's shortest text, not its binary value
@example("amount", 123.456)  # would round
@example("n", True)  # a boolean is not an integer
@example("n", 2**63)  # beyond 64 bits
@example("x", 2**53 + 1)  # a double would round it
@example("amount", "12.50")  # a numeric string is a decimal's text
@example("at", "2026-11-27T10:00")  # no zone: the rule's timezone (UTC)
@example("at", "")  # found by this property: the reason did not name the column
def test_a_declared_type_stores_what_the_writer_meant_or_quarantines(field: str, value: Any) -> None:
    parser = load_parser("json", OPTIONS)
    record = json.dumps({"t": BASE_MS, field: value}).encode()
    expected = meant(TYPES[field], value) if value is not None else None
    if expected is None and value is not None:
        with pytest.raises(ParseError, match=f"column {field!r}"):
            parser.parse(record, BASE_MS)
        return
    _, columns = parser.parse(record, BASE_MS)
    stored = pa.array([columns[field]], parser.columns()[field]).to_pylist()[0]
    assert stored == expected
    if TYPES[field] == "double" and expected is not None:
        assert json.loads(json.dumps(value)) == stored  # the same number as the JSON text


def test_decimals_are_read_from_their_text_not_through_a_float() -> None:
    parser = load_parser("json", OPTIONS)
    record = b'{"t": 1795000000000, "amount": 12345678.91, "note": 7}'
    _, columns = parser.parse(record, BASE_MS)
    assert columns["amount"] == decimal.Decimal("12345678.91")
    assert columns["note"] == "7"  # undeclared: a string, as before
    packed = load_parser("msgpack", OPTIONS)
    _, fields = packed.parse(msgpack.packb({"t": BASE_MS, "amount": 0.1, "n": 5}), BASE_MS)
    assert fields["amount"] == decimal.Decimal("0.10")
    assert fields["n"] == 5


@pytest.mark.parametrize(("options", "message"), [
    ({**OPTIONS, "types": {"n": "int"}}, "type 'int' is not one of string, long"),
    ({**OPTIONS, "types": {"amount": "decimal(40,2)"}}, "decimal(P,S)"),
    ({**OPTIONS, "types": {"level": "long"}}, "types names ['level'], which fields does not list"),
])
def test_a_declared_type_that_cannot_be_is_a_configuration_error(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        load_parser("json", options)


def test_declared_types_become_typed_columns_of_the_block() -> None:
    values = [{"t": BASE_MS + i, "n": i, "amount": f"{i}.25", "at": "2026-11-27T10:00:00.000001Z", "note": "x"}
              for i in range(3)] + [{"t": BASE_MS, "n": "3"}]
    table = backup_table("billing", 0, 0, len(values))
    table = table.set_column(table.schema.get_field_index("value"), "value",
                             pa.array([json.dumps(v).encode() for v in values], pa.binary()))
    bucket = open_bucket_url("memory://json-types")
    ingest = IngestConfig(parsers=[ParserRule(parser="json", options=OPTIONS)])
    from shale.config import BucketConfig
    spec = GroupSpec("partition", 1, BucketConfig(url="memory://json-types"), ingest)
    written = write_chunk(spec, bucket, table, Chunk("billing", 0, "", 0, len(values), BASE_MS + 86_400_000))
    datasets = {d.kind: d for block in written.blocks for d in block.datasets}
    assert datasets["quarantine"].rows == 1  # "3" is a string, not a long
    records = datasets["records"]
    assert records.rows == 3
    from shale.block.schemas import decode_column_types
    types = decode_column_types(records.column_types)
    assert types["n"] == pa.int64()
    assert types["amount"] == pa.decimal128(12, 2)
    assert types["at"] == pa.timestamp("us", tz="UTC")
    assert types["note"] == pa.string()  # undeclared: a string column, as before


def literal_meant(text: str) -> float | None:
    """What a JSON number literal with a fraction or an exponent means in a double column: the nearest double when
    that double, written with the literal's significant digits, is the literal; None (quarantined) otherwise."""
    number, written = float(text), decimal.Decimal(text)
    if math.isinf(number) or (number == 0 and not written.is_zero()):
        return None
    mantissa = text.lstrip("-").lower().partition("e")[0].replace(".", "").lstrip("0")
    digits = max(1, len(mantissa))
    if decimal.Decimal(f"{number:.{digits - 1}e}") == written or decimal.Decimal(repr(number)) == written:
        return number
    return None


LITERALS = st.builds(lambda sign, whole, fraction, exponent: f"{sign}{whole}{fraction}{exponent}",
                     st.sampled_from(["", "-"]), st.from_regex(r"\A(0|[1-9][0-9]{0,19})\Z"),
                     st.from_regex(r"\A(\.[0-9]{1,20})?\Z"),
                     st.integers(-420, 420).map(lambda e: f"e{e}") | st.just("")).filter(
    lambda text: "." in text or "e" in text)


@given(LITERALS)
@example("1e400")  # overflowed to inf, stored
@example("-1e400")
@example("1e-400")  # underflowed to 0.0, stored
@example("9007199254740993.0")  # 2**53 + 1, stored rounded to 2**53
@example("0.12345678901234567891")  # more digits than a double holds
@example("2.5e-324")  # half the smallest subnormal: rounds to it, a digit dropped
@example("0.1")  # the nearest double, as every JSON reader takes it
@example("0.10000000000000001")  # %.17g's text of 0.1
@example("1e300")
@example("1.7976931348623157e308")  # the largest double
@example("5e-324")  # the smallest subnormal
@example("-0.0")
def test_a_double_literal_is_the_nearest_double_or_the_record_is_quarantined(text: str) -> None:
    parser = load_parser("json", OPTIONS)
    record = f'{{"t": {BASE_MS}, "x": {text}}}'.encode()
    expected = literal_meant(text)
    if expected is None:
        with pytest.raises(ParseError, match=r"column 'x': .* is not a double: "):
            parser.parse(record, BASE_MS)
        return
    _, columns = parser.parse(record, BASE_MS)
    assert type(columns["x"]) is float
    assert columns["x"] == expected
    assert math.copysign(1, columns["x"]) == math.copysign(1, expected)


def test_a_double_the_writer_cannot_have_meant_quarantines_its_record_alone() -> None:
    values = [b'{"t": %d, "x": %s}' % (BASE_MS, literal) for literal in
              (b"0.5", b"1e400", b"1e-400", b"9007199254740993.0", b"NaN", b"2.25")]
    table = backup_table("billing", 0, 0, len(values))
    table = table.set_column(table.schema.get_field_index("value"), "value", pa.array(values, pa.binary()))
    from shale.block import read_dataset
    from shale.config import BucketConfig
    spec = GroupSpec("partition", 1, BucketConfig(url="memory://json-doubles"),
                     IngestConfig(parsers=[ParserRule(parser="json", options=OPTIONS)]))
    bucket = open_bucket_url("memory://json-doubles")
    written = write_chunk(spec, bucket, table, Chunk("billing", 0, "", 0, len(values), BASE_MS + 86_400_000))
    stored = {d.kind: read_dataset(bucket, m, d) for m in written.blocks for d in m.datasets}
    assert [x if x == x else "nan" for x in stored["records"].column("x").to_pylist()] == [0.5, "nan", 2.25]
    reasons = stored["quarantine"].column("reason").to_pylist()
    assert len(reasons) == 3
    assert any("1E+400 is not a double: it overflows to infinity" in r for r in reasons), reasons
    assert any("1E-400 is not a double: it underflows to 0" in r for r in reasons), reasons
    assert any("9007199254740993.0 is not a double: the nearest double is 9007199254740992.0" in r
               for r in reasons), reasons
