"""Generations in the state machine (seed 002): when ingestion switches readers to a newer generation, what an
operator's switch binds, and the coverage a retiring switch needs (``SetActiveGeneration`` refuses to retire blocks
whose offsets the new generation does not hold).

A topic's switches (``generations`` rows, per tenant) say which generation readers see at each data time: the
latest switch covering a time wins. The generation the switch covering the open end names is the *serving* one:
new data is read from it. A newer ingest generation (``ingest.generation`` raised for an upgrade) runs beside the
serving one and is switched in by the commit that finds it caught up (DESIGN 10.5):

1. it has caught up when, in every partition of the topic, its committed end is at or past the serving
   generation's (in the same topic incarnation, or past an incarnation the serving one is still in);
2. it then becomes active from the time after which it holds every offset that readers see of another
   generation: ``start`` is one past the newest data time of each shown block of another generation holding an
   offset it lacks (a block's records carry no finer time than its own range), or 0 when it lacks none;
3. never over an operator's switch that binds it (``SetActiveGeneration`` binds every generation that had
   committed offsets of the topic when it was made): a switch back is not undone by the next batch; a generation
   started after the switch is a new upgrade and takes over when it has caught up.

Before it has caught up, the serving generation stays active at every time, so no query loses a record it
returned (the Iceberg tables follow the switches, so they change only at the switch too). A topic's first ingest
commit (no other generation has offsets of it) is caught up at once and makes its generation active at every time.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Sequence

from shale.block import BlockMeta
from shale.index import IndexWriter
from shale.index import generations as generation_store
from shale.index import offsets as offset_store
from shale.metastore.rules.commands import CommitIngestBatch, SetActiveGeneration

OPEN_END = 2**62
"""The end of a switch that lasts until a later one (milliseconds; the query path's "no bound")."""

Rule = tuple[int, int, int]
"""One switch of a topic: (start ms, end ms, generation), both ends inclusive."""
Span = tuple[int, int]
"""An interval of data time in milliseconds, both ends inclusive."""
Switches = dict[str, list[list[int | str]]]
"""The switches one commit made, per tenant: [topic, start, end, generation] each (its result's ``switches``)."""


def owners(rules: Sequence[Rule], low: int, high: int) -> list[tuple[int, int, int | None]]:
    """``[low, high]`` cut into pieces, each with the generation active there (the latest switch covering it wins;
    None where no switch does, which readers give their configured ``ingest.generation``)."""
    mine = [(s, e, g) for s, e, g in rules if e >= low and s <= high]
    cuts = sorted({low, high + 1, *(max(low, s) for s, _, _ in mine), *(min(high, e) + 1 for _, e, _ in mine)})
    out: list[tuple[int, int, int | None]] = []
    for a, b in itertools.pairwise(cuts):
        active = None
        for s, e, g in mine:  # oldest first: later switches override
            if s <= a and b - 1 <= e:
                active = g
        if out and out[-1][2] == active and out[-1][1] == a - 1:
            out[-1] = (out[-1][0], b - 1, active)
        else:
            out.append((a, b - 1, active))
    return out


def serving(rules: Sequence[Rule]) -> int | None:
    """The generation new data is read from: the one the switch covering the open end names (None: no switch
    does)."""
    return owners(rules, OPEN_END, OPEN_END)[0][2]


def subtract(spans: Sequence[Span], cuts: Sequence[Span]) -> list[Span]:
    """The parts of ``spans`` no span of ``cuts`` covers."""
    out = list(spans)
    for c_low, c_high in cuts:
        out = [piece for low, high in out
               for piece in ((low, min(high, c_low - 1)), (max(low, c_high + 1), high)) if piece[0] <= piece[1]]
    return out


def pin_switch(w: IndexWriter, cmd: SetActiveGeneration) -> None:
    """Record an operator's switch with the newest generation of its topic it binds: its own, or one that has
    committed offsets of the topic in the partition group (live or reprocessed)."""
    binds = max([cmd.generation, *offset_store.topic_offsets(w.conn, "partition", cmd.topic)])
    generation_store.add_pin(w.conn, cmd.tenant, cmd.topic, cmd.start, cmd.end, cmd.generation, binds)


def switch_when_caught_up(w: IndexWriter, cmd: CommitIngestBatch) -> Switches:
    """The switches an ingest commit of the partition group makes (the module's rule), after its offsets are
    recorded: for each topic of the batch and each tenant of it (one with records in the batch, or with switches of
    the topic already). Deterministic: it reads only the state and the command."""
    made: Switches = {}
    generation = cmd.generation
    for topic in sorted({r.topic for r in cmd.ranges}):
        tenants = {m.tenant for m in cmd.blocks for d in m.datasets if d.rows and d.topic == topic}
        offsets = offset_store.topic_offsets(w.conn, cmd.group, topic)
        every = generation_store.rules_by_tenant(w.conn, topic)
        held: dict[tuple[int, str], list[tuple[int, int]]] | None = None
        for tenant in sorted(tenants | set(every)):
            rules = every.get(tenant, [])
            free = _free(w, tenant, topic, generation, rules)
            if not free or not _caught_up(w, cmd.group, topic, generation, _behind(rules, generation, offsets),
                                          offsets):
                continue
            if held is None:  # what the generation holds counts in every tenant's blocks (they share the ranges)
                held = offsets_held(w.group_block_metas(cmd.group, generation=generation), topic)
            start = _switch_start(w.group_block_metas(cmd.group, tenant=tenant), topic, generation, rules, held)
            for low, high in free:
                if high >= start and w.add_generation_rule(tenant, topic, max(low, start), high, generation):
                    made.setdefault(tenant, []).append([topic, max(low, start), high, generation])
    return made


def _free(w: IndexWriter, tenant: str, topic: str, generation: int, rules: Sequence[Rule]) -> list[Span]:
    """Where a switch to ``generation`` may go: nowhere when it serves already or an older one would be switched in
    (going back is an operator's switch), or when an operator's switch that binds it covers the open end; else
    every time no such switch covers and where it is not active already."""
    now = serving(rules)
    if now is not None and now >= generation:
        return []
    pins = [(s, e) for s, e, binds in generation_store.pins(w.conn, tenant, topic) if binds >= generation]
    if any(s <= OPEN_END <= e for s, e in pins):
        return []
    mine = [(a, b) for a, b, g in owners(rules, 0, OPEN_END) if g == generation]
    return subtract([(0, OPEN_END)], pins + mine)


def _behind(rules: Sequence[Rule], generation: int, offsets: dict[int, dict[int, tuple[int, str, str]]]) -> list[int]:
    """The generations ``generation`` must catch up with: the serving one; when no switch names one (a topic's
    first commit, or switches recorded only for closed ranges), every other generation live ingestion writes."""
    now = serving(rules)
    if now is not None:
        return [now]
    return [g for g, rows in offsets.items()
            if g != generation and all(writer in ("ingest", "") for _, _, writer in rows.values())]


def _caught_up(w: IndexWriter, group: str, topic: str, generation: int, behind: list[int],
               offsets: dict[int, dict[int, tuple[int, str, str]]]) -> bool:
    """Whether ``generation`` has committed, in every partition of ``topic`` that a generation of ``behind`` has,
    at least as far: in the same incarnation, or past an incarnation that one is still in."""
    mine = offsets.get(generation, {})
    for other in behind:
        for partition, (end, incarnation, _) in offsets.get(other, {}).items():
            own = mine.get(partition)
            if own is None:
                return False
            if incarnation and own[1] and incarnation != own[1]:
                if not offset_store.is_past_incarnation(w.conn, group, generation, topic, partition, incarnation):
                    return False
            elif own[0] < end:
                return False
    return True


def _switch_start(metas: list[BlockMeta], topic: str, generation: int, rules: Sequence[Rule],
                  held: dict[tuple[int, str], list[tuple[int, int]]]) -> int:
    """The first time from which ``generation`` holds every offset of ``topic`` that readers see in one of
    ``metas`` (one tenant's blocks of the group) of another generation: a block counts where its generation is
    active or no switch decides (readers' configured generation may be its own)."""
    start = 0
    for meta in metas:
        datasets = [d for d in meta.datasets if d.topic == topic]
        if meta.generation == generation or not datasets:
            continue
        low, high = min(d.min_time for d in datasets), max(d.max_time for d in datasets)
        if high < start or all(g not in (meta.generation, None) for _, _, g in owners(rules, low, high)):
            continue
        if any(first_gap(held.get((r.partition, r.incarnation), []), r.start, r.end) is not None
               for r in meta.kafka if r.topic == topic):
            start = high + 1
    return start


def offsets_held(metas: list[BlockMeta], topic: str) -> dict[tuple[int, str], list[tuple[int, int]]]:
    """Per (partition, incarnation), the offset ranges of ``topic`` the blocks account for, sorted. A block may hold
    several topics (a batch of two topics, a repair merge): only its ranges of ``topic`` count."""
    held: dict[tuple[int, str], list[tuple[int, int]]] = defaultdict(list)
    for meta in metas:
        for r in meta.kafka:
            if r.topic == topic:
                held[(r.partition, r.incarnation)].append((r.start, r.end))
    return {key: sorted(spans) for key, spans in held.items()}


def first_gap(spans: list[tuple[int, int]], start: int, end: int) -> tuple[int, int] | None:
    """The first part of ``[start, end)`` no span covers, or None."""
    at = start
    for low, high in spans:
        if at >= end:
            break
        if high <= low:  # an empty range covers nothing
            continue
        if low > at:
            return at, min(low, end)
        at = max(at, high)
    return (at, end) if at < end else None
