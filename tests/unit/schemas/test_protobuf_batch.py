"""The ``protobuf`` parser's batch path (``ProtobufParser.parse_batch``: a chunk decoded in one loop, each record
with its writer's descriptor, its columns made at once) against its per-record ``parse``: for any message and any
evolution of it a registry may hold (``protobuf_evolution``), records of both versions, a time field of either
kind, hostile bytes beside them, newest or named reader: the same parsed table, rows and quarantine reasons
(issue 56)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.factories import backup_table
from tests.protobuf_evolution import READ_MS, Field, build, evolutions, message_class, messages, set_values, values
from tests.unit.schemas.test_protobuf_versions import REGISTRY, _framed, _register

from shale.config import BucketConfig, IngestConfig, ParserRule
from shale.encoder.chunks import GroupSpec
from shale.encoder.parsers.protobufparser import ProtobufParser
from shale.encoder.parsing import parse_records

TIME_FIELDS = [Field(99, "t", ".google.protobuf.Timestamp", "implicit"), Field(99, "t", "int64", "implicit"),
               Field(99, "t", "int64", "optional")]
"""The time field: a Timestamp (unset: no time, quarantined), epoch milliseconds (0 when unset), or optional."""


def _parser(**options: Any) -> ProtobufParser:
    rule = ParserRule(parser="protobuf", options={"time_field": "t", **options})
    spec = GroupSpec("partition", 1, BucketConfig(url="memory://protobuf-batch"),
                     IngestConfig(parsers=[rule], schema_registry=REGISTRY))
    parser = spec.parser_for("app")
    assert isinstance(parser, ProtobufParser)
    return parser


def _both_ways(parser: ProtobufParser, framed: list[bytes | None]) -> tuple[Any, Any]:
    table = backup_table("app", 0, 0, len(framed))
    table = table.set_column(table.schema.get_field_index("value"), "value", pa.array(framed, pa.binary()))
    batched = parse_records(parser, table, READ_MS, by_hour=False)
    parser.parse_batch = lambda values: None  # type: ignore[method-assign]
    return batched, parse_records(parser, table, READ_MS, by_hour=False)


@settings(deadline=None)
@given(st.data())
def test_the_batch_path_parses_every_chunk_as_the_per_record_path(draw: st.DataObject) -> None:
    time = draw.draw(st.sampled_from(TIME_FIELDS))
    v1 = (time, *draw.draw(messages()))
    v2 = (time, *draw.draw(evolutions(v1[1:])))
    files = {1: build(v1, "gen"), 2: build(v2, "gen")}
    ids = {n: _register(f) for n, f in files.items()}
    framed: list[bytes | None] = []
    for version in draw.draw(st.lists(st.sampled_from([1, 2]), min_size=1, max_size=6)):
        fields = v1 if version == 1 else v2
        message = message_class(files[version])()
        set_values(message, fields, draw.draw(values(fields)))
        body = _framed(ids[version], message)
        framed.append(draw.draw(st.sampled_from([body, body, body, body[:-1], body + b"\xff", None,
                                                 b"\x01" + body[1:], body[:5] + b"\x07" + body[6:]])))
    parser = _parser(**({"reader_schema_id": ids[1]} if draw.draw(st.booleans()) else {}))
    batched, one_by_one = _both_ways(parser, framed)
    assert batched[0].schema == one_by_one[0].schema
    assert batched[0].to_pylist() == one_by_one[0].to_pylist()
    assert batched[1] == one_by_one[1]
    assert batched[2] == one_by_one[2]


def test_a_clean_chunk_is_read_in_one_batch() -> None:
    """Records of one version, all well formed: every one comes from the batch, none through ``parse``."""
    fields = (TIME_FIELDS[1], Field(1, "lvl", "string", "implicit"))
    file = build(fields, "clean")
    sid = _register(file)
    framed: list[bytes | None] = []
    for i in range(50):
        message = message_class(file)()
        set_values(message, fields, {"t": 1_790_000_000_000 + i, "lvl": f"l{i % 3}"})
        framed.append(_framed(sid, message))
    parser = _parser()
    parser.prepare(framed)
    batch = parser.parse_batch(pa.array(framed, pa.binary()))
    assert batch is not None
    assert batch.rows.to_pylist() == list(range(50))
    batched, one_by_one = _both_ways(parser, framed)
    assert batched[0].to_pylist() == one_by_one[0].to_pylist()
    assert batched[0].column("lvl").to_pylist()[:4] == ["l0", "l1", "l2", "l0"]
