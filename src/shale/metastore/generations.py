"""Generations in the state machine (seed 002): the switches ingestion records, and the coverage a retiring switch
needs (``SetActiveGeneration`` refuses to retire blocks whose offsets the new generation does not hold)."""

from __future__ import annotations

from collections import defaultdict

from shale.block import BlockMeta
from shale.index import IndexWriter
from shale.metastore.commands import CommitIngestBatch

OPEN_END = 2**62
"""The end of a switch that lasts until a later one (milliseconds; the query path's "no bound")."""


def switch_to_ingest(w: IndexWriter, cmd: CommitIngestBatch) -> None:
    """What readers see of a topic is recorded, never taken from a reader's configuration (seed 002's generations
    isolate an upgrade): the first ingest commit of a topic makes its generation the active one at every time, and
    the first commit of a newer ingest generation (``ingest.generation`` raised for an upgrade) makes it the active
    one from its first record's time on. Older data stays visible in its own generation; a reprocess generation is
    published only by ``SetActiveGeneration``; going back to an older generation is an explicit switch."""
    first: dict[tuple[str, str], int] = {}
    for meta in cmd.blocks:
        for d in meta.datasets:
            if d.rows:
                key = (meta.tenant, d.topic)
                first[key] = min(first.get(key, d.min_time), d.min_time)
    for (tenant, topic), start in sorted(first.items()):
        rules = w.topic_rules(tenant, topic)
        if not rules:
            w.add_generation_rule(tenant, topic, 0, OPEN_END, cmd.generation)
            continue
        active = None
        for low, high, generation in rules:  # oldest first: the latest covering switch wins
            if low <= start <= high:
                active = generation
        if active is not None and active < cmd.generation:
            w.add_generation_rule(tenant, topic, start, OPEN_END, cmd.generation)


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
