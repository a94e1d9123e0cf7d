"""The versions that decide a view (``latest_view_and_versions``): whatever history is split into what was read
before and what is read now, in any order of times, partitions and incarnations, the view of the earlier part's
versions plus the later part is the view of the whole. Debezium truncates, withheld records, copies of a record
and column keys included."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from hypothesis import example, given
from hypothesis import strategies as st

from shale.changes import INCARNATION, TableRule, latest_view, latest_view_after, latest_view_and_versions

MS = 1_795_000_000_000
TIMESTAMP = pa.timestamp("us", tz="UTC")
SOURCE = pa.struct([("ts_ms", pa.int64())])
RULES = {"up": TableRule("upsert"), "dbz": TableRule("debezium"), "col": TableRule("upsert", "id")}
OPS = ("c", "u", "d", "t", "m")

# (topic, partition, incarnation, key, what, ms, part): ``what`` is a value (0-4), a tombstone (5), a withheld
# record (6) or a Debezium op (its index in OPS, for the Debezium topic); ``part`` says which of three reads stores it.
Event = tuple[str, int, int, int, int, int, int]


def events_of(topics: list[str]) -> st.SearchStrategy[list[Event]]:
    return st.lists(st.tuples(st.sampled_from(topics), st.integers(0, 2), st.integers(0, 1), st.integers(0, 3),
                              st.integers(0, 6), st.integers(0, 20), st.integers(0, 2)), max_size=50)


events = events_of(sorted(RULES))


def _table(records: list[dict[str, Any]], quarantine: bool) -> pa.Table:
    columns: dict[str, pa.Array] = {
        "topic": pa.array([r["topic"] for r in records], pa.string()),
        "partition": pa.array([r["partition"] for r in records], pa.int32()),
        "offset": pa.array([r["offset"] for r in records], pa.int64()),
        "timestamp": pa.array([r["ms"] * 1000 for r in records], pa.int64()).cast(TIMESTAMP),
        "key": pa.array([r["key"] for r in records], pa.binary()),
        "value": pa.array([r["value"] for r in records], pa.binary()),
    }
    if quarantine:
        columns["reason"] = pa.array(["why"] * len(records), pa.string())
    else:
        columns["op"] = pa.array([r.get("op") for r in records], pa.string())
        columns["source"] = pa.array([r.get("source") for r in records], SOURCE)
        columns["id"] = pa.array([r.get("id") for r in records], pa.int64())
    columns[INCARNATION] = pa.array([r["incarnation"] for r in records], pa.int64())
    return pa.table(columns)


def _parts(history: list[Event]) -> list[tuple[pa.Table, pa.Table]]:
    """The events as three reads' tables (rows, quarantined); offsets follow each scope's produce order, times do
    not; the first event of the history is stored twice in its read (a copy a compaction has not replaced yet)."""
    ends: dict[tuple[str, int, int], int] = {}
    parts: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = [([], []), ([], []), ([], [])]
    for i, (topic, partition, incarnation, key, what, ms, part) in enumerate(history):
        scope = (topic, partition, incarnation)
        record: dict[str, Any] = {"topic": topic, "partition": partition, "incarnation": incarnation,
                                  "offset": ends.get(scope, 0), "ms": MS + ms, "key": str(key).encode(),
                                  "value": f"v{i}".encode()}
        ends[scope] = record["offset"] + 1
        quarantined = what == 6
        if topic == "dbz":
            op = OPS[what % len(OPS)]
            record.update(op=op, source={"ts_ms": MS + (ms * 7) % 20})
            if op == "t":
                record["key"] = None
        elif topic == "col":
            record["id"] = key % 2
        if what == 5:
            record["value"], quarantined = None, True
        (parts[part][1] if quarantined else parts[part][0]).append(record)
        if i == 0:
            (parts[part][1] if quarantined else parts[part][0]).append(record)
    return [(_table(rows, False), _table(q, True)) for rows, q in parts]


def _rows(view: pa.Table) -> set[tuple[Any, ...]]:
    return set(zip(*(view.column(c).to_pylist() for c in ("topic", "key", "value")), strict=True))


@given(events)
@example([("dbz", 0, 0, 0, 0, 5, 0), ("dbz", 1, 0, 0, 0, 10, 0), ("dbz", 0, 0, 0, 1, 1, 1)])  # not the latest
@example([("dbz", 0, 0, 0, 0, 0, 0), ("dbz", 0, 0, 1, 3, 1, 0), ("dbz", 0, 0, 1, 0, 2, 1)])  # a truncate
@example([("up", 0, 1, 3, 0, 0, 0), ("up", 0, 1, 3, 1, 19, 0), ("up", 0, 0, 0, 2, 5, 0),
          ("up", 1, 1, 0, 3, 5, 1)])  # a scope's first record
@example([("col", 0, 0, 1, 0, 0, 0), ("col", 0, 0, 0, 0, 1, 0), ("col", 0, 0, 2, 1, 2, 0),
          ("col", 0, 0, 0, 5, 3, 1)])  # a column key
def test_the_versions_of_what_was_read_plus_what_is_new_give_the_whole_view(history: list[Event]) -> None:
    """The examples: (1) a key's latest version (partition 0, the later source time) superseded in its own
    partition by a record older than partition 1's version, which must then decide: a version kept that was not
    the latest; (2) a truncate read before deletes a key created before it; (3) incarnation 1's first record, long
    superseded, still ranks it before incarnation 0 when two versions of a key have one time; (4) a tombstone of
    record key 0 deletes the row its record key named (id 0), though record key 2 wrote that row's latest version."""
    parts = _parts(history)
    whole = latest_view(pa.concat_tables([p[0] for p in parts]), pa.concat_tables([p[1] for p in parts]),
                        RULES.__getitem__)[0]
    rows, quarantined = parts[0]
    for later_rows, later_quarantined in parts[1:]:
        _, _, versions = latest_view_and_versions(rows, quarantined, RULES.__getitem__)
        rows = pa.concat_tables([versions.rows, later_rows])
        quarantined = pa.concat_tables([versions.quarantined, later_quarantined])
    view, _, versions = latest_view_and_versions(rows, quarantined, RULES.__getitem__)
    assert _rows(view) == _rows(whole)
    assert versions.rows.num_rows + versions.quarantined.num_rows <= rows.num_rows + quarantined.num_rows


def _after_each_read(parts: list[tuple[pa.Table, pa.Table]]) -> tuple[pa.Table, Any]:
    """The view through ``latest_view_after``: the first read's versions, then each later read added to them."""
    view, stats, versions = latest_view_and_versions(*parts[0], RULES.__getitem__)
    for later_rows, later_quarantined in parts[1:]:
        view, stats, versions = latest_view_after(versions, later_rows, later_quarantined, RULES.__getitem__)
    return view, stats


@given(events_of(["dbz", "up"]))
@example([("up", 0, 0, 1, 0, 5, 0), ("up", 1, 0, 1, 1, 9, 1), ("up", 0, 0, 2, 5, 3, 2)])  # another key untouched
@example([("dbz", 0, 0, 0, 0, 5, 0), ("dbz", 0, 0, 1, 0, 6, 0), ("dbz", 1, 0, 0, 3, 9, 1)])  # a truncate later
@example([("up", 0, 1, 0, 0, 10, 0), ("up", 0, 0, 1, 0, 12, 0), ("up", 0, 1, 1, 0, 2, 1)])  # an older first record
@example([("up", 0, 0, 0, 6, 1, 0), ("up", 0, 0, 1, 6, 2, 0), ("up", 0, 0, 1, 0, 3, 2)])  # withheld, then not
def test_a_view_recomputed_for_the_keys_read_now_is_the_whole_view(history: list[Event]) -> None:
    """``latest_view_after``: only the keys the new records name are recomputed, the earlier view's other rows
    stand; the view and its counts (rows, deleted, withheld) are the whole history's, whatever the split. The
    examples: a key no later read names keeps its row; a truncate read later deletes keys it does not name (the
    whole is recomputed); a record older than its scope's first re-ranks the scope (likewise); a withheld key
    is said until a later record makes it a row."""
    parts = _parts(history)
    whole, whole_stats = latest_view(pa.concat_tables([p[0] for p in parts]), pa.concat_tables([p[1] for p in parts]),
                                     RULES.__getitem__)
    view, stats = _after_each_read(parts)
    assert _rows(view) == _rows(whole)
    assert view.num_rows == len(_rows(view))  # one row a key
    assert (stats.rows, stats.deleted, stats.withheld) == (whole_stats.rows, whole_stats.deleted,
                                                           whole_stats.withheld)
    assert bool(stats.withheld_reason) == bool(whole_stats.withheld)


@given(events)
def test_a_column_keyed_topic_recomputes_the_whole_view(history: list[Event]) -> None:
    parts = _parts(history)
    whole = latest_view(pa.concat_tables([p[0] for p in parts]), pa.concat_tables([p[1] for p in parts]),
                        RULES.__getitem__)[0]
    assert _rows(_after_each_read(parts)[0]) == _rows(whole)
