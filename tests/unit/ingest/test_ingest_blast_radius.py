"""One odd record among good ones affects that record alone in an ingest task (issue 54, "blast radius"): a chunk of
good records of a topic's record type, and one record written with a newer version of it whose new field has a
shape that is hard to store (a record with no fields, an array of them, a decimal of 60 digits, a union of three
types, a map, a bytes decimal at its scale's edge, nesting 30 deep), at any position. The chunk is written by the
real chunk writer (``write_chunk``, as an ingest task writes it): it never raises, every good record is stored with
its writer's values, and the odd one is stored or quarantined with its reason; nothing else is quarantined."""

from __future__ import annotations

import decimal
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from tests.protobuf_evolution import store_chunk
from tests.unit.schemas.test_avro_roundtrip import REGISTRY, _encode, _register

from shale.schemas import frame

GOOD = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"}, {"name": "name", "type": "string"}]}


def _nested(depth: int) -> Any:
    inner: Any = "long"
    for level in range(depth):
        inner = {"type": "record", "name": f"N{level}", "fields": [{"name": "x", "type": ["null", inner]}]}
    return inner


def _deep_value(depth: int) -> Any:
    value: Any = 7
    for _ in range(depth):
        value = {"x": value}
    return value


ODD: dict[str, tuple[Any, Any]] = {
    "record with no fields": ({"type": "record", "name": "Empty", "fields": []}, {}),
    "array of empty records": ({"type": "array", "items": {"type": "record", "name": "E2", "fields": []}}, [{}, {}]),
    "decimal of 60 digits": ({"type": "bytes", "logicalType": "decimal", "precision": 60, "scale": 2},
                             decimal.Decimal("1" * 58 + ".25")),
    "union of three types": (["null", "string", "long"], 42),
    "map": ({"type": "map", "values": "long"}, {"a": 1, "": 2}),
    "decimal at its edge": ({"type": "bytes", "logicalType": "decimal", "precision": 38, "scale": 38},
                            decimal.Decimal("0." + "9" * 38)),
    "nesting 30 deep": (_nested(30), _deep_value(30)),
}


@settings(max_examples=40, deadline=None)
@given(kind=st.sampled_from(sorted(ODD)), good=st.integers(2, 8), at=st.integers(0, 8))
def test_one_odd_record_affects_itself_alone(kind: str, good: int, at: int) -> None:
    field_type, value = ODD[kind]
    newer = {**GOOD, "fields": [*GOOD["fields"], {"name": "extra", "type": ["null", field_type], "default": None}]}
    good_id, newer_id = _register(GOOD), _register(newer)
    at = min(at, good)
    values: list[bytes | None] = [frame(good_id, _encode(GOOD, {"id": i, "name": f"n{i}"})) for i in range(good)]
    values.insert(at, frame(newer_id, _encode(newer, {"id": -1, "name": "odd", "extra": value})))
    rows, reasons = store_chunk(values, REGISTRY, parser="avro")  # as an ingest task writes it
    assert set(reasons) <= {at}, reasons  # only the odd record may be quarantined
    assert all(reasons.values())
    goods = [o for o in range(len(values)) if o != at]
    assert [(rows[o]["id"], rows[o]["name"]) for o in goods] == [(i, f"n{i}") for i in range(good)]
    assert all(rows[o].get("extra") is None for o in goods)
    if at in rows:
        assert (rows[at]["id"], rows[at]["name"]) == (-1, "odd")
