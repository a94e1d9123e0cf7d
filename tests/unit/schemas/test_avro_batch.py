"""The ``avro`` parser's batch path (``AvroParser.parse_batch``: a chunk decoded in one loop per writer schema, its
columns made at once) against its per-record ``parse``: for any schema of the mapped types with a time field, and
any chunk of its data and hostile values, the same parsed table, rows and quarantine reasons (issue 56)."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st
from tests.factories import backup_table
from tests.unit.schemas.test_avro_roundtrip import READ_MS, TYPES, _encode, _register, _spec

from shale.encoder.parsers.avroparser import AvroParser
from shale.encoder.parsing import parse_records
from shale.schemas import frame

TIME_TYPES = [{"type": "long", "logicalType": "timestamp-millis"}, {"type": "long", "logicalType": "timestamp-micros"},
              {"type": "long", "logicalType": "local-timestamp-millis"}, "long", ["null", "long"], "int"]
TIMES = st.datetimes(min_value=dt.datetime(1900, 1, 1), max_value=dt.datetime(2200, 1, 1))


def _time_value(time_type: Any, draw: st.DataObject) -> Any:
    if isinstance(time_type, dict):
        moment = draw.draw(TIMES)
        return moment if time_type["logicalType"].startswith("local") else moment.replace(tzinfo=dt.UTC)
    if time_type == "int":
        return draw.draw(st.integers(-2**31, 2**31 - 1))
    value = draw.draw(st.integers(-2**63, 2**63 - 1) | st.integers(1_700_000_000_000, 1_800_000_000_000))
    return draw.draw(st.none() | st.just(value)) if isinstance(time_type, list) else value


def _table(values: list[bytes | None]) -> pa.Table:
    table = backup_table("app", 0, 0, len(values))
    return table.set_column(table.schema.get_field_index("value"), "value", pa.array(values, pa.binary()))


@given(st.data())
def test_the_batch_path_parses_every_chunk_as_the_per_record_path(draw: st.DataObject) -> None:
    from tests.unit.schemas.test_avro_roundtrip import data

    time_type = draw.draw(st.sampled_from(TIME_TYPES))
    inner = draw.draw(st.lists(TYPES, max_size=2))
    schema = {"type": "record", "name": "Batch", "fields": [
        {"name": "t", "type": time_type}, {"name": "lvl", "type": "string"},
        *({"name": f"f{i}", "type": t} for i, t in enumerate(inner))]}
    sid = _register(schema)
    values: list[bytes | None] = []
    for _ in range(draw.draw(st.integers(1, 6))):
        datum = {"t": _time_value(time_type, draw), "lvl": draw.draw(st.sampled_from(["a", "b", "x" * 3000])),
                 **{f"f{i}": draw.draw(data(t)) for i, t in enumerate(inner)}}
        body = _encode(schema, datum)
        values.append(draw.draw(st.sampled_from([
            frame(sid, body), frame(sid, body), frame(sid, body + b"\x00"), frame(sid, body[:-1]), None,
            b"\x01" + body])))
    table = _table(values)
    parser = _spec(time_field="t", label_fields=["lvl"]).parser_for("app")
    assert isinstance(parser, AvroParser)
    batched = parse_records(parser, table, READ_MS, by_hour=False)
    parser.parse_batch = lambda values: None  # type: ignore[method-assign]
    one_by_one = parse_records(parser, table, READ_MS, by_hour=False)
    assert batched[0].schema == one_by_one[0].schema
    assert batched[0].to_pylist() == one_by_one[0].to_pylist()
    assert batched[1] == one_by_one[1]
    assert _addressless(batched[2]) == _addressless(one_by_one[2])


def _addressless(rejected: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Reasons without the object addresses some of fastavro's errors name (``<_io.BytesIO object at 0x...>``)."""
    return [(row, re.sub(r"0x[0-9a-f]+", "0x…", why)) for row, why in rejected]


def test_a_clean_chunk_is_read_in_one_batch() -> None:
    schema = {"type": "record", "name": "Clean", "fields": [
        {"name": "t", "type": {"type": "long", "logicalType": "timestamp-millis"}}, {"name": "lvl", "type": "string"}]}
    sid = _register(schema)
    start = dt.datetime(2026, 11, 25, tzinfo=dt.UTC)
    values: list[bytes | None] = [
        frame(sid, _encode(schema, {"t": start + dt.timedelta(milliseconds=i), "lvl": "INFO"}))
        for i in range(20)]
    parser = _spec(time_field="t", label_fields=["lvl"]).parser_for("app")
    assert isinstance(parser, AvroParser)
    table = _table(values)
    parser.prepare(values)
    batch = parser.parse_batch(table.column("value"))
    assert batch is not None
    assert batch.rows.to_pylist() == list(range(20))
    assert parse_records(parser, table, READ_MS, by_hour=False)[0].num_rows == 20
