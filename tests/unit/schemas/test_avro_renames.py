"""An Avro field renamed (with ``aliases``), removed, promoted or added between versions: the column a record's value
lands in is its writer's field name, whatever other versions its chunk holds (docs/design/schemas.md, "Avro versions:
the writer's field names").

The property draws up to three versions of a flat record (fields kept, renamed with aliases, removed, promoted
int -> long -> float -> double, added with a default), records of each, and a split of the records into chunks;
every record stored both when the records form one chunk and when they are split holds the same values in the same
columns (a value one chunk's column cannot hold exactly, an int a float does not hold, is quarantined there)."""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, replace
from typing import Any

import pytest
from hypothesis import example, given, note
from hypothesis import strategies as st
from tests.protobuf_evolution import store_chunk as stored_chunk
from tests.unit.schemas.test_avro_roundtrip import REGISTRY, _encode, _register

from shale.schemas import frame

PROMOTIONS = ["int", "long", "float", "double"]
"""Avro's promotions, in order: a field's type may move right between versions."""
VALUES: dict[str, st.SearchStrategy[Any]] = {
    "int": st.integers(-(2**31), 2**31 - 1), "long": st.integers(-(2**63), 2**63 - 1),
    "float": st.floats(width=32, allow_nan=False), "double": st.floats(allow_nan=False),
    "string": st.text(max_size=4),
}
DEFAULTS = {"int": 7, "long": 7, "float": 0.5, "double": 0.5, "string": "-"}


@dataclass(frozen=True)
class Field:
    name: str
    type: str
    aliases: tuple[str, ...] = ()
    added: bool = False
    """Added by a later version, with a default."""

    def avro(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.type, **({"aliases": list(self.aliases)} if self.aliases else {}),
                **({"default": DEFAULTS[self.type]} if self.added else {})}


Versions = tuple[tuple[Field, ...], ...]
Case = tuple[Versions, list[tuple[int, dict[str, Any]]], list[int]]
"""The versions, the records (version index, its datum) and where the records are cut into chunks."""


def _schema(fields: tuple[Field, ...]) -> dict[str, Any]:
    return {"type": "record", "name": "Reading", "namespace": "tele", "fields": [f.avro() for f in fields]}


@st.composite
def _field(draw: st.DrawFn, number: int, added: bool = False) -> Field:
    return Field(f"f{number}", draw(st.sampled_from([*PROMOTIONS, "string"])), added=added)


@st.composite
def _evolved(draw: st.DrawFn, fields: tuple[Field, ...], first: int) -> tuple[Field, ...]:
    out = []
    for f in fields:
        change = draw(st.sampled_from(["keep", "rename", "remove", "promote"]))
        if change == "rename":
            number = f.name[1:]
            out.append(replace(f, name=f"{'g' if f.name[0] == 'f' else 'f'}{number}", aliases=(f.name,)))
        elif change == "promote" and f.type in PROMOTIONS:
            out.append(replace(f, type=draw(st.sampled_from(PROMOTIONS[PROMOTIONS.index(f.type):])), aliases=()))
        elif change != "remove":
            out.append(replace(f, aliases=()))
    added = draw(st.integers(0 if out else 1, 2))
    return (*out, *[draw(_field(n, added=True)) for n in range(first, first + added)])


@st.composite
def cases(draw: st.DrawFn) -> Case:
    versions = [tuple(draw(_field(n)) for n in range(1, draw(st.integers(1, 4)) + 1))]
    for _ in range(draw(st.integers(1, 2))):
        versions.append(draw(_evolved(versions[-1], 10 * len(versions))))
    writes = [(v, {f.name: draw(VALUES[f.type]) for f in versions[v]})
              for v in draw(st.lists(st.integers(0, len(versions) - 1), min_size=2, max_size=8))]
    cuts = sorted(draw(st.sets(st.integers(1, len(writes) - 1), max_size=3)))
    return tuple(versions), writes, cuts


def store_chunk(values: list[bytes]) -> tuple[dict[int, dict[str, Any]], dict[int, str]]:
    """Framed records through the ``avro`` parser into an in-memory bucket, as ingest writes a chunk."""
    return stored_chunk(values, REGISTRY, parser="avro")


def _stored(versions: Versions, writes: list[tuple[int, dict[str, Any]]], cuts: list[int]) -> dict[int, Any]:
    """Each stored record's non-null field columns, by its place in ``writes``, the records written as one chunk
    per run between ``cuts``."""
    schemas = [_schema(v) for v in versions]
    ids = [_register(s) for s in schemas]
    framed = [frame(ids[v], _encode(schemas[v], datum)) for v, datum in writes]
    names = {f.name for v in versions for f in v}
    out: dict[int, Any] = {}
    for start, end in itertools.pairwise([0, *cuts, len(writes)]):
        rows, _ = store_chunk(framed[start:end])
        for offset, row in rows.items():
            out[start + offset] = {k: v for k, v in row.items() if k in names and v is not None}
    return out


TEMPERATURE = (Field("device", "string"), Field("temp_c", "int"))
RENAMED = (Field("device", "string"), Field("temp_dc", "int", aliases=("temp_c",)))


@given(cases())
@example(((TEMPERATURE, RENAMED), [(0, {"device": "a", "temp_c": 21}), (0, {"device": "b", "temp_c": 22}),
                                   (1, {"device": "c", "temp_dc": 215})], [1])).via(
    "the issue's rename, in Avro: temp_c became temp_dc (aliases temp_c); the version 1 record of the second chunk "
    "landed in temp_dc beside the version 2 record, the one of the first chunk in temp_c")
@example((((Field("f1", "long"),), (Field("f1", "long"), Field("f10", "string", added=True))),
          [(0, {"f1": 1}), (1, {"f1": 2, "f10": "x"})], [1])).via(
    "a field added with a default: the version 1 record held the default beside a version 2 record, nothing in a "
    "chunk of its own")
@example((((Field("f1", "long"), Field("f2", "string")), (Field("f1", "long"),)),
          [(0, {"f1": 1, "f2": "kept"}), (1, {"f1": 2})], [1])).via(
    "a field a later version removed: dropped from the version 1 record beside a version 2 record, kept alone")
def test_the_column_an_avro_value_lands_in_does_not_depend_on_the_chunks(case: Case) -> None:
    versions, writes, cuts = case
    note(repr(case))
    whole, split = _stored(versions, writes, []), _stored(versions, writes, cuts)
    for place in whole.keys() & split.keys():  # a value one chunk's column type cannot hold is quarantined there
        assert whole[place] == split[place], (place, writes[place])
    assert len(whole.keys() & split.keys()) >= sum(all(f.type == "string" for f in versions[v]) for v, _ in writes)


def test_a_rename_keeps_each_versions_column_and_is_warned_of(caplog: pytest.LogCaptureFixture) -> None:
    schemas = [_schema(TEMPERATURE), _schema(RENAMED)]
    v1, v2 = (_register(s) for s in schemas)
    records = [frame(v1, _encode(schemas[0], {"device": "a", "temp_c": 21})),
               frame(v2, _encode(schemas[1], {"device": "b", "temp_dc": 215}))]
    with caplog.at_level(logging.WARNING):
        rows, reasons = store_chunk(records)
    assert reasons == {}
    assert [(r["device"], r["temp_c"], r["temp_dc"]) for _, r in sorted(rows.items())] == \
        [("a", 21, None), ("b", None, 215)]
    assert f"'temp_c' in schema id {v1}; 'temp_dc' (aliases 'temp_c') in schema id {v2}" in caplog.text
    assert "avro record tele.Reading" in caplog.text


def test_a_promoted_value_the_column_cannot_hold_is_quarantined_and_kept_in_its_own_chunk() -> None:
    """A long promoted to double: 2**60 + 1 is not a double; beside a version 2 record its column is a double and
    the record is quarantined with the reason, never rounded; alone, its long column holds it."""
    old, new = (Field("n", "long"),), (Field("n", "double"),)
    schemas = [_schema(old), _schema(new)]
    v1, v2 = (_register(s) for s in schemas)
    first = frame(v1, _encode(schemas[0], {"n": 2**60 + 1}))
    rows, reasons = store_chunk([first, frame(v2, _encode(schemas[1], {"n": 1.5}))])
    assert [r["n"] for r in rows.values()] == [1.5]
    assert "does not hold exactly" in reasons[0]
    alone, _ = store_chunk([first])
    assert alone[0]["n"] == 2**60 + 1


def test_nested_records_follow_avros_resolution_into_the_newest_definition() -> None:
    """Inside a top-level field Avro's resolution decides (the module's stated limit): a nested field added with a
    default gets it in an older record beside the newer version."""
    inner = {"type": "record", "name": "Place", "fields": [{"name": "x", "type": "int"}]}
    grown = {**inner, "fields": [*inner["fields"], {"name": "y", "type": "int", "default": 0}]}
    v1 = {"type": "record", "name": "Nest", "fields": [{"name": "at", "type": inner},
                                                       {"name": "also", "type": "Place"}]}
    v2 = {"type": "record", "name": "Nest", "fields": [{"name": "at", "type": grown}]}
    old, new = _register(v1), _register(v2)
    rows, reasons = store_chunk([frame(old, _encode(v1, {"at": {"x": 1}, "also": {"x": 2}})),
                                 frame(new, _encode(v2, {"at": {"x": 3, "y": 4}}))])
    assert reasons == {}
    assert [(r["at"], r["also"]) for _, r in sorted(rows.items())] == [
        ({"x": 1, "y": 0}, {"x": 2, "y": 0}), ({"x": 3, "y": 4}, None)]
