"""The driver's half of the commit protocol: one ``CommitIngestBatch`` per batch, or the dead letter
queue when the metastore cannot be reached, and the offsets this group has committed (Secor's
``last_committed_offset``).

Order matters for a stream of commits: once one commit went to the DLQ, later ones follow it there until the
queue is drained (by this process before its next commit, or by the metastore leader), so commits always
apply in batch order and stay contiguous.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Literal, Protocol

from prometheus_client import Histogram

from shale.encoder import Written
from shale.errors import MetastoreUnavailableError, ShaleError
from shale.ingest.plan import PartitionRange
from shale.metastore import (
    LEASE_REASONS,
    Commands,
    CommitIngestBatch,
    DeadLetterQueue,
    OffsetRange,
    OffsetReads,
    Result,
    decode,
)

log = logging.getLogger(__name__)
COMMIT_SECONDS = Histogram("shale_ingest_commit_seconds", "Time to make a batch's commit durable.",
                           ["group"])


class IngestConflictError(ShaleError):
    """The metastore refused a batch (offset gap or overlap): this process must not write more."""


class LeaseLostError(IngestConflictError):
    """This process no longer holds its shard's ingest lease (another took it over, it expired, or the group's
    shard map changed: ``reason`` "resharded"): it stops writing that shard."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


def batch_commit(written: Sequence[Written], ranges: Sequence[PartitionRange], *, group: str, generation: int,
                 writer: Literal["ingest", "reprocess"], batch: str, lease: int | None = None,
                 shard: int = 0, quiet: Sequence[PartitionRange] = ()) -> CommitIngestBatch:
    """The one command that commits a batch: every planned range, exactly, with every block its chunks wrote.
    The chunks of each partition must tile its planned range (a retried task rewrites the same chunks). ``lease``
    is the writer's ingest lease token on ``shard`` (None only for writers that never lease: reprocess jobs).
    ``quiet``: empty ranges of partitions never committed (``BatchPlan.quiet``), committed as they are."""
    by_partition: dict[tuple[str, int], list[Written]] = defaultdict(list)
    for w in written:
        by_partition[(w.topic, w.partition)].append(w)
    offsets, blocks = [], []
    for r in ranges:
        chunks = sorted(by_partition.pop((r.topic, r.partition), []), key=lambda w: w.start)
        edges = [(c.start, c.end, c.incarnation) for c in chunks]
        tiled = bool(chunks) and chunks[0].start == r.start and chunks[-1].end == r.end and all(
            a.end == b.start for a, b in itertools.pairwise(chunks)) and all(
            c.incarnation == r.incarnation for c in chunks)
        if not tiled:
            raise IngestConflictError(f"{r.topic}[{r.partition}]: the written chunks {edges} do not cover the planned "
                                      f"range [{r.start},{r.end}) exactly; the batch is not committed")
        offsets.append(OffsetRange(topic=r.topic, partition=r.partition, start=r.start, end=r.end,
                                   incarnation=r.incarnation, stored=sum(c.records for c in chunks),
                                   bytes=sum(c.bytes for c in chunks)))
        blocks += [b for c in chunks for b in c.blocks]
    planned = {(r.topic, r.partition) for r in ranges}
    offsets += [OffsetRange(topic=q.topic, partition=q.partition, start=q.start, end=q.start,
                            incarnation=q.incarnation, stored=0, bytes=0)
                for q in quiet if (q.topic, q.partition) not in planned]
    blocks = list({b.id: b for b in blocks}.values())  # a chunk's block of several partitions is named by each
    if by_partition:
        raise IngestConflictError(f"tasks wrote partitions the batch did not plan: {sorted(by_partition)}")
    return CommitIngestBatch(group=group, generation=generation, writer=writer, batch=batch, ranges=offsets,
                             blocks=blocks, lease=lease, shard=shard)


def stream_name(group: str, generation: int, shard: int) -> str:
    """The dead letter stream of a shard's commits (shard 0 keeps the name of before shards): whoever holds the
    shard drains it before reading the committed offsets, so a previous holder's commits apply (or are refused)
    before the new holder plans."""
    return f"ingest-{group}-g{generation}" + (f"-s{shard}" if shard else "")


class CommitTarget(Commands, OffsetReads, Protocol):
    """What committing needs from the metastore (the embedded service and the HTTP client both fit)."""


class Committer:
    def __init__(self, metastore: CommitTarget, dlq: DeadLetterQueue | None, group: str, generation: int) -> None:
        self.metastore = metastore
        self.dlq = dlq
        self.group = group
        self.generation = generation
        self.stream = stream_name(group, generation, 0)
        self.committed: dict[tuple[str, int], tuple[int, str]] = {}
        """(committed end, incarnation) per topic-partition: the metastore's, plus this process's later commits."""
        self.updated: dict[tuple[str, int], int] = {}
        """When (the metastore's ms) each topic-partition's offsets were last committed, as ``load`` read them."""
        self.dlq_pending = False
        self.links: dict[str, list[object]] = {}
        """The last commit's link per tenant (``shale.bucketindex.DeltaLink``); empty if it was not applied now."""
        self.switches: dict[str, list[list[int | str]]] = {}
        """The generation switches the last commit made, per tenant (``[topic, start, end, generation]`` each)."""

    def load(self, deadline: float = 300.0) -> dict[tuple[str, int], tuple[int, str]]:
        """Drain this group's DLQ into the metastore, then read its committed offsets. Waits for the metastore
        (it is the authority on offsets: ingestion cannot start without it)."""
        stop = time.monotonic() + deadline
        while True:
            try:
                if self.dlq is not None and self.dlq.pending(self.stream):
                    report = self.dlq.replay(self._submit_bytes, self.stream)
                    if report.pending:
                        raise MetastoreUnavailableError("dead letter queue not drained yet")
                rows = self.metastore.offsets(self.group, self.generation)
                break
            except MetastoreUnavailableError as exc:
                if time.monotonic() > stop:
                    raise MetastoreUnavailableError(
                        f"ingest {self.group}: the metastore stayed unreachable for {deadline:.0f}s at start; it is "
                        f"needed to learn the committed offsets ({exc})") from exc
                log.warning("waiting for the metastore before starting ingestion", extra={"group": self.group})
                time.sleep(2)
        self.committed = {(r.topic, r.partition): (r.committed_end, r.incarnation) for r in rows}
        self.updated = {(r.topic, r.partition): r.updated_at for r in rows}
        self.dlq_pending = False
        return dict(self.committed)

    def _drain(self) -> bool:
        if self.dlq is None:
            return True
        report = self.dlq.replay(self._submit_bytes, self.stream)
        reasons = {report.reasons.get(key, "") for key in report.rejected}
        if report.rejected and reasons <= set(LEASE_REASONS):
            # Fenced while the metastore was out of reach: another driver took the shard (or the shard map
            # changed) and reads these offsets again. A lost lease, not a conflict for an operator.
            raise LeaseLostError(f"ingest {self.group}: its dead-lettered commits were fenced off on replay "
                                 f"({', '.join(sorted(reasons))}); this process stops writing",
                                 reason="resharded" if reasons == {"resharded"} else "")
        if report.rejected:
            raise IngestConflictError(f"ingest {self.group}: dead letter queue commands were rejected on replay "
                                      f"({report.rejected}); see _shale/dlq-rejected/ and restart ingestion")
        return not report.pending

    def _submit_bytes(self, data: bytes) -> Result:
        return self.metastore.submit(decode(data))

    def commit(self, command: CommitIngestBatch) -> str:
        """Make the batch's commit durable: "committed", "replayed" or "dead-lettered". Raises
        ``IngestConflictError`` when the metastore rejects it."""
        start = time.perf_counter()
        try:
            outcome = self._commit(command)
        finally:
            COMMIT_SECONDS.labels(self.group).observe(time.perf_counter() - start)
        for r in command.ranges:
            known = self.committed.get((r.topic, r.partition))
            self.committed[(r.topic, r.partition)] = (r.end, r.incarnation or (known[1] if known else ""))
        return outcome

    def _commit(self, command: CommitIngestBatch) -> str:
        self.links, self.switches = {}, {}
        if self.dlq_pending:
            self.dlq_pending = not self._drain()
        if not self.dlq_pending:
            try:
                result = self.metastore.submit(command)
            except MetastoreUnavailableError:
                if self.dlq is None:
                    raise
            else:
                if not result.ok and result.reason in LEASE_REASONS:
                    raise LeaseLostError(f"ingest {self.group} generation {self.generation}: batch {command.batch} "
                                         f"is fenced off, this process stops writing: {result.message}",
                                         reason=result.reason)
                if not result.ok:
                    raise IngestConflictError(
                        f"ingest {self.group} generation {self.generation}: the metastore rejected batch "
                        f"{command.batch}: {result.message}")
                self.links = result.data.get("links") or {}
                self.switches = result.data.get("switches") or {}
                if self.switches:  # DESIGN 10.5: this commit found the generation caught up
                    log.info("this generation serves readers now: it has caught up", extra={
                        "group": self.group, "generation": self.generation, "switches": self.switches})
                return "replayed" if result.data.get("replay") else "committed"
        assert self.dlq is not None
        self.dlq.enqueue(self.stream, command)
        self.dlq_pending = True
        return "dead-lettered"

