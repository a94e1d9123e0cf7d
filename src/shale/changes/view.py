"""The latest-row view of a change table, computed from its stored history (pure: tables in, a table out).

The order of versions (docs/design/change-tables.md, "Order"): inside one partition of one incarnation, offset
order decides, whatever the timestamps say. Between partitions (a topic whose partition count grew) or
incarnations (a topic deleted and created again), each scope's last version of the key is compared by its change
time (Debezium: ``source.ts_ms``; otherwise, or when a record does not say, the Kafka record's timestamp), then by
incarnation (the one whose first record is older comes first), then by partition, then by offset. ``as_of`` keeps
the records whose Kafka timestamp is at or before it: the view as it stood then.

The versions are columns (``columns.history_columns``); the choice among them is numpy sorts; the rows are taken
with one Arrow ``take``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from shale.changes.columns import DELETE, INCARNATION, ROW, SKIP, TRUNCATE, WITHHELD, TableRule, history_columns
from shale.errors import ShaleError


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


def _last_per_group(order: np.ndarray, *groups: np.ndarray) -> np.ndarray:
    """Of the indices ``order`` (sorted by the groups, then by the deciding keys), the last of each group."""
    if not len(order):
        return order
    change = np.zeros(len(order), dtype=bool)
    change[-1] = True
    for group in groups:
        g = group[order]
        change[:-1] |= g[1:] != g[:-1]
    return order[change]


def latest_view(rows: pa.Table, quarantined: pa.Table, rule_for: Callable[[str], TableRule],
                as_of_ms: int | None = None) -> tuple[pa.Table, ViewStats]:
    """The latest row per key of ``rows`` (parsed records, with ``INCARNATION``) and ``quarantined`` (the
    quarantine dataset's records, with ``INCARNATION``), with the module's order; ``rows``' columns, without
    ``INCARNATION``. Raises ShaleError when a row's incarnation is unknown (its order cannot be told)."""
    view, stats, _ = _view(rows, quarantined, rule_for, as_of_ms)
    return view, stats


@dataclass
class Versions:
    """The versions of a history that decide its view, whatever is added to it: per key and scope (partition and
    incarnation) the last, every truncate, and each scope's first record (its rank). The view of these plus any
    more records is the view of the whole history plus those records (``latest_view_and_versions``)."""

    rows: pa.Table
    quarantined: pa.Table


def latest_view_and_versions(rows: pa.Table, quarantined: pa.Table,
                             rule_for: Callable[[str], TableRule]) -> tuple[pa.Table, ViewStats, Versions]:
    """``latest_view`` now, and the versions that decide it (for a column key, every version: a tombstone's key
    is found through the rows its record key named, which the versions would not keep). The stats count the
    records given: past versions they stand in for are not counted again."""
    view, stats, keep = _view(rows, quarantined, rule_for, None)
    n = rows.num_rows
    return view, stats, Versions(rows.take(pa.array(keep[keep < n], pa.int64())),
                                 quarantined.take(pa.array(keep[keep >= n] - n, pa.int64())))


def _view(rows: pa.Table, quarantined: pa.Table, rule_for: Callable[[str], TableRule],
          as_of_ms: int | None) -> tuple[pa.Table, ViewStats, np.ndarray]:
    """The view, its stats and the indices of the versions that decide it (``Versions``)."""
    stats = ViewStats()
    h = history_columns(rows, quarantined, rule_for)
    n = len(h.topic)
    topic, key, partition, incarnation, offset = h.topic, h.key, h.partition, h.incarnation, h.offset
    kafka_ms, change_ms, kind = h.kafka_ms, h.change_ms, h.kind
    if not n:
        return rows.slice(0, 0).drop_columns([INCARNATION]), stats, np.zeros(0, dtype=np.int64)
    # One version per record (the first read), none after as_of.
    first = _last_per_group(np.lexsort((-np.arange(n), offset, incarnation, partition, topic)), topic, partition,
                            incarnation, offset)
    kept = np.zeros(n, dtype=bool)
    kept[first] = True
    if as_of_ms is not None:
        kept &= kafka_ms <= as_of_ms
    if (unknown := np.flatnonzero(kept & (incarnation < 0))).size:
        raise ShaleError(f"{h.where(int(unknown[0]))}: its block cannot tell which incarnation of the topic it "
                         "belongs to (a merge of two incarnations whose offsets overlap), so its order among the "
                         "key's versions is unknown; read the history instead")
    # An incarnation's rank: its first kept record's Kafka time (then its code, the next key of every sort).
    scopes = topic * (int(incarnation.max()) + 1) + incarnation  # few: topics times incarnations
    rank = np.full(n, np.iinfo(np.int64).max)
    firsts = np.full(int(scopes.max()) + 1, np.iinfo(np.int64).max)
    np.minimum.at(firsts, scopes[kept], kafka_ms[kept])
    rank[kept] = firsts[scopes[kept]]
    stats.skipped = int(np.count_nonzero(kept & (kind == SKIP)))
    changes = kept & (kind != SKIP) & (kind != TRUNCATE)
    stats.no_key = int(np.count_nonzero(changes & (key < 0)))
    candidates = np.flatnonzero(changes & (key >= 0))
    # Per key and scope, the highest offset; then per key, the latest scope's (change time, rank, incarnation,
    # partition, offset).
    by_scope = candidates[np.lexsort((offset[candidates], incarnation[candidates], partition[candidates],
                                      key[candidates]))]
    lasts = _last_per_group(by_scope, key, partition, incarnation)
    ordered = lasts[np.lexsort((offset[lasts], partition[lasts], incarnation[lasts], rank[lasts], change_ms[lasts],
                                key[lasts]))]
    latest = _last_per_group(ordered, key)
    order = (change_ms, rank, incarnation, partition, offset)
    cut: dict[int, tuple[int, ...]] = {}
    for t in np.flatnonzero(kept & (kind == TRUNCATE)).tolist():
        position = tuple(int(column[t]) for column in order)
        cut[int(topic[t])] = max(cut.get(int(topic[t]), position), position)
    truncated = np.zeros(len(latest), dtype=bool)  # per key: its latest version precedes a truncate of its topic
    if cut:
        for j, i in enumerate(latest.tolist()):
            truncate = cut.get(int(topic[i]))
            if truncate is not None:
                here = tuple(int(column[i]) for column in order)
                truncated[j] = here[4] < truncate[4] if here[2:4] == truncate[2:4] else here < truncate
    kinds = kind[latest]
    stats.deleted = int(np.count_nonzero(truncated | (kinds == DELETE)))
    withheld = latest[~truncated & (kinds == WITHHELD)]
    stats.withheld = len(withheld)
    if stats.withheld:
        one = int(withheld[0])
        stats.withheld_reason = f"{h.where(one)}: {h.reason(one)}"
    chosen = np.sort(latest[~truncated & (kinds == ROW)])  # a row version's index is its row
    stats.rows = len(chosen)
    view = rows.take(pa.array(chosen, pa.int64())) if len(chosen) else rows.slice(0, 0)
    # What decides the view whatever comes: per key and scope the last version (a later record of a scope can
    # supersede its key's latest, and another scope's last must then decide), every truncate, each scope's first.
    column_keyed = [code for code, name in enumerate(h.topics) if rule_for(name).key]
    keep = kept & ((kind == TRUNCATE) | np.isin(topic, column_keyed))
    keep[lasts] = True
    first_of_scope = np.full(len(firsts), -1)  # per scope, a kept record of its first time
    at_first = np.flatnonzero(kept & (kafka_ms == rank))
    first_of_scope[scopes[at_first]] = at_first
    keep[first_of_scope[first_of_scope >= 0]] = True
    return view.drop_columns([INCARNATION]), stats, np.flatnonzero(keep)
