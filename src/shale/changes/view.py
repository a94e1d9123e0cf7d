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
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shale.changes.columns import (
    DELETE,
    INCARNATION,
    ROW,
    SKIP,
    TRUNCATE,
    WITHHELD,
    TableRule,
    both,
    history_columns,
)
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
    more records is the view of the whole history plus those records (``latest_view_and_versions``).

    With them, what a later view needs of this one (``latest_view_after``): the view itself, the versions any
    recomputation must include (``pinned_*``: truncates, each scope's first record, every version of a
    column-keyed topic), the keys deleted and withheld (with the reason), and each scope's first Kafka time."""

    rows: pa.Table
    quarantined: pa.Table
    view: pa.Table | None = None
    """None: a later view recomputes the whole (a column-keyed topic: a tombstone finds its row through others)."""
    pinned_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    pinned_quarantined: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    deleted: pa.Array = field(default_factory=lambda: pa.array([], pa.binary()))
    withheld: pa.Table = field(default_factory=lambda: pa.table({"key": pa.array([], pa.binary()),
                                                                  "reason": pa.array([], pa.string())}))
    firsts: dict[tuple[str, int], int] = field(default_factory=dict)


def latest_view_and_versions(rows: pa.Table, quarantined: pa.Table,
                             rule_for: Callable[[str], TableRule]) -> tuple[pa.Table, ViewStats, Versions]:
    """``latest_view`` now, and the versions that decide it (for a column key, every version: a tombstone's key
    is found through the rows its record key named, which the versions would not keep). The stats count the
    records given: past versions they stand in for are not counted again."""
    view, stats, o = _view(rows, quarantined, rule_for, None)
    n = rows.num_rows
    keys = both(rows, quarantined, "key")
    pinned = np.zeros(n + quarantined.num_rows, dtype=bool)
    pinned[o.pinned] = True
    keep = o.keep
    versions = Versions(rows.take(pa.array(keep[keep < n], pa.int64())),
                        quarantined.take(pa.array(keep[keep >= n] - n, pa.int64())),
                        None if o.column_keyed else view, pinned[keep[keep < n]], pinned[keep[keep >= n]],
                        keys.take(pa.array(o.deleted, pa.int64())),
                        pa.table({"key": keys.take(pa.array(o.withheld, pa.int64())),
                                  "reason": pa.array(o.reasons, pa.string())}), o.firsts)
    return view, stats, versions


def latest_view_after(earlier: Versions, rows: pa.Table, quarantined: pa.Table,
                      rule_for: Callable[[str], TableRule]) -> tuple[pa.Table, ViewStats, Versions]:
    """``latest_view_and_versions`` of the history ``earlier`` stands for plus ``rows`` and ``quarantined``,
    recomputing only the keys those records name: the earlier view's other rows stand, and the keys they name are
    recomputed from their kept versions, the pinned ones and the new records. The whole is recomputed instead when
    the new records could change another key's row: a truncate, a column-keyed topic, a row whose incarnation is
    unknown, or a record older than its scope's first (which ranks the scope). The stats count the new records
    (skipped, no key) and the whole view (rows, deleted, withheld)."""
    def whole() -> tuple[pa.Table, ViewStats, Versions]:
        return latest_view_and_versions(pa.concat_tables([earlier.rows, rows]),
                                        pa.concat_tables([earlier.quarantined, quarantined]), rule_for)

    if earlier.view is None:
        return whole()
    new = history_columns(rows, quarantined, rule_for)
    if any(rule_for(name).key for name in new.topics) or (new.kind == TRUNCATE).any() or (new.incarnation < 0).any():
        return whole()
    for (code, incarnation), ms in _scope_firsts(new.topic, new.incarnation, new.kafka_ms).items():
        if ms < earlier.firsts.get((new.topics[code], incarnation), ms):
            return whole()
    touched = pc.unique(both(rows, quarantined, "key")).drop_null()
    mask_rows = np.asarray(pc.is_in(earlier.rows.column("key"), value_set=touched).fill_null(False), dtype=bool)
    mask_quarantined = np.asarray(pc.is_in(earlier.quarantined.column("key"), value_set=touched)
                                  .fill_null(False), dtype=bool)
    mask_rows |= earlier.pinned_rows
    mask_quarantined |= earlier.pinned_quarantined
    part_rows = pa.concat_tables([earlier.rows.filter(pa.array(mask_rows)), rows])
    part_quarantined = pa.concat_tables([earlier.quarantined.filter(pa.array(mask_quarantined)), quarantined])
    view, stats, versions = latest_view_and_versions(part_rows, part_quarantined, rule_for)
    assert versions.view is not None

    def named(table: pa.Table, column: str = "key") -> pa.Array:
        return pc.fill_null(pc.is_in(table.column(column), value_set=touched), False)

    view = pa.concat_tables([earlier.view.filter(pc.invert(named(earlier.view))), view.filter(named(view))])
    deleted = pa.concat_arrays([earlier.deleted.filter(pc.invert(pc.is_in(earlier.deleted, value_set=touched))),
                                versions.deleted.filter(pc.is_in(versions.deleted, value_set=touched))])
    withheld = pa.concat_tables([earlier.withheld.filter(pc.invert(named(earlier.withheld))),
                                 versions.withheld.filter(named(versions.withheld))])
    kept_rows, kept_quarantined = earlier.rows.filter(pa.array(~mask_rows)), earlier.quarantined.filter(
        pa.array(~mask_quarantined))
    after = Versions(pa.concat_tables([kept_rows, versions.rows]),
                     pa.concat_tables([kept_quarantined, versions.quarantined]), view,
                     np.concatenate([np.zeros(kept_rows.num_rows, dtype=bool), versions.pinned_rows]),
                     np.concatenate([np.zeros(kept_quarantined.num_rows, dtype=bool), versions.pinned_quarantined]),
                     deleted, withheld, {**earlier.firsts, **versions.firsts})
    stats.rows, stats.deleted, stats.withheld = view.num_rows, len(deleted), withheld.num_rows
    stats.withheld_reason = withheld.column("reason")[0].as_py() if withheld.num_rows else ""
    stats.skipped = int(np.count_nonzero(new.kind == SKIP))
    stats.no_key = int(np.count_nonzero((new.kind != SKIP) & (new.key < 0)))
    return view, stats, after


def _scope_firsts(topic: np.ndarray, incarnation: np.ndarray, kafka_ms: np.ndarray) -> dict[tuple[int, int], int]:
    """Each scope's (topic code, incarnation) first Kafka time."""
    firsts: dict[tuple[int, int], int] = {}
    for t, i, ms in zip(topic.tolist(), incarnation.tolist(), kafka_ms.tolist(), strict=True):
        if ms < firsts.get((t, i), ms + 1):
            firsts[(t, i)] = ms
    return firsts


@dataclass
class _Outcome:
    """What ``_view`` found beside the view: the versions to keep, those of them pinned, the keys' latest versions
    that delete or are withheld (with the reasons), each scope's first time, and whether a topic is column-keyed."""

    keep: np.ndarray
    pinned: np.ndarray
    deleted: np.ndarray
    withheld: np.ndarray
    reasons: list[str]
    firsts: dict[tuple[str, int], int]
    column_keyed: bool


def _view(rows: pa.Table, quarantined: pa.Table, rule_for: Callable[[str], TableRule],
          as_of_ms: int | None) -> tuple[pa.Table, ViewStats, _Outcome]:
    """The view, its stats and what decides it (``_Outcome``: the indices of the versions that decide it, those
    pinned, the keys deleted and withheld, the scopes' first times)."""
    stats = ViewStats()
    h = history_columns(rows, quarantined, rule_for)
    n = len(h.topic)
    topic, key, partition, incarnation, offset = h.topic, h.key, h.partition, h.incarnation, h.offset
    kafka_ms, change_ms, kind = h.kafka_ms, h.change_ms, h.kind
    none = np.zeros(0, dtype=np.int64)
    if not n:
        return rows.slice(0, 0).drop_columns([INCARNATION]), stats, _Outcome(none, none, none, none, [], {}, False)
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
    pinned = kept & ((kind == TRUNCATE) | np.isin(topic, column_keyed))
    first_of_scope = np.full(len(firsts), -1)  # per scope, a kept record of its first time
    at_first = np.flatnonzero(kept & (kafka_ms == rank))
    first_of_scope[scopes[at_first]] = at_first
    pinned[first_of_scope[first_of_scope >= 0]] = True
    keep = pinned.copy()
    keep[lasts] = True
    bound = int(incarnation.max()) + 1
    scope_firsts = {(h.topics[code // bound], code % bound): int(ms) for code, ms in enumerate(firsts.tolist())
                    if ms != np.iinfo(np.int64).max}
    deleted = latest[truncated | (kinds == DELETE)]
    outcome = _Outcome(np.flatnonzero(keep), np.flatnonzero(pinned), deleted, withheld,
                       [f"{h.where(int(i))}: {h.reason(int(i))}" for i in withheld.tolist()], scope_firsts,
                       bool(column_keyed))
    return view.drop_columns([INCARNATION]), stats, outcome
