"""The latest-row view of a change table, computed from its stored history (pure: tables in, a table out).

The order of versions (docs/design/change-tables.md, "Order"): inside one partition of one incarnation, offset
order decides, whatever the timestamps say. Between partitions (a topic whose partition count grew) or
incarnations (a topic deleted and created again), each scope's last version of the key is compared by its change
time (Debezium: ``source.ts_ms``; otherwise, or when a record does not say, the Kafka record's timestamp), then by
incarnation (the one whose first record is older comes first), then by partition, then by offset. ``as_of`` keeps
the records whose Kafka timestamp is at or before it: the view as it stood then.

Not thread-safe; a per-record Python loop over the history's small columns (key, position, times), the slow path:
the rows themselves are taken with one Arrow ``take``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
import pyarrow as pa

from shale.changes.envelope import Kind, Meaning, of_debezium_value, of_op
from shale.errors import ShaleError

TableMode = Literal["append", "upsert", "debezium"]
INCARNATION = "_incarnation"
"""The column of both history tables holding each row's incarnation (an ``IncarnationCodes`` code; a negative code
is a row whose block cannot tell its incarnation)."""


@dataclass(frozen=True)
class TableRule:
    """A topic's change-table rule: its mode and its key ('' = the Kafka record key, or a column path)."""

    mode: TableMode
    key: str = ""


@dataclass
class ViewStats:
    """What the view made of the history: keys shown, deleted and withheld (their latest record's meaning cannot be
    read: the first reason is kept), records skipped (no row change) and records with no key."""

    rows: int = 0
    deleted: int = 0
    withheld: int = 0
    withheld_reason: str = ""
    skipped: int = 0
    no_key: int = 0


@dataclass(frozen=True)
class Version:
    topic: str
    key: Any
    partition: int
    incarnation: int
    offset: int
    kafka_ms: int
    change_ms: int
    kind: Kind
    row: int = -1
    """Its row in the stored rows (a "row" version), else -1."""
    reason: str = ""


@dataclass
class _Ranks:
    """Incarnations of a topic ordered by their first record's Kafka time, then by code."""

    first: dict[tuple[str, int], int] = field(default_factory=dict)

    def see(self, topic: str, incarnation: int, ms: int) -> None:
        scope = (topic, incarnation)
        self.first[scope] = min(ms, self.first.get(scope, ms))

    def order(self, v: Version) -> tuple[int, int, int, int, int]:
        return (v.change_ms, self.first[(v.topic, v.incarnation)], v.incarnation, v.partition, v.offset)


def _hashable(value: Any) -> Any:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS) if isinstance(value, dict | list) else value


def key_column(rows: pa.Table, path: str) -> list[Any]:
    """The values of a key column path: the column of that name with dots as underscores (the json parser's name
    for a dot path), or a struct column's field (``after.id``)."""
    flat = path.replace(".", "_")
    if flat in rows.column_names:
        return [_hashable(v) for v in rows.column(flat).to_pylist()]
    head, *rest = path.split(".")
    if head not in rows.column_names:
        raise ShaleError(f"the change table's key {path!r} names no column of its rows ({', '.join(rows.column_names)})"
                         ": fix key in the topic's ingest.parsers rule")
    values = []
    for top in rows.column(head).to_pylist():
        value = top
        for part in rest:
            value = value.get(part) if isinstance(value, dict) else None
        values.append(_hashable(value))
    return values


def _ms(column: pa.ChunkedArray) -> list[int]:
    return column.cast(pa.int64()).to_pylist()  # type: ignore[no-any-return]  # UTC microseconds


def _row_meanings(rows: pa.Table, topics: list[str], rule_for: Callable[[str], TableRule]) -> list[Meaning]:
    values = rows.column("value").to_pylist()
    ops = rows.column("op").to_pylist() if "op" in rows.column_names else [None] * rows.num_rows
    sources = rows.column("source").to_pylist() if "source" in rows.column_names else [None] * rows.num_rows
    out = []
    for topic, value, op, source in zip(topics, values, ops, sources, strict=True):
        if rule_for(topic).mode != "debezium":
            out.append(Meaning("row" if value is not None else "delete"))
        elif op is not None:
            out.append(of_op(op, source if isinstance(source, dict) else None))
        else:
            out.append(of_debezium_value(value))
    return out


def _versions(rows: pa.Table, quarantined: pa.Table, rule_for: Callable[[str], TableRule]) -> Iterator[Version]:
    """Every stored version, the parsed rows first and then the quarantined records (a record stored twice,
    in blocks a compaction has not yet replaced, is the same version: the caller keeps the first)."""
    topics = rows.column("topic").to_pylist()
    keys: list[Any] = rows.column("key").to_pylist()
    by_record_key: dict[tuple[str, Any], Any] = {}
    for topic in dict.fromkeys(topics):
        rule = rule_for(topic)
        if rule.mode == "upsert" and rule.key:
            column = key_column(rows, rule.key)
            for i, t in enumerate(topics):
                if t == topic:
                    by_record_key[(t, keys[i])] = column[i]
                    keys[i] = column[i]
    meanings = _row_meanings(rows, topics, rule_for)
    kafka = _ms(rows.column("timestamp"))
    for i, (topic, key, partition, incarnation, offset, meaning) in enumerate(zip(
            topics, keys, rows.column("partition").to_pylist(), rows.column(INCARNATION).to_pylist(),
            rows.column("offset").to_pylist(), meanings, strict=True)):
        ms = kafka[i] // 1000
        change = ms if meaning.source_ms is None else meaning.source_ms
        yield Version(topic, key, partition, incarnation, offset, ms, change, meaning.kind,
                      i if meaning.kind == "row" else -1, meaning.reason)
    q_kafka = _ms(quarantined.column("timestamp"))
    for i, (topic, record_key, partition, incarnation, offset, value, reason) in enumerate(zip(
            *(quarantined.column(c).to_pylist() for c in ("topic", "key", "partition", INCARNATION, "offset",
                                                          "value", "reason")), strict=True)):
        rule = rule_for(topic)
        meaning = of_debezium_value(value) if rule.mode == "debezium" else \
            Meaning("delete" if value is None else "withheld")
        if meaning.kind in {"row", "withheld"}:
            meaning = Meaning("withheld", meaning.source_ms, f"quarantined: {reason}")
        # With a column key, the row this record key named (a tombstone has no columns to name it).
        key = by_record_key.get((topic, record_key)) if rule.mode == "upsert" and rule.key else record_key
        ms = q_kafka[i] // 1000
        yield Version(topic, key, partition, incarnation, offset, ms,
                      ms if meaning.source_ms is None else meaning.source_ms, meaning.kind, -1, meaning.reason)


def latest_view(rows: pa.Table, quarantined: pa.Table, rule_for: Callable[[str], TableRule],
                as_of_ms: int | None = None) -> tuple[pa.Table, ViewStats]:
    """The latest row per key of ``rows`` (parsed records, with ``INCARNATION``) and ``quarantined`` (the
    quarantine dataset's records, with ``INCARNATION``), with the module's order; ``rows``' columns, without
    ``INCARNATION``. Raises ShaleError when a row's incarnation is unknown (its order cannot be told)."""
    stats = ViewStats()
    seen: set[tuple[str, int, int, int]] = set()
    ranks = _Ranks()
    last: dict[tuple[str, Any, int, int], Version] = {}
    truncates: dict[str, list[Version]] = {}
    for v in _versions(rows, quarantined, rule_for):
        position = (v.topic, v.partition, v.incarnation, v.offset)
        if position in seen or (as_of_ms is not None and v.kafka_ms > as_of_ms):
            continue
        seen.add(position)
        if v.incarnation < 0:
            raise ShaleError(f"topic {v.topic} partition {v.partition} offset {v.offset}: its block cannot tell which "
                             "incarnation of the topic it belongs to (a merge of two incarnations whose offsets "
                             "overlap), so its order among the key's versions is unknown; read the history instead")
        ranks.see(v.topic, v.incarnation, v.kafka_ms)
        if v.kind == "skip":
            stats.skipped += 1
        elif v.kind == "truncate":
            truncates.setdefault(v.topic, []).append(v)
        elif v.key is None:
            stats.no_key += 1
        else:
            scope = (v.topic, v.key, v.partition, v.incarnation)
            if scope not in last or last[scope].offset < v.offset:
                last[scope] = v
    latest: dict[tuple[str, Any], Version] = {}
    for (topic, key, _, _), v in last.items():
        held = latest.get((topic, key))
        if held is None or ranks.order(held) < ranks.order(v):
            latest[(topic, key)] = v
    cut = {topic: max(ts, key=ranks.order) for topic, ts in truncates.items()}
    taken = []
    for (topic, _), v in latest.items():
        t = cut.get(topic)
        truncated = t is not None and (v.offset < t.offset if (v.partition, v.incarnation) == (t.partition,
                                                                                                t.incarnation)
                                       else ranks.order(v) < ranks.order(t))
        if truncated or v.kind == "delete":
            stats.deleted += 1
        elif v.kind == "withheld":
            stats.withheld += 1
            stats.withheld_reason = stats.withheld_reason or f"{topic} [{v.partition}] {v.offset}: {v.reason}"
        else:
            taken.append(v.row)
    stats.rows = len(taken)
    view = rows.take(pa.array(sorted(taken), pa.int64())) if taken else rows.slice(0, 0)
    return view.drop_columns([INCARNATION]), stats
