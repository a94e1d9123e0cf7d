"""A lost batch's blocks, marked as soon as the shard's next commit takes their offsets (docs/design/ingest.md 10.1).

A batch that never committed (its driver killed after its tasks wrote; a batch that failed after some of its
blocks were complete) leaves complete level-0 blocks that no commit holds. Once the shard's next commit takes the
same offsets in blocks of its own, a reader of the bucket alone (a bucket scan, a bucket index built from one)
would read those records twice. The leader's bucket scan marks such blocks, but only every
``metastore.bucket_scan_interval``; the driver that made the commit marks them at once::

    arm(since_ms)    on taking the lease (the predecessor's last batch may be lost; from the later of the shard's
                     last commit and the predecessor's grant), and after a failed batch (from its read time)
    record(command)  every commit this process sends while armed: its ranges and its blocks
    sweep(committed) once a commit is applied (every recorded one is then applied, in order): per tenant, LIST the
                     group's blocks made since ``since_ms`` (one LIST per day folder, from that time on: ids sort
                     by time), GET their meta.json, and mark each batch's block that is ``superseded`` and that no
                     commit can claim (``shale.metastore.unclaimed``); the listed blocks a commit may still claim
                     are kept in memory and judged again after each later commit, with no LIST

Why it never marks a committed block, although it reads nothing of the index: a partition's offsets of one
incarnation are committed once, so the only committed blocks with a range overlapping offsets this process
committed are its own commits' blocks (a block that replaces one of them, an erasure's or a repair's, names it as
a parent). Why it never marks a block some commit may still take: it marks only what the leader's rule
(``shale.metastore.unclaimed``) says no commit can claim, judged by this process's committed offsets, which are
the metastore's or behind them (another shard's partition), and behind only makes the rule keep more.

What it leaves to the leader's bucket scan: blocks of a batch planned more than ``CLOCK_SKEW_MS`` before the
shard's last commit seen at the takeover (a predecessor that failed batches before its last commit), blocks a
predecessor that was cut off rather than killed uploads after the sweep listed the bucket, and kept blocks whose
other offsets a later process commits. A kept block holds offsets that are not committed yet (a partition paused,
or its offsets lost with this block their only copy): it is marked once they are, and until then a bucket-only
reader may read its committed records twice, as it may before the leader's scan.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Mapping

from shale.block import BlockFetcher, BlockMeta, BlockState, write_deletion_mark
from shale.ingest import metrics
from shale.metastore import Claims, CommitIngestBatch, unclaimed
from shale.objstore import Bucket

log = logging.getLogger(__name__)

CLOCK_SKEW_MS = 60_000
"""How far before the shard's last commit (the metastore's time) a lost batch's read time (a driver's clock, the
time in its block ids) is looked for: drivers' clocks may lag the metastore's by this much."""

Spans = Mapping[tuple[str, int, str], list[tuple[int, int]]]
"""Offsets committed while armed: per (topic, partition, incarnation), the ``[start, end)`` ranges."""


def batch_block(meta: BlockMeta, group: str, generation: int) -> bool:
    """Whether ``meta`` is a batch's block of the group and generation (level 0, no parents: not a compaction's,
    an erasure's or a repair's output) whose every range names its incarnation."""
    return (meta.level == 0 and meta.group == group and meta.generation == generation
            and not meta.compaction.parents and bool(meta.kafka) and all(r.incarnation for r in meta.kafka))


def superseded(meta: BlockMeta, group: str, generation: int, spans: Spans, own: set[str]) -> bool:
    """Whether ``meta``, a block in the bucket, is a batch's block (``batch_block``) that none of the recorded
    commits holds (not in ``own``) although one of its ranges overlaps offsets they committed, in the same
    incarnation. Pure. Such a block is never committed (module docstring); whether it may still be is
    ``unclaimed``'s question."""
    if meta.id in own or not batch_block(meta, group, generation):
        return False
    return any(start < r.end and r.start < end
               for r in meta.kafka for start, end in spans.get((r.topic, r.partition, r.incarnation), ()))


KEEP_COMMITS = 100
"""A kept block that this many applied commits did not settle is left to the leader's bucket scan."""


class OrphanSweep:
    """One driver's sweep of its lost batches' blocks (module docstring). Not thread-safe: the batch loop calls it."""

    def __init__(self, bucket: Bucket, group: str, generation: int, clock: Callable[[], float] = time.time) -> None:
        self.bucket = bucket
        self.group, self.generation = group, generation
        self.clock = clock
        self.fetcher = BlockFetcher(bucket, 0.0, clock)  # every complete block is judged: none is "too fresh"
        self.since_ms: int | None = None
        """A LIST is due after the next applied commit, for blocks made at this time (ms) or later."""
        self.spans: dict[tuple[str, int, str], list[tuple[int, int]]] = defaultdict(list)
        self.own: set[str] = set()
        """The recorded commits' blocks (until the LIST: blocks written after it are never among those listed)."""
        self.kept: dict[str, BlockMeta] = {}
        """Listed blocks that a commit may still claim (offsets not committed yet: a partition paused, its offsets
        lost and the block their only copy, or another shard's): judged again after each applied commit."""
        self.commits = 0
        """Applied commits since the LIST (``KEEP_COMMITS``)."""

    @property
    def armed(self) -> bool:
        return self.since_ms is not None or bool(self.kept)

    def arm(self, since_ms: int) -> None:
        """Look for lost batches' blocks made at ``since_ms`` or later after the next applied commit."""
        since_ms = max(0, since_ms)
        self.since_ms = since_ms if self.since_ms is None else min(self.since_ms, since_ms)

    def record(self, command: CommitIngestBatch) -> None:
        """A commit this process sent (applied, replayed or dead-lettered)."""
        if not self.armed:
            return
        for r in command.ranges:
            if not r.incarnation or r.end <= r.start:
                continue
            spans = self.spans[(r.topic, r.partition, r.incarnation)]
            if spans and spans[-1][1] == r.start:
                spans[-1] = (spans[-1][0], r.end)  # the next commit of the partition: one span
            else:
                spans.append((r.start, r.end))
        ids = {b.id for b in command.blocks}
        if self.since_ms is not None:
            self.own |= ids
        for block_id in ids & set(self.kept):  # committed after all (the same deterministic id): not lost
            del self.kept[block_id]

    def sweep(self, committed: Mapping[tuple[str, int], tuple[int, str]]) -> list[str]:
        """After an applied commit (``committed``: this process's committed end and incarnation per partition):
        mark the lost batches' blocks; the ids marked. A failure is logged and changes nothing (the next applied
        commit tries again; the leader's bucket scan marks them meanwhile)."""
        if not self.armed or not self.spans:
            return []
        started = time.perf_counter()
        claims = Claims(committed={(self.group, self.generation, t, p): v for (t, p), v in committed.items()},
                        ended={}, jobs=frozenset())
        marked: list[str] = []
        try:
            found = dict(self.kept)
            if self.since_ms is not None:
                for tenant in self.fetcher.tenants(self.group):
                    result = self.fetcher.sync(tenant, group=self.group, since_ms=self.since_ms)
                    found.update((v.id, v.meta) for v in result.in_state(BlockState.HEALTHY) if v.meta is not None
                                 and v.id not in self.own and batch_block(v.meta, self.group, self.generation))
            kept: dict[str, BlockMeta] = {}
            for meta in found.values():
                why = unclaimed(meta, claims)
                if why is None:
                    kept[meta.id] = meta  # a commit may still take it: judged again after the next commit
                elif superseded(meta, self.group, self.generation, self.spans, self.own):
                    why += " (a lost batch's block: this shard committed its offsets again)"
                    write_deletion_mark(self.bucket, meta.tenant, meta.id, self.clock(), why)
                    marked.append(meta.id)
                    log.warning("marked a lost batch's block for deletion", extra={
                        "group": self.group, "tenant": meta.tenant, "block": meta.id, "reason": why})
        except Exception as exc:  # the commit stands; the leader's scan is the fallback
            log.warning("could not look for lost batches' blocks; the next commit tries again", extra={
                "group": self.group, "error": f"{type(exc).__name__}: {str(exc)[:500]}"})
            return marked
        metrics.ORPHANS.labels(self.group).inc(len(marked))
        if self.since_ms is not None:
            log.info("looked for lost batches' blocks", extra={
                "group": self.group, "since_ms": self.since_ms, "marked": len(marked), "kept": len(kept),
                "seconds": round(time.perf_counter() - started, 3)})
            self.commits = 0
        self.commits += 1
        self.since_ms, self.own = None, set()
        self.kept = kept if self.commits < KEEP_COMMITS else {}
        if not self.kept:
            self.spans = defaultdict(list)
        return marked
