"""Hostile and random records never stop a group (issue 26, cases 3 and 4): through ``write_chunk``, every record
of a chunk is stored once, parsed or quarantined with a reason; nothing raises. Properties over any bytes, and
the named inputs the properties and the issue found."""

from __future__ import annotations

import json
import uuid

import msgpack
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.factories import BASE_MS, backup_table

from shale.block import read_dataset
from shale.config import BucketConfig, IngestConfig, ParserRule
from shale.encoder.chunks import Chunk, GroupSpec, write_chunk
from shale.encoder.parsing import MAX_LABEL_VALUE_BYTES
from shale.objstore import open_bucket

READ_MS = BASE_MS + 7 * 86_400_000
OPTIONS = {"time_field": "ts", "time_format": "epoch_ms", "label_fields": ["host"], "fields": ["msg", "n.deep"]}
PARSERS = ("json", "msgpack", "text")


def _spec(parser: str) -> GroupSpec:
    options = ({"pattern": r"(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) (?P<host>\S+) (?P<msg>.*)",
                "time_format": "%Y-%m-%d %H:%M:%S", "labels": ["host"]}
               if parser == "text" else OPTIONS)
    rule = ParserRule(parser=parser, options=options)
    return GroupSpec("partition", 1, BucketConfig(url=f"memory://hostile-{uuid.uuid4().hex}"),
                     IngestConfig(parsers=[rule]))


def _store(parser: str, values: list[bytes | None]) -> tuple[int, int, list[str]]:
    """Write one chunk of these values; (records stored as rows, records quarantined, quarantine reasons)."""
    table = backup_table("app", 0, 0, len(values))
    table = table.set_column(table.schema.get_field_index("value"), "value", pa.array(values, pa.binary()))
    spec = _spec(parser)
    bucket = open_bucket(spec.bucket)
    written = write_chunk(spec, bucket, table, Chunk("app", 0, "", 0, len(values), READ_MS))
    rows = sum(m.rows for m in written.blocks)
    reasons = [r for m in written.blocks for d in m.datasets if d.kind == "quarantine"
               for r in read_dataset(bucket, m, d).column("reason").to_pylist()]
    assert rows == len(values)  # every record once, parsed or quarantined
    assert written.quarantined == len(reasons)
    return rows - written.quarantined, written.quarantined, reasons


def _deep(levels: int) -> bytes:
    return ('{"ts": 1795000000000, "host": "h", "n": {"deep": ' + "[" * levels + "]" * levels + "}}").encode()


@pytest.mark.parametrize("parser", PARSERS)
@given(values=st.lists(st.one_of(st.none(), st.binary(max_size=64)), min_size=1, max_size=8))
def test_any_bytes_are_stored_or_quarantined(parser: str, values: list[bytes | None]) -> None:
    _store(parser, values)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10)


@given(documents=st.lists(st.fixed_dictionaries(
    {}, optional={"ts": st.integers() | st.text(max_size=12) | st.floats(), "host": JSON_VALUES, "msg": JSON_VALUES,
                  "n": JSON_VALUES}), min_size=1, max_size=6))
def test_any_json_document_is_stored_or_quarantined(documents: list[dict[str, object]]) -> None:
    _store("json", [json.dumps(d).encode() for d in documents])


MSGPACK_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1) | st.floats()
    | st.text(max_size=20) | st.binary(max_size=8) | st.builds(msgpack.ExtType, st.integers(0, 127),
                                                                 st.binary(max_size=4)),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10)


@given(documents=st.lists(st.fixed_dictionaries(
    {}, optional={"ts": st.integers(0, 2**40) | st.binary(max_size=4), "host": MSGPACK_VALUES,
                  "msg": MSGPACK_VALUES, "n": MSGPACK_VALUES}), min_size=1, max_size=6))
def test_any_msgpack_map_is_stored_or_quarantined(documents: list[dict[str, object]]) -> None:
    _store("msgpack", [msgpack.packb(d, use_bin_type=True) for d in documents])


def test_json_nested_deeper_than_python_reads_is_quarantined() -> None:
    good = b'{"ts": 1795000000000, "host": "h1", "msg": "ok"}'
    parsed, quarantined, reasons = _store("json", [good, _deep(100_000), good])
    assert (parsed, quarantined) == (2, 1)
    assert "nested too deeply" in reasons[0]


@pytest.mark.parametrize(("field", "value", "reason"), [
    ("host", b"\x00\x01", "bytes"), ("msg", msgpack.ExtType(5, b"x"), "bytes"),
    ("n", {"deep": [b"raw"]}, "bytes")])
def test_msgpack_binary_or_ext_data_in_a_column_is_quarantined(field: str, value: object, reason: str) -> None:
    good = msgpack.packb({"ts": 1795000000000, "host": "h1", "msg": "ok"})
    bad = msgpack.packb({"ts": 1795000000000, "host": "h2", field: value}, use_bin_type=True)
    parsed, quarantined, reasons = _store("msgpack", [good, bad])
    assert (parsed, quarantined) == (1, 1)
    assert reason in reasons[0]


def test_a_label_value_over_the_limit_is_quarantined() -> None:
    big = json.dumps({"ts": 1795000000000, "host": "h" * (MAX_LABEL_VALUE_BYTES + 1)}).encode()
    fits = json.dumps({"ts": 1795000000000, "host": "é" * (MAX_LABEL_VALUE_BYTES // 2)}).encode()  # 2 bytes each
    parsed, quarantined, reasons = _store("json", [big, fits, big])
    assert (parsed, quarantined) == (1, 2)
    assert all("over the 2048-byte limit" in r for r in reasons)


def test_a_lone_surrogate_in_json_is_stored_or_quarantined() -> None:
    parsed, quarantined, _ = _store("json", [b'{"ts": 1795000000000, "host": "\\ud800", "msg": "\\udfff"}'])
    assert parsed + quarantined == 1
