"""Debezium's ``op`` and ``source`` columns read by Arrow kernels (``shale.changes.columns``) mean what the record
by record reading (``envelope.of_op``, and the value's JSON where the op column is null) says they mean: a property
over any op (known, unknown, null), any source (a time, a null time, a null struct) and quarantined records."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from shale.changes import INCARNATION, TableRule
from shale.changes import columns as c

MS = 1_795_000_000_000
SOURCE = pa.struct([("ts_ms", pa.int64()), ("db", pa.string())])
ops = st.one_of(st.none(), st.sampled_from(["c", "u", "r", "d", "t", "m", "x", ""]))
sources = st.one_of(st.none(), st.builds(lambda ms: {"ts_ms": ms, "db": "shop"},
                                         st.one_of(st.none(), st.integers(0, 10**13))))
records = st.lists(st.tuples(ops, sources, st.booleans()), max_size=30)


def _table(rows: list[tuple[Any, Any, bool]], quarantine: bool) -> pa.Table:
    n = len(rows)
    columns: dict[str, Any] = {
        "topic": pa.array(["t"] * n, pa.string()), "partition": pa.array([0] * n, pa.int32()),
        "offset": pa.array(range(n), pa.int64()),
        "timestamp": pa.array([(MS + i) * 1000 for i in range(n)], pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        "key": pa.array([b"k"] * n, pa.binary()),
        "value": pa.array([json.dumps({"op": op or "c"}).encode() if value else None for op, _, value in rows],
                          pa.binary())}
    if quarantine:
        columns["reason"] = pa.array(["why"] * n, pa.string())
    else:
        columns["op"] = pa.array([op for op, _, _ in rows], pa.string())
        columns["source"] = pa.array([source for _, source, _ in rows], SOURCE)
    columns[INCARNATION] = pa.array([0] * n, pa.int64())
    return pa.table(columns)


@given(records, records)
def test_the_op_and_source_columns_mean_what_each_record_means(kept: list[Any], quarantined: list[Any]) -> None:
    rows, q = _table(kept, False), _table(quarantined, True)
    history = c.history_columns(rows, q, lambda _: TableRule("debezium"))
    by_record = c.history_columns(rows, q, lambda _: TableRule("append"))  # no meanings read yet
    values = pa.chunked_array(rows.column("value").chunks + q.column("value").chunks, pa.binary()).combine_chunks()
    c._debezium(by_record, rows, q, values, np.arange(len(kept) + len(quarantined)))
    assert history.kind.tolist() == by_record.kind.tolist()
    assert history.change_ms.tolist() == by_record.change_ms.tolist()
    assert history.reasons == by_record.reasons


record_keys = st.sampled_from([None, b"a", b"b", b"c"])
keyed_rows = st.lists(st.tuples(st.sampled_from(["t", "u"]), record_keys, st.one_of(st.none(), st.integers(-2, 2)),
                                st.booleans()), max_size=30)
keyed_quarantine = st.lists(st.tuples(st.sampled_from(["t", "u"]), record_keys), max_size=10)


def _keyed(rows: list[Any], quarantine: list[Any], shape: str) -> tuple[pa.Table, pa.Table]:
    def table(records: list[Any], extra: dict[str, Any]) -> pa.Table:
        n = len(records)
        return pa.table({
            "topic": pa.array([r[0] for r in records], pa.string()), "partition": pa.array([0] * n, pa.int32()),
            "offset": pa.array(range(n), pa.int64()),
            "timestamp": pa.array([MS * 1000] * n, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
            "key": pa.array([r[1] for r in records], pa.binary()), "value": pa.array([b"v"] * n, pa.binary()),
            **extra, INCARNATION: pa.array([0] * n, pa.int64())})
    ids = [r[2] for r in rows]
    column = {"int": {"id": pa.array(ids, pa.int64())},
              "string": {"id": pa.array([None if v is None else str(v) for v in ids], pa.string())},
              "struct": {"after": pa.array([None if null else {"id": v} for _, _, v, null in rows],
                                           pa.struct([("id", pa.int64())]))}}[shape]
    return table(rows, column), table(quarantine, {"reason": pa.array(["why"] * len(quarantine), pa.string())})


def _partition(ids: list[Any]) -> list[int]:
    """Each id's first position: equal for the versions of one key, -1 for no key."""
    first: dict[Any, int] = {}
    return [-1 if v is None or v == -1 else first.setdefault(v, i) for i, v in enumerate(ids)]


@given(keyed_rows, keyed_quarantine, st.sampled_from(["int", "string", "struct"]))
def test_a_key_column_read_by_kernels_names_the_keys_each_record_names(rows: list[Any], quarantine: list[Any],
                                                                       shape: str) -> None:
    """A version's key is its topic and its column's value (a null struct's field is null: no key); a quarantined
    record's is the value of the last row of its topic with its record key (the slow path's rule, here written
    out)."""
    kept, q = _keyed(rows, quarantine, shape)
    history = c.history_columns(kept, q, lambda _: TableRule("upsert", "after.id" if shape == "struct" else "id"))
    value = [None if shape == "struct" and null else v for _, _, v, null in rows]
    named: dict[tuple[str, Any], Any] = {}
    for (topic, record_key, _, _), v in zip(rows, value, strict=True):
        named[topic, record_key] = v
    expected = [(topic, v) for (topic, _, _, _), v in zip(rows, value, strict=True)] + \
        [(topic, named.get((topic, record_key))) for topic, record_key in quarantine]
    assert _partition(history.key.tolist()) == _partition([None if v is None else (t, v) for t, v in expected])
