"""Protobuf records of several schema versions in one chunk: every stored value is what its writer meant (its own
schema's reading, converted into the reader's column only where the column's type holds it exactly), or the record
is quarantined naming the field; never a different value, never an exception out of the parser.

The differential property draws a message schema, an evolution of it (what a registry accepts: fields added and
removed, types changed within their wire encoding, enums grown, fields moved into or out of a oneof; and, since a
registry with compatibility NONE accepts anything, other changes too), and values set on dynamic messages of each
version, framed as the serializer frames them; the model is ``protobuf_evolution.expected``. Budget: the "ci"
hypothesis profile; ``HYPOTHESIS_PROFILE=nightly`` runs 2,000 examples."""

from __future__ import annotations

import base64
import itertools
import pprint
from typing import Any

import pytest
from google.protobuf import descriptor_pb2
from hypothesis import event, example, given, note
from hypothesis import strategies as st
from tests.protobuf_evolution import (
    Field,
    Quarantined,
    build,
    by_name,
    canonical,
    evolutions,
    message_class,
    messages,
    outcome,
    set_values,
    store_chunk,
    values,
)

from shale.config import SchemaRegistryConfig
from shale.schemas.registry import RegisteredSchema, RegistryClient
from shale.schemas.wire import frame

REGISTRY = SchemaRegistryConfig(url="http://127.0.0.1:1/apis/ccompat/v7", timeout=2.0)
"""Nothing listens there: schemas are remembered in the cache."""
_ids = itertools.count(70_000)


def _register(file: descriptor_pb2.FileDescriptorProto) -> int:
    sid = next(_ids)
    text = base64.standard_b64encode(file.SerializeToString()).decode()
    RegistryClient(REGISTRY).remember(RegisteredSchema(sid, "PROTOBUF", text))
    return sid


def _store(values_: list[bytes], keys: list[bytes] | None = None, **options: Any) \
        -> tuple[dict[int, dict[str, Any]], dict[int, str]]:
    return store_chunk(values_, REGISTRY, keys, **options)


# --- case 2: a type change that keeps the wire type ---------------------------------------------------------------

def _versions(old: Field, new: Field) -> tuple[int, Any, int, Any]:
    """Registered ids and message classes of a one-field message before and after a change."""
    v1, v2 = build((old,), "shop"), build((new,), "shop")
    return _register(v1), message_class(v1), _register(v2), message_class(v2)


def _framed(sid: int, message: Any) -> bytes:
    return frame(sid, b"\x00" + message.SerializeToString())


def test_case2_an_int64_narrowed_to_int32_keeps_what_fits_and_quarantines_5000000000() -> None:
    v1, old, v2, new = _versions(Field(1, "amount", "int64", "implicit"), Field(1, "amount", "int32", "implicit"))
    rows, reasons = _store([_framed(v1, old(amount=5_000_000_000)), _framed(v1, old(amount=-7)),
                            _framed(v2, new(amount=12))])
    assert [rows[o]["amount"] for o in sorted(rows)] == [-7, 12]
    assert set(reasons) == {0}  # never 705,032,704
    assert (f"the record written with schema id {v1} cannot be read as the newest schema id {v2}: field 'amount' "
            "(number 1) holds 5000000000, which its type in the reader's schema, int32, cannot hold") in reasons[0]
    assert f"shale reprocess --schema-id {v1}" in reasons[0]


# (old type, new type, value written with the old type, the new column's value, or None: quarantined)
WIRE_COMPATIBLE_CHANGES = [
    ("int32", "uint32", -1, None), ("int32", "uint32", 7, 7), ("uint32", "int32", 3_000_000_000, None),
    ("uint64", "int64", 2**63, None), ("int64", "uint64", -2, None), ("uint32", "int64", 4_000_000_000, 4_000_000_000),
    ("int64", "bool", 2, None), ("int64", "bool", 1, True), ("bool", "int32", True, 1), ("bool", "uint64", False, 0),
    ("sint32", "sint64", -3, -3), ("sint64", "sint32", -(2**40), None),
    ("fixed32", "float", 1065353216, None), ("float", "fixed32", 1.0, None), ("fixed64", "double", 5, None),
    ("sfixed32", "fixed32", -1, None), ("fixed32", "sfixed32", 2**31, None), ("sfixed64", "fixed64", 9, 9),
    ("bytes", "string", b"\xff\xfe", None), ("bytes", "string", "caf\u00e9".encode(), "caf\u00e9"),
    ("string", "bytes", "caf\u00e9", "caf\u00e9".encode()), ("enum", "int32", 3, 3), ("enum", "uint32", 2, 2),
    ("int32", "enum", 1, "E1_V1"), ("int32", "enum", 9, "9"), ("int64", "enum", 2**31, None),
    ("string", "int64", "12", None), ("double", "float", 0.1, None), ("double", "float", 0.5, 0.5),
    ("float", "double", 0.25, 0.25),
]


@pytest.mark.parametrize(("before", "after", "written", "stored"), WIRE_COMPATIBLE_CHANGES)
def test_case2_a_changed_type_stores_the_writers_value_or_quarantines_it(before: str, after: str, written: Any,
                                                                          stored: Any) -> None:
    v1, old, v2, new = _versions(Field(1, "x", before, "implicit", enum_size=4 if before == "enum" else 0),
                                 Field(1, "x", after, "implicit", enum_size=4 if after == "enum" else 0))
    rows, reasons = _store([_framed(v1, old(x=written)), _framed(v2, new())])
    if stored is None:
        assert 0 in reasons, rows
        assert f"cannot be read as the newest schema id {v2}: field 'x' (number 1)" in reasons[0]
    else:
        assert reasons == {}
        assert canonical(rows[0]["x"]) == canonical(stored)


def test_case2_the_named_reader_schema_converts_by_the_same_rule() -> None:
    v1, old, v2, new = _versions(Field(1, "n", "int32", "implicit"), Field(1, "n", "int64", "implicit"))
    rows, reasons = _store([_framed(v2, new(n=2**40)), _framed(v2, new(n=5)), _framed(v1, old(n=6))],
                           reader_schema_id=v1)
    assert [rows[o]["n"] for o in sorted(rows)] == [5, 6]
    assert f"cannot be read as the named reader schema id {v1}: field 'n' (number 1) holds {2**40}" in reasons[0]


def test_case2_a_nested_repeated_and_mapped_value_is_checked_with_its_path() -> None:
    inner_old = (Field(1, "cents", "int64", "implicit"),)
    inner_new = (Field(1, "cents", "int32", "implicit"),)
    old = (Field(1, "line", "message", "repeated", nested=inner_old), Field(2, "tags", "int64", "map", key="string"))
    new = (Field(1, "line", "message", "repeated", nested=inner_new), Field(2, "tags", "int32", "map", key="string"))
    file1, file2 = build(old, "shop"), build(new, "shop")
    v1, v2 = _register(file1), _register(file2)
    old_cls = message_class(file1)
    deep, mapped, fine = old_cls(), old_cls(), old_cls()
    deep.line.add(cents=1)
    deep.line.add(cents=-(2**33))
    mapped.tags["a"] = 2**31
    fine.line.add(cents=3)
    fine.tags["b"] = -4
    rows, reasons = _store([_framed(v1, deep), _framed(v1, mapped), _framed(v1, fine),
                            _framed(v2, message_class(file2)())])  # version 2 in the chunk: the newest
    assert rows[2]["line"] == [{"cents": 3}]
    assert rows[2]["tags"] == [("b", -4)]
    assert "field 'line.cents' (number 1) holds -8589934592" in reasons[0]
    assert "field 'tags' (number 2) holds 2147483648" in reasons[1]


def test_a_field_on_the_wire_that_the_writers_schema_does_not_declare_is_not_guessed() -> None:
    # A producer serialized with version 2 (which added `n`) but framed the record with version 1's id: the bytes
    # hold n = 7 that version 1 does not declare. Read as version 2 it is neither dropped to n = 0 nor trusted.
    first = build((Field(1, "id", "int64", "implicit"),), "shop")
    added = build((Field(1, "id", "int64", "implicit"), Field(2, "n", "int32", "implicit")), "shop")
    v1, v2 = _register(first), _register(added)
    old, new = message_class(first), message_class(added)
    rows, reasons = _store([_framed(v1, new(id=1, n=7)), _framed(v1, old(id=2)), _framed(v2, new(id=3, n=4))])
    assert {o: (r["id"], r["n"]) for o, r in rows.items()} == {1: (2, None), 2: (3, 4)}  # n: not version 1's
    assert "field 'n' (number 2) is on the wire, but the writer's schema does not declare it" in reasons[0]


def test_case2_a_protobuf_key_of_an_older_version_is_converted_by_the_same_rule() -> None:
    # Key version 1: int64 id, double weight; version 2 made both int32. Arrow would store the double 1.5 in the
    # int32 column as 1 and refuse only what overflows; the key's writer meant 1.5.
    v1, old, v2, new = _versions(Field(1, "id", "int64", "implicit"), Field(1, "id", "int32", "implicit"))
    w1, w2 = build((Field(1, "id", "int64", "implicit"), Field(2, "weight", "double", "implicit")), "shop"), \
        build((Field(1, "id", "int32", "implicit"), Field(2, "weight", "int32", "implicit")), "shop")
    k1, k2 = _register(w1), _register(w2)
    key1, key2 = message_class(w1), message_class(w2)
    keys = [_framed(k1, key1(id=5_000_000_000)), _framed(k1, key1(id=3)), _framed(k1, key1(id=4, weight=1.5)),
            _framed(k2, key2(id=1, weight=2))]
    rows, reasons = _store([_framed(v1, old(id=i)) for i in range(3)] + [_framed(v2, new(id=3))], keys,
                           key_format="protobuf")
    assert {o: r["record_key"] for o, r in rows.items()} == {1: {"id": 3, "weight": 0}, 3: {"id": 1, "weight": 2}}
    assert set(reasons) == {0, 2}
    assert "key written with schema id" in reasons[0]
    assert "field 'id' (number 1) holds 5000000000" in reasons[0]
    assert "field 'weight' (number 2) was written as double" in reasons[2]


# --- the differential property -----------------------------------------------------------------------------------

def _check(v1_fields: tuple[Field, ...], v2_fields: tuple[Field, ...], writes: list[tuple[int, dict[str, Any]]],
           named: bool) -> list[str]:
    """Store records of both versions (``writes``: version 1 or 2 and what its writer set) and check each against
    the model, read as version 2 (the newest) or, when ``named``, as version 1. Returns what became of each."""
    versions = {1: v1_fields, 2: v2_fields}
    files = {n: build(f, "gen") for n, f in versions.items()}
    ids = {n: _register(files[n]) for n in (1, 2)}
    classes = {n: message_class(files[n]) for n in (1, 2)}
    framed = []
    for version, sets in writes:
        message = classes[version]()
        set_values(message, versions[version], sets)
        framed.append(_framed(ids[version], message))
    reader = 1 if named else 2
    columns = versions[1] if named else by_name([versions[v] for v in sorted({v for v, _ in writes}, reverse=True)])
    rows, reasons = _store(framed, **({"reader_schema_id": ids[1]} if named else {}))
    word = "named reader" if named else "newest"
    outcomes = []
    for offset, (version, sets) in enumerate(writes):
        want = outcome(versions[version], columns, sets, named)
        if isinstance(want, Quarantined):
            outcomes.append("a record quarantined")
            assert offset in reasons, (offset, rows.get(offset), want.path)
            assert f"cannot be read as the {word} schema id {ids[reader]}: field " in reasons[offset]
            continue
        outcomes.append("a record of the other version stored" if version != reader else "a record of the reader's "
                        "version stored")
        assert offset not in reasons, (reasons[offset], want)
        got = {f.name: rows[offset].get(f.name) for f in columns}
        assert canonical(got) == canonical(want), (version, sets)
    return outcomes


Case = tuple[tuple[Field, ...], tuple[Field, ...], list[tuple[int, dict[str, Any]]], bool]
"""Version 1's fields, version 2's, the records (version, what its writer set), and whether version 1 is named as
the reader schema (else version 2, the newest, is the reader)."""


@st.composite
def cases(draw: st.DrawFn) -> Case:
    v1_fields = draw(messages())
    v2_fields = draw(evolutions(v1_fields))
    writes = []
    for version in draw(st.lists(st.sampled_from([1, 2]), min_size=1, max_size=4)):
        writes.append((version, draw(values(v1_fields if version == 1 else v2_fields))))
    named = draw(st.booleans())
    if not named:
        writes.append((2, {}))  # version 2 is in the chunk: the newest
    return v1_fields, v2_fields, writes, named


@given(cases())
@example(((Field(1, "f1", "int64", "implicit"),), (Field(1, "f1", "int32", "implicit"),),
          [(1, {"f1": 5_000_000_000}), (2, {})], False)).via("case 2: int64 narrowed to int32")
@example(((Field(1, "f1", "int32", "implicit"),), (Field(1, "f1", "sint32", "implicit"),), [(2, {"f1": 1})],
          True)).via("found by this property: a sint32 of 1 read as the named int32 version was stored as 2")
@example(((Field(1, "f1", "int64", "implicit"), Field(2, "f2", "string", "implicit")),
          (Field(1, "f1", "int64", "oneof"), Field(2, "f2", "string", "oneof")), [(1, {"f1": 4, "f2": "s"}), (2, {})],
          False)).via("found by this property: two fields moved into one oneof kept only the last one on the wire")
@example(((Field(1, "f1", "fixed32", "implicit"),), (Field(1, "f1", "float", "implicit"),), [(1, {"f1": 7}), (2, {})],
          False)).via("found by this property: fixed32 bits read as a float")
def test_every_stored_value_is_what_its_writer_meant_or_the_record_is_quarantined(case: Case) -> None:
    note(pprint.pformat(case))  # hypothesis prints this case as "case=," (its printer loses it)
    for happened in _check(*case):
        event(happened)


def test_timestamps_of_both_versions_come_back_exact() -> None:
    ts = Field(1, "at", ".google.protobuf.Timestamp", "implicit")
    outcomes = _check((ts,), (ts, Field(2, "n", "int32", "implicit")),
                      [(1, {"at": (1_795_000_000, 999_999_999)}), (2, {})], named=False)
    assert outcomes[0] == "a record of the other version stored"
