"""The latest-row view over a history, pure (``shale.changes.latest_view``): what each record means (upsert,
Debezium's JSON envelope with and without schemas.enable, its Avro envelope's columns), the order between
partitions and incarnations, --as-of, and a property: any history produced in time order gives the dictionary its
records replay to."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from shale.changes import INCARNATION, TableRule, latest_view
from shale.errors import ShaleError

MS = 1_795_000_000_000
TIMESTAMP = pa.timestamp("us", tz="UTC")
UPSERT = TableRule("upsert")
DEBEZIUM = TableRule("debezium")

Record = dict[str, Any]
"""A Kafka record as the tests write it: partition, offset, ms, key, value, incarnation, and parsed columns."""


def _tables(records: list[Record], quarantined: list[Record] = (),  # type: ignore[assignment]
            extra: dict[str, pa.DataType] | None = None) -> tuple[pa.Table, pa.Table]:
    def base(rs: list[Record]) -> dict[str, pa.Array]:
        return {
            "topic": pa.array([r.get("topic", "t") for r in rs], pa.string()),
            "partition": pa.array([r.get("partition", 0) for r in rs], pa.int32()),
            "offset": pa.array([r["offset"] for r in rs], pa.int64()),
            "timestamp": pa.array([r.get("ms", MS + r["offset"]) * 1000 for r in rs], pa.int64()).cast(TIMESTAMP),
            "key": pa.array([r.get("key") for r in rs], pa.binary()),
            "value": pa.array([r.get("value") for r in rs], pa.binary()),
        }
    rows = base(records)
    for name, kind in (extra or {}).items():
        rows[name] = pa.array([r.get(name) for r in records], kind)
    rows[INCARNATION] = pa.array([r.get("incarnation", 0) for r in records], pa.int64())
    q = base(list(quarantined))
    q["reason"] = pa.array([r.get("reason", "the record has no value") for r in quarantined], pa.string())
    q[INCARNATION] = pa.array([r.get("incarnation", 0) for r in quarantined], pa.int64())
    return pa.table(rows), pa.table(q)


def _latest(records: list[Record], quarantined: list[Record] = (), rule: TableRule = UPSERT,  # type: ignore[assignment]
            as_of: int | None = None, extra: dict[str, pa.DataType] | None = None) -> dict[bytes, bytes]:
    rows, q = _tables(records, quarantined, extra)
    view, _ = latest_view(rows, q, lambda _: rule, as_of)
    return dict(zip(view.column("key").to_pylist(), view.column("value").to_pylist(), strict=True))


def test_the_last_offset_wins_and_a_tombstone_deletes_its_key() -> None:
    records = [{"offset": 0, "key": b"a", "value": b"1"}, {"offset": 1, "key": b"b", "value": b"2"},
               {"offset": 2, "key": b"a", "value": b"3"}, {"offset": 4, "key": b"c", "value": b"5"}]
    tombstones = [{"offset": 3, "key": b"b"}]  # a null value: the json parser quarantines it
    assert _latest(records, tombstones) == {b"a": b"3", b"c": b"5"}


def test_inside_a_partition_offsets_decide_whatever_the_timestamps_say() -> None:
    """A producer's CreateTime may go backwards; the log's order is the offsets'."""
    records = [{"offset": 0, "key": b"a", "value": b"old", "ms": MS + 10},
               {"offset": 1, "key": b"a", "value": b"new", "ms": MS}]
    assert _latest(records) == {b"a": b"new"}


def test_between_partitions_time_then_incarnation_then_partition_decide() -> None:
    later_in_p0 = [{"offset": 5, "key": b"a", "value": b"p0", "ms": MS + 2},
                   {"offset": 0, "partition": 1, "key": b"a", "value": b"p1", "ms": MS + 1}]
    assert _latest(later_in_p0) == {b"a": b"p0"}
    same_time = [{"offset": 5, "key": b"a", "value": b"p0", "ms": MS},
                 {"offset": 0, "partition": 1, "key": b"a", "value": b"p1", "ms": MS}]
    assert _latest(same_time) == {b"a": b"p1"}
    # Incarnation 7 began earlier (its first record is older) than incarnation 3: at the same time, 3 is newer.
    incarnations = [{"offset": 0, "key": b"x", "value": b"old", "ms": MS - 5, "incarnation": 7},
                    {"offset": 1, "key": b"a", "value": b"i7", "ms": MS, "incarnation": 7},
                    {"offset": 0, "key": b"a", "value": b"i3", "ms": MS, "incarnation": 3}]
    assert _latest(incarnations)[b"a"] == b"i3"


def test_as_of_is_the_view_at_a_kafka_time() -> None:
    records = [{"offset": 0, "key": b"a", "value": b"1", "ms": MS}, {"offset": 2, "key": b"a", "value": b"2",
                                                                     "ms": MS + 20}]
    tombstones = [{"offset": 1, "key": b"a", "ms": MS + 10}]
    assert _latest(records, tombstones, as_of=MS) == {b"a": b"1"}
    assert _latest(records, tombstones, as_of=MS + 10) == {}
    assert _latest(records, tombstones) == {b"a": b"2"}


def test_a_quarantined_record_that_is_no_tombstone_withholds_its_key() -> None:
    """Its row cannot be shown, and the older one is no longer the latest: the key is left out and counted."""
    rows, q = _tables([{"offset": 0, "key": b"a", "value": b"1"}, {"offset": 2, "key": b"b", "value": b"2"}],
                      [{"offset": 1, "key": b"a", "value": b"{bad", "reason": "invalid JSON"}])
    view, stats = latest_view(rows, q, lambda _: UPSERT)
    assert view.column("key").to_pylist() == [b"b"]
    assert (stats.rows, stats.withheld) == (1, 1)
    assert "invalid JSON" in stats.withheld_reason


def test_a_column_key_and_a_tombstone_of_its_record_key() -> None:
    records = [{"offset": 0, "key": b"k1", "value": b"1", "id": "A"}, {"offset": 1, "key": b"k2", "value": b"2",
                                                                        "id": "B"},
               {"offset": 3, "key": b"k9", "value": b"3", "id": "A"}]
    rows, q = _tables(records, [{"offset": 2, "key": b"k2"}], {"id": pa.string()})
    view, _ = latest_view(rows, q, lambda _: TableRule("upsert", "id"))
    assert view.column("value").to_pylist() == [b"3"]
    struct = {"after": pa.struct([("id", pa.int32())])}
    rows, q = _tables([{"offset": 0, "key": b"k", "value": b"1", "after": {"id": 1}},
                       {"offset": 1, "key": b"k", "value": b"2", "after": {"id": 1}}], [], struct)
    view, _ = latest_view(rows, q, lambda _: TableRule("upsert", "after.id"))
    assert view.column("value").to_pylist() == [b"2"]


def _envelope(op: str, after: Any = None, before: Any = None, ts: int = MS, schemas: bool = False) -> bytes:
    payload = {"before": before, "after": after, "op": op, "ts_ms": ts + 5,
               "source": {"connector": "postgresql", "ts_ms": ts, "db": "shop", "table": "customers"},
               "transaction": None}
    if schemas:
        return json.dumps({"schema": {"type": "struct", "name": "shop.public.customers.Envelope", "fields": []},
                           "payload": payload}).encode()
    return json.dumps(payload).encode()


@pytest.mark.parametrize("schemas", [False, True])
def test_debezium_json_creates_updates_deletes_and_tombstones(schemas: bool) -> None:
    records = [{"offset": 0, "key": b"1", "value": _envelope("r", {"id": 1, "n": "snap"}, schemas=schemas)},
               {"offset": 1, "key": b"2", "value": _envelope("c", {"id": 2, "n": "new"}, schemas=schemas)},
               {"offset": 2, "key": b"1", "value": _envelope("u", {"id": 1, "n": "upd"}, {"id": 1}, schemas=schemas)},
               {"offset": 3, "key": b"2", "value": _envelope("d", None, {"id": 2}, schemas=schemas)},
               {"offset": 5, "key": b"2", "value": _envelope("c", {"id": 2, "n": "again"}, schemas=schemas)},
               {"offset": 6, "key": b"3", "value": _envelope("c", {"id": 3}, schemas=schemas)},
               {"offset": 7, "key": b"3", "value": _envelope("d", None, {"id": 3}, schemas=schemas)}]
    tombstones = [{"offset": 4, "key": b"2"}, {"offset": 8, "key": b"3"}]  # each after its d
    latest = _latest(records, tombstones, DEBEZIUM)
    assert {k: json.loads(v)["payload" if schemas else "op"] is not None for k, v in latest.items()} == \
        {b"1": True, b"2": True}
    rows = {k: (json.loads(v)["payload"] if schemas else json.loads(v))["after"]["n"] for k, v in latest.items()}
    assert rows == {b"1": "upd", b"2": "again"}


def test_debezium_orders_partitions_by_the_source_time() -> None:
    """The database's commit time, not Kafka's: p1's record reached Kafka later but changed the row earlier."""
    records = [{"offset": 0, "key": b"1", "ms": MS + 1, "value": _envelope("u", {"n": "second"}, ts=MS + 100)},
               {"offset": 0, "partition": 1, "ms": MS + 50, "key": b"1",
                "value": _envelope("u", {"n": "first"}, ts=MS + 10)}]
    assert json.loads(_latest(records, [], DEBEZIUM)[b"1"])["after"]["n"] == "second"


def test_debezium_avro_columns_a_truncate_and_what_is_no_change() -> None:
    """The avro parser keeps the envelope's top-level fields as columns: ``op`` and ``source`` are read there. A
    truncate deletes every row changed before it; a schema change event, a transaction marker, a heartbeat and a
    logical decoding message change no row."""
    source = pa.struct([("ts_ms", pa.int64())])
    records = [{"offset": 0, "key": b"1", "value": b"\0avro", "op": "c", "source": {"ts_ms": MS}},
               {"offset": 1, "key": b"2", "value": b"\0avro", "op": "c", "source": {"ts_ms": MS}},
               {"offset": 2, "key": None, "value": b"\0avro", "op": "t", "source": {"ts_ms": MS + 1}},
               {"offset": 3, "key": b"2", "value": b"\0avro", "op": "u", "source": {"ts_ms": MS + 2}},
               {"offset": 4, "key": b"9", "value": b"\0avro", "op": "m", "source": {"ts_ms": MS + 3}},
               {"offset": 0, "partition": 1, "key": b"5", "value": b"\0avro", "op": "c", "source": {"ts_ms": MS}}]
    rows, q = _tables(records, [], {"op": pa.string(), "source": source})
    view, stats = latest_view(rows, q, lambda _: DEBEZIUM)
    assert view.column("key").to_pylist() == [b"2"]
    assert (stats.deleted, stats.skipped) == (2, 1)
    others = [{"offset": 0, "key": b"shop", "value": json.dumps({"ddl": "ALTER TABLE ...", "tableChanges": []})
               .encode()},
              {"offset": 1, "key": b"tx", "value": json.dumps({"status": "BEGIN", "id": "571:53195829",
                                                               "event_count": None}).encode()},
              {"offset": 2, "key": b"h", "value": json.dumps({"ts_ms": MS}).encode()}]
    rows, q = _tables(others)
    view, stats = latest_view(rows, q, lambda _: DEBEZIUM)
    assert (view.num_rows, stats.skipped, stats.withheld) == (0, 3, 0)


def test_an_unreadable_debezium_record_withholds_its_key() -> None:
    records = [{"offset": 0, "key": b"1", "value": _envelope("c", {"n": 1})},
               {"offset": 1, "key": b"1", "value": b'{"op": "x"}'},
               {"offset": 2, "key": b"2", "value": b'"text"'}]
    rows, q = _tables(records)
    view, stats = latest_view(rows, q, lambda _: DEBEZIUM)
    assert (view.num_rows, stats.withheld) == (0, 2)


def test_a_row_whose_incarnation_is_unknown_is_refused() -> None:
    rows, q = _tables([{"offset": 0, "key": b"a", "value": b"1", "incarnation": -1}])
    with pytest.raises(ShaleError, match="cannot tell which incarnation"):
        latest_view(rows, q, lambda _: UPSERT)


def test_copies_of_a_record_are_one_version() -> None:
    """Blocks a compaction has not replaced yet hold the same record twice."""
    records = [{"offset": 0, "key": b"a", "value": b"1"}, {"offset": 0, "key": b"a", "value": b"1"}]
    rows, q = _tables(records)
    assert latest_view(rows, q, lambda _: UPSERT)[0].num_rows == 1


Change = tuple[int, int, int | None]
"""(partition, key, value): a value of None is a tombstone."""


@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 4), st.one_of(st.none(), st.integers(0, 9))),
                max_size=60), st.integers(0, 60))
@example([(0, 0, 1), (1, 0, None)], 2)
def test_any_history_in_time_order_replays_to_the_view(changes: list[Change], as_of: int) -> None:
    """Every change gets the next millisecond: replaying them in produce order is the order the view states."""
    ends = [0, 0, 0]
    records: list[Record] = []
    tombstones: list[Record] = []
    expected: dict[bytes, bytes] = {}
    for i, (partition, key, value) in enumerate(changes):
        record = {"partition": partition, "offset": ends[partition], "ms": MS + i, "key": str(key).encode(),
                  "value": None if value is None else str(value).encode()}
        ends[partition] += 1
        (records if value is not None else tombstones).append(record)
        if i <= as_of:
            if value is None:
                expected.pop(record["key"], None)
            else:
                expected[record["key"]] = record["value"]
    assert _latest(records, tombstones, as_of=MS + as_of) == expected


def test_a_withheld_key_says_its_own_latest_record_s_reason() -> None:
    rows, q = _tables([{"offset": 1, "key": b"a", "value": b"1"}],
                      [{"offset": 0, "key": b"a", "value": b"x", "reason": "older, superseded"},
                       {"offset": 2, "key": b"b", "value": b"y", "reason": "the latest of b"}])
    _, stats = latest_view(rows, q, lambda _: UPSERT)
    assert stats.withheld == 1
    assert stats.withheld_reason.endswith("quarantined: the latest of b")
