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
