"""JSON Schema evolution, differentially: for changes the registry accepts as compatible (a property added or
removed, integer widened to number, a type widened with null or another type, a format removed, an enum grown),
values written as JSON under each version and stored through the partition group's blocks read back as what their
writer meant (the JSON value, converted only losslessly into the newest version's column), or are quarantined with
the reason; nothing escapes the parser's error types.

Run longer with ``HYPOTHESIS_PROFILE=nightly`` (tests/conftest.py)."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from hypothesis import example, given
from hypothesis import strategies as st
from tests.factories import backup_table
from tests.unit.schemas.test_jsonschema_roundtrip import READ_MS, REGISTRY, _register

from shale.block import read_dataset
from shale.config import BucketConfig, IngestConfig, ParserRule
from shale.encoder.chunks import Chunk, GroupSpec, write_chunk
from shale.objstore import open_bucket
from shale.schemas import frame

QUARANTINED = object()
EITHER = object()
ABSENT = object()
"""A version-1 property the record does not carry."""


def store(values: list[bytes]) -> tuple[pa.Table | None, dict[int, str]]:
    spec = GroupSpec("partition", 1, BucketConfig(url=f"memory://jevo-{uuid.uuid4().hex}"),
                     IngestConfig(parsers=[ParserRule(parser="json_schema")], schema_registry=REGISTRY))
    table = backup_table("app", 0, 0, len(values))
    table = table.set_column(table.schema.get_field_index("value"), "value", pa.array(values, pa.binary()))
    bucket = open_bucket(spec.bucket)
    written = write_chunk(spec, bucket, table, Chunk("app", 0, "", 0, len(values), READ_MS))
    rows = [read_dataset(bucket, m, d) for m in written.blocks for d in m.datasets if d.kind == "records"]
    quarantined = {o: r for m in written.blocks for d in m.datasets if d.kind == "quarantine"
                   for o, r in zip(*read_dataset(bucket, m, d).select(["offset", "reason"]).to_pydict().values(),
                                   strict=True)}
    assert sum(m.rows for m in written.blocks) == len(values)  # every record stored or quarantined
    return (pa.concat_tables(rows).sort_by("offset") if rows else None), quarantined


@dataclass(frozen=True)
class Change:
    name: str
    v1: Any
    v2: Any
    values: st.SearchStrategy[Any]
    meant: Callable[[Any], Any]


def _text(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def _instant(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).astimezone(dt.UTC)


INTEGERS = st.integers(-(2**63), 2**63 - 1)
TEXT = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=6)
INSTANTS = st.datetimes(min_value=dt.datetime(1971, 1, 1), max_value=dt.datetime(2200, 1, 1),
                        timezones=st.just(dt.UTC)).map(lambda t: t.isoformat())

CHANGES = [
    Change("same", {"type": "integer"}, {"type": "integer"}, INTEGERS, lambda v: v),
    Change("integer_number", {"type": "integer"}, {"type": "number"}, INTEGERS,
           lambda v: float(v) if float(v) == v else QUARANTINED),
    Change("nullable", {"type": "string"}, {"type": ["string", "null"]}, TEXT, lambda v: v),
    Change("widened_union", {"type": "integer"}, {"type": ["integer", "string"]}, INTEGERS, _text),
    Change("format_removed", {"type": "string", "format": "date-time"}, {"type": "string"}, INSTANTS, lambda v: v),
    Change("format_added", {"type": "string"}, {"type": "string", "format": "date-time"}, INSTANTS,
           lambda v: (EITHER, _instant(v))),
    Change("enum_grown", {"enum": ["A", "B"]}, {"enum": ["A", "B", "C"]}, st.sampled_from(["A", "B"]), lambda v: v),
    Change("date_removed", {"type": "string", "format": "date"}, {"type": "string"},
           st.dates().map(dt.date.isoformat), lambda v: v),
    Change("nested_integer_number", {"type": "object", "properties": {"n": {"type": "integer"}}},
           {"type": "object", "properties": {"n": {"type": "number"}, "m": {"type": "string"}}},
           st.fixed_dictionaries({"n": INTEGERS}),
           lambda v: {"n": float(v["n"]), "m": None} if float(v["n"]) == v["n"] else QUARANTINED),
    Change("items_widened", {"type": "array", "items": {"type": "integer"}},
           {"type": "array", "items": {"type": "number"}}, st.lists(INTEGERS, max_size=3),
           lambda vs: [float(v) for v in vs] if all(float(v) == v for v in vs) else QUARANTINED),
    Change("added", None, {"type": "string"}, st.just(ABSENT), lambda _: None),
    Change("removed", {"type": "string"}, None, TEXT, lambda _: None),
]
BY_NAME = {c.name: c for c in CHANGES}


def _schema(props: dict[str, Any]) -> dict[str, Any]:
    return {"$schema": "http://json-schema.org/draft-07/schema#", "title": "Evo", "type": "object",
            "properties": {"keep": {"type": "integer"}, **props}}  # never an object without properties


def check_evolution(changes: list[Change], old_values: list[Any], new_values: list[Any]) -> None:
    v1 = _schema({f"p{i}": c.v1 for i, c in enumerate(changes) if c.v1 is not None})
    v2 = _schema({f"p{i}": c.v2 for i, c in enumerate(changes) if c.v2 is not None})
    old_id, new_id = _register(v1), _register(v2)
    old = {f"p{i}": v for i, v in enumerate(old_values) if v is not ABSENT and changes[i].v1 is not None}
    new = {f"p{i}": v for i, v in enumerate(new_values) if changes[i].v2 is not None}
    rows, quarantined = store([frame(old_id, json.dumps(old).encode()), frame(new_id, json.dumps(new).encode())])
    wanted = {f"p{i}": c.meant(old_values[i]) for i, c in enumerate(changes) if c.v2 is not None}
    may = any(w is QUARANTINED or (isinstance(w, tuple) and w[0] is EITHER) for w in wanted.values())
    if 0 in quarantined:
        assert may, f"quarantined although every value has a column that holds it: {quarantined[0]}"
    else:
        assert not any(w is QUARANTINED for w in wanted.values()), f"stored a value no column holds: {wanted}"
        assert rows is not None
        stored = rows.filter(pa.compute.equal(rows.column("offset"), 0)).to_pylist()[0]
        for name, want in wanted.items():
            value = want[1] if isinstance(want, tuple) else want
            assert stored[name] == value, f"{name}: stored {stored[name]!r}, the writer meant {value!r}"
    if 1 in quarantined:  # the newest version's own value: only a number a double does not hold
        assert "does not hold exactly" in quarantined[1] or "does not fit" in quarantined[1], quarantined[1]


@st.composite
def evolutions(draw: st.DrawFn) -> tuple[list[Change], list[Any], list[Any]]:
    changes = draw(st.lists(st.sampled_from(CHANGES), min_size=1, max_size=4, unique_by=lambda c: c.name))
    old_values = [draw(c.values) for c in changes]
    new_values = [draw(c.values) if c.name not in ("added",) else draw(TEXT) for c in changes]
    new_values = [v if v is not ABSENT else None for v in new_values]
    return changes, old_values, new_values


@given(evolutions())
@example(([BY_NAME["format_removed"]], ["2026-11-20T08:30:00+00:00"], ["2026-11-20T08:30:00+00:00"]))
@example(([BY_NAME["integer_number"]], [2**60 + 1], [5]))
def test_every_stored_value_is_what_its_writer_meant_or_quarantined(
        drawn: tuple[list[Change], list[Any], list[Any]]) -> None:
    check_evolution(*drawn)
