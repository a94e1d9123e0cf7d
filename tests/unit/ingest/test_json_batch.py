"""The ``json`` parser's batch path (``jsonbatch``: Arrow's JSON reader over a chunk's values) against its
per-record path: for any chunk, hostile values included, the same parsed table, the same rows and the same
quarantine reasons (issue 56). The per-record path is the contract; ``test_parsers`` and ``test_json_types`` hold it
to Python's ``json`` and to the declared types."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from tests.factories import BASE_MS, backup_table

from shale.config import BucketConfig, IngestConfig, ParserRule
from shale.encoder.chunks import GroupSpec
from shale.encoder.parsers.jsonparser import JsonTimestampParser
from shale.encoder.parsing import parse_records

READ_MS = BASE_MS + 7 * 86_400_000
CONFIGS: dict[str, dict[str, Any]] = {
    "epoch": {"time_field": "ts", "time_format": "epoch_ms", "label_fields": ["host"], "fields": ["msg", "n.deep"]},
    "iso": {"time_field": "ts", "time_format": "iso8601", "label_fields": ["host"], "fields": ["msg", "n.deep"]},
    "iso-paris": {"time_field": "meta.ts", "time_format": "iso8601", "timezone": "Europe/Paris",
                  "label_fields": ["host"], "fields": ["msg"]},
    "typed": {"time_field": "ts", "time_format": "epoch_us", "label_fields": ["host"], "fields": ["n", "ok", "msg"],
              "types": {"n": "long", "ok": "boolean"}},
}


def _spec(config: str) -> GroupSpec:
    rule = ParserRule(parser="json", options=CONFIGS[config])
    return GroupSpec("partition", 1, BucketConfig(url=f"memory://json-batch-{uuid.uuid4().hex}"),
                     IngestConfig(parsers=[rule]))


def _table(values: list[bytes | None]) -> pa.Table:
    table = backup_table("app", 0, 0, len(values))
    return table.set_column(table.schema.get_field_index("value"), "value", pa.array(values, pa.binary()))


def both_paths(config: str, values: list[bytes | None]) -> tuple[Any, Any, int]:
    """``parse_records`` of the values by the batch path and by the per-record path, and how many records the batch
    path read."""
    table = _table(values)
    parser = _spec(config).parser_for("app")
    assert isinstance(parser, JsonTimestampParser)
    assert parser.batch is not None
    batched = parse_records(parser, table, READ_MS, by_hour=False)
    read = len(parser.batch.read(table.column("value")).rows)
    parser.batch = None
    one_by_one = parse_records(parser, table, READ_MS, by_hour=False)
    return batched[:3], one_by_one[:3], read


def assert_same(config: str, values: list[bytes | None]) -> int:
    batched, one_by_one, read = both_paths(config, values)
    assert batched[0].schema == one_by_one[0].schema
    assert batched[0].to_pylist() == one_by_one[0].to_pylist()
    assert batched[1:] == one_by_one[1:]
    return read


def _iso(year: int, month: int, day: int, clock: str, fraction: str, zone: str, sep: str) -> str:
    return f"{year:04d}-{month:02d}-{day:02d}{sep}{clock}{fraction}{zone}"


ISO_TIMES = st.builds(
    _iso, st.integers(1960, 2040), st.integers(0, 13), st.integers(0, 32),
    st.sampled_from(["00:00:00", "23:59:59", "12:30:05", "24:00:00", "23:60:00", "1:2:3", "12:30"]),
    st.sampled_from(["", ".1", ".123", ".123456", ".1234567", "."]),
    st.sampled_from(["", "Z", "z", "+00:00", "+05:30", "-23:59", "+24:00", "+0530", "-00:00", " Z"]),
    st.sampled_from(["T", " ", "t"])) | st.datetimes(
        dt.datetime(1971, 1, 1), dt.datetime(2030, 1, 1)).map(lambda d: d.isoformat() + "Z")
EPOCHS = st.integers(-10, 2_000_000_000_000) | st.integers(2**62, 2**70) | st.floats() | st.text(max_size=6)
TEXTS = st.text(max_size=12) | st.sampled_from(["\ud800", "\x00", "a\nb", "\u00e9\U0001F600", "h" * 3000])
SCALARS = st.none() | st.booleans() | st.integers() | st.integers(2**63 - 2, 2**64) | st.floats() | TEXTS
JSON_VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=3), inner, max_size=3), max_leaves=6)


@st.composite
def documents(draw: st.DrawFn, config: str) -> bytes | None:
    """A record's value: mostly a document of the configuration's fields, sometimes anything."""
    time = draw(ISO_TIMES if config.startswith("iso") else EPOCHS | st.integers(1_700_000_000_000, 1_800_000_000_000))
    document: dict[str, Any] = {"meta": {"ts": time}} if config == "iso-paris" else {"ts": time}
    document["host"] = draw(st.sampled_from(["h1", "h2"]) | JSON_VALUES)
    document["msg"] = draw(TEXTS | JSON_VALUES)
    document["n"] = draw(st.integers() | JSON_VALUES | st.fixed_dictionaries({"deep": TEXTS | JSON_VALUES}))
    document["ok"] = draw(st.booleans() | JSON_VALUES)
    text = json.dumps(document, ensure_ascii=draw(st.booleans()), indent=draw(st.none() | st.just(1)))
    form = draw(st.sampled_from(["plain"] * 6 + ["duplicate", "bytes", "array", "deep", "empty", "none", "cut",
                                                 "two", "bom"]))
    if form == "duplicate":
        return text.replace('"host":', '"host": "dup", "host":', 1).encode("utf-8", "surrogatepass")
    if form == "bytes":
        return draw(st.binary(max_size=40))
    if form == "array":
        return f"[{text}]".encode("utf-8", "surrogatepass")
    if form == "deep":
        deep = '"z": ' + "[" * 1500 + "]" * 1500 + ', "msg":'
        return text.replace('"msg":', deep, 1).encode("utf-8", "surrogatepass")
    if form == "empty":
        return draw(st.sampled_from([b"", b" ", b"\t", b"{}"]))
    if form == "cut":
        return text.encode("utf-8", "surrogatepass")[:-1]
    if form == "two":
        return (text + text).encode("utf-8", "surrogatepass")
    if form == "bom":
        return b"\xef\xbb\xbf" + text.encode("utf-8", "surrogatepass")
    return None if form == "none" else text.encode("utf-8", "surrogatepass")


def chunks_of(config: str) -> st.SearchStrategy[list[bytes | None]]:
    return st.lists(documents(config), min_size=1, max_size=40)


@pytest.mark.parametrize("config", sorted(CONFIGS))
@given(data=st.data())
def test_the_batch_path_parses_every_chunk_as_the_per_record_path(config: str, data: st.DataObject) -> None:
    assert_same(config, data.draw(chunks_of(config)))


GOOD = b'{"ts": 1795000000000, "host": "h1", "msg": "fine", "n": {"deep": "x"}}'


@pytest.mark.parametrize("hostile", [
    b'{"ts": 1795000000000, "host": "h1", "host": "h2"}',  # a key twice: the last counts
    b'{"ts": 1795000000000, "host": 123456789012345678901234567890}',  # beyond 64 bits, in a string column
    b'{"ts": 1795000000000, "msg": 1.10}',  # a number in a string column: its JSON text as Python writes it
    b'{"ts": 1795000000000, "msg": "\\ud800"}',  # a lone surrogate
    b'{"ts": 1795000000000, "z": "\xff"}',  # invalid UTF-8 in a field no column reads
    b'{"ts": 1795000000000, "z": ' + b"[" * 2000 + b"]" * 2000 + b"}",  # deeper than Python reads
    b'{"ts": 1795000000000,\n "msg": "two lines"}',
    b'[1]', b'"text"', b"", None, b'{"ts": 1795000000000}{"ts": 1}',
])
def test_a_hostile_record_is_left_to_the_per_record_path_alone(hostile: bytes | None) -> None:
    values = [GOOD] * 100 + [hostile] + [GOOD] * 100
    assert assert_same("epoch", values) >= 200  # its neighbours are still read in a batch


def test_a_clean_chunk_is_read_in_one_batch() -> None:
    assert assert_same("iso", [b'{"ts": "2026-11-25T07:36:05.383971Z", "host": "h", "msg": "m", "n": {"deep": "d"}}']
                       * 50) == 50


@example(config="epoch")
@given(config=st.sampled_from(sorted(CONFIGS)))
def test_no_value_at_all(config: str) -> None:
    assert_same(config, [None, None])


@pytest.mark.parametrize("time", ["1960-00-00T00:00:00", "2023-02-29T00:00:00Z"])  # found by the property
def test_a_day_no_calendar_has_is_left_to_the_per_record_path(time: str) -> None:
    good = b'{"ts": "2026-11-25T07:36:05Z", "host": "h"}'
    assert assert_same("iso", [good, json.dumps({"ts": time, "host": "h"}).encode(), good]) == 2
