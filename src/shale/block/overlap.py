"""Which records blocks hold, judged from their metadata alone: when one block holds every record of another, and
when two blocks may both hold one record (an overlap that stores records twice).

A block's Kafka ranges say which offsets it accounts for, not which records of those offsets it holds: the
partition group writes one block per partition value (dt, hour) for each range, and one quarantine block beside
them, all with the same range. So ranges are compared only within a *scope*: one group, generation, dataset kind
and set of partition values. A block has a scope when its ranges tell exactly which records it holds:

* all its datasets with rows are of one kind (a compaction of records and quarantine blocks mixes them), and
* its partition values are as many as its partition's widest for that kind (a compaction across days or hours
  keeps fewer, the common ones, and then holds only some records of its ranges for those values).

Lineage is the other proof: a block whose compaction sources include all of another's holds all of its records
(seed 000's full-overlap rule), whatever their scopes. Blocks without records (a range Kafka held none of) hold
nothing, so any block whose ranges include theirs holds all they hold.

Incarnations are compared exactly: ``''`` (not recorded) matches only ``''``.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from shale.block.meta import BlockMeta

RangeKey = tuple[str, int, str]
"""(topic, partition, incarnation)"""


@dataclass(frozen=True)
class Scope:
    group: str
    generation: int
    kind: str
    partition_values: str
    """As sorted JSON."""


@dataclass(frozen=True)
class Overlap:
    """Two blocks that may both hold a record: ``first`` reaches furthest among the blocks before ``second``."""

    first: str
    second: str
    detail: str


def _kinds(meta: BlockMeta) -> set[str]:
    return {d.kind for d in meta.datasets if d.rows}


def scopes(metas: Iterable[BlockMeta]) -> dict[str, Scope | None]:
    """Each block's scope, or None where its ranges do not tell which records it holds (and for blocks without
    records, which hold none)."""
    metas = list(metas)
    widest: dict[tuple[str, int, str, int, str], int] = defaultdict(int)
    for meta in metas:
        for kind in _kinds(meta):
            for r in meta.kafka:
                key = (meta.group, meta.generation, r.topic, r.partition, kind)
                widest[key] = max(widest[key], len(meta.partition_values))
    out: dict[str, Scope | None] = {}
    for meta in metas:
        kinds = _kinds(meta)
        out[meta.id] = None
        if len(kinds) == 1:
            kind = next(iter(kinds))
            if all(len(meta.partition_values) == widest[(meta.group, meta.generation, r.topic, r.partition, kind)]
                   for r in meta.kafka):
                out[meta.id] = Scope(meta.group, meta.generation, kind,
                                     json.dumps(meta.partition_values, sort_keys=True))
    return out


def spans(metas: Iterable[BlockMeta]) -> dict[RangeKey, list[tuple[int, int]]]:
    """The union of the blocks' non-empty ranges, per (topic, partition, incarnation), as sorted disjoint spans."""
    raw: dict[RangeKey, list[tuple[int, int]]] = defaultdict(list)
    for meta in metas:
        for r in meta.kafka:
            if r.end > r.start:
                raw[(r.topic, r.partition, r.incarnation)].append((r.start, r.end))
    out: dict[RangeKey, list[tuple[int, int]]] = {}
    for key, ranges in raw.items():
        ranges.sort()
        merged = [ranges[0]]
        for start, end in ranges[1:]:
            if start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], end))
            else:
                merged.append((start, end))
        out[key] = merged
    return out


def _inside(meta: BlockMeta, union: dict[RangeKey, list[tuple[int, int]]]) -> bool:
    for r in meta.kafka:
        if r.end > r.start and not any(s <= r.start and r.end <= e
                                       for s, e in union.get((r.topic, r.partition, r.incarnation), [])):
            return False
    return True


class Holders:
    """Blocks that hold records, indexed by compaction source and by range, to answer ``held``: which of them
    together hold every record of another block."""

    def __init__(self, scope_of: dict[str, Scope | None]) -> None:
        self.scope_of = scope_of
        self._by_source: dict[str, list[BlockMeta]] = defaultdict(list)
        self._by_range: dict[tuple[object, ...], list[BlockMeta]] = defaultdict(list)

    def add(self, meta: BlockMeta) -> None:
        for source in meta.compaction.sources:
            self._by_source[source].append(meta)
        scope = self.scope_of.get(meta.id)
        for key in {(r.topic, r.partition, r.incarnation) for r in meta.kafka if r.end > r.start}:
            self._by_range[(meta.group, meta.generation, key)].append(meta)
            if scope is not None:
                self._by_range[(scope, key)].append(meta)

    def held(self, meta: BlockMeta) -> list[str]:
        """The blocks that together hold every record ``meta`` holds (ids, one if one suffices), or [] if they
        do not. By lineage: every compaction source of ``meta`` is a source of one of them. By offsets: ``meta``
        has a scope and its ranges lie inside the union of the ranges of the blocks of that scope (of any block
        of its group and generation, if ``meta`` holds no records)."""
        mine = set(meta.compaction.sources)
        lineage = {o.id: o for s in mine for o in self._by_source.get(s, []) if o.id != meta.id}
        if mine and mine <= {s for o in lineage.values() for s in o.compaction.sources}:
            alone = sorted(i for i, o in lineage.items() if mine <= set(o.compaction.sources))
            return alone[:1] or sorted(lineage)
        keys = {(r.topic, r.partition, r.incarnation) for r in meta.kafka if r.end > r.start}
        if _kinds(meta):
            scope = self.scope_of.get(meta.id)
            if scope is None or not keys:
                return []  # its ranges do not say which records it holds
            lookups: list[tuple[object, ...]] = [(scope, key) for key in keys]
        else:
            lookups = [(meta.group, meta.generation, key) for key in keys]
        same = {o.id: o for lookup in lookups for o in self._by_range.get(lookup, []) if o.id != meta.id}
        if not _inside(meta, spans(same.values())):
            return []
        alone = sorted(i for i, o in same.items() if _inside(meta, spans([o])))
        return alone[:1] or sorted(i for i, o in same.items() if _intersect(meta, o))


def _intersect(a: BlockMeta, b: BlockMeta) -> bool:
    return any((ra.topic, ra.partition, ra.incarnation) == (rb.topic, rb.partition, rb.incarnation)
               and ra.start < rb.end and rb.start < ra.end for ra in a.kafka for rb in b.kafka)


def overlaps(metas: Sequence[BlockMeta]) -> list[Overlap]:
    """Pairs of blocks that may both hold a record: blocks of one scope whose ranges intersect, and blocks that
    share a compaction source where neither holds all the other's (two compactions of overlapping sources)."""
    scope_of = scopes(metas)
    by_key: dict[tuple[Scope, RangeKey], list[tuple[int, int, str]]] = defaultdict(list)
    for meta in metas:
        scope = scope_of[meta.id]
        if scope is None:
            continue
        for r in meta.kafka:
            if r.end > r.start:
                by_key[(scope, (r.topic, r.partition, r.incarnation))].append((r.start, r.end, meta.id))
    found: dict[tuple[str, str], Overlap] = {}
    for (scope, (topic, partition, _)), ranges in sorted(by_key.items(), key=lambda kv: repr(kv[0])):
        ranges.sort()
        reach, holder = ranges[0][1], ranges[0][2]  # the furthest end so far, and the block that reaches it
        for start, end, block_id in ranges[1:]:
            if start < reach and block_id != holder:
                pair = (holder, block_id)
                found.setdefault(pair, Overlap(holder, block_id, (
                    f"{scope.group} generation {scope.generation} {scope.kind} {topic}[{partition}] offsets "
                    f"[{start},{min(reach, end)}) are in both {holder} and {block_id}")))
            if end > reach:
                reach, holder = end, block_id
    by_source: dict[str, list[BlockMeta]] = defaultdict(list)
    for meta in metas:
        for source in meta.compaction.sources:
            by_source[source].append(meta)
    for source, sharing in sorted(by_source.items()):
        for i, a in enumerate(sharing):
            for b in sharing[i + 1:]:
                sa, sb = set(a.compaction.sources), set(b.compaction.sources)
                pair = (min(a.id, b.id), max(a.id, b.id))
                if not (sa <= sb or sb <= sa) and pair not in found and pair[::-1] not in found:
                    found[pair] = Overlap(pair[0], pair[1], f"{pair[0]} and {pair[1]} both hold the records of "
                                                            f"block {source} (compaction lineage)")
    return sorted(found.values(), key=lambda o: (o.second, o.first))
