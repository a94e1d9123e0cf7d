"""The dead letter queue (seed 004): commands that could not reach the metastore, kept in the bucket.

A writer that cannot commit puts the command's bytes at ``_shale/dlq/<stream>/<ms>-<seq>-<writer>.json`` with
put-if-absent and only then treats it as durable. Keys sort by the writer's (monotonic) clock, so replaying a
stream in key order replays its commands in the order they were written, which keeps a stream of ingest
commits contiguous. The leader replays every stream every 15 seconds; commands are idempotent, so a command
replayed twice (by the leader and by its writer) is harmless.

A command the state machine rejects on replay is moved to ``_shale/dlq-rejected/`` with the rejection, logged
and counted: it will never apply, and an operator must look at it. Rejected commits are cleaned by the leader
(``clean_rejected``): one is removed once it is older than ``REJECTED_KEEP_SECONDS`` and every offset it holds is
committed by its group and generation (stored by other blocks, its own blocks are orphans); one that holds offsets
not committed, or acknowledged as lost, is kept, since its blocks may be their only copy. Anything else there (not
a commit) is removed after the same keep period. ``holding`` names the queued and rejected commits that hold
offsets of a partition's range: ``shale offsets acknowledge-loss`` refuses to discard them.

Only the kinds a writer may legitimately leave there are replayed (``REPLAYABLE``): an ingest (or reprocess)
committer's ``CommitIngestBatch``. Whoever can write to the bucket can write here, so any other kind (a block
replacement, a generation retire, a truncation: admin commands) is moved aside unreplayed, as ``not-replayable``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import Counter, Gauge

from shale.block import DLQ_PREFIX, check_tenant
from shale.errors import CommandRejectedError, MetastoreUnavailableError, NotFoundError, RetryableError
from shale.metastore.rules import Command, CommitIngestBatch, Result, decode, encode
from shale.objstore import Bucket, OrderedNames

log = logging.getLogger(__name__)
REJECTED_PREFIX = "_shale/dlq-rejected/"
DLQ_DEPTH = Gauge("shale_metastore_dlq_depth", "Commands waiting in the dead letter queue (at the last scan).")
REPLAYABLE = frozenset({"CommitIngestBatch"})
"""The command kinds the leader replays: those a writer puts in the queue (``ingest.committer``). Compaction
workers never write here (an unanswered poll is sent again by the worker itself)."""
DLQ_EVENTS = Counter("shale_metastore_dlq_events_total",
                     "Dead letter queue events: enqueued, replayed, rejected, cleaned.", ["event"])


REJECTED_KEEP_SECONDS = 7 * 86_400
"""How long a rejected command stays in ``_shale/dlq-rejected/`` at least, for an operator to look at."""


@dataclass(frozen=True)
class Committed:
    """What the cleaning rule needs of one partition's committed offsets (``OffsetRow`` and ``LossRow`` fit)."""

    end: int
    incarnation: str
    lost: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Queued:
    """A commit in the queue or set aside: its key and command (None: not a decodable commit)."""

    key: str
    command: CommitIngestBatch | None
    modified: float


@dataclass
class ReplayReport:
    replayed: list[str] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)
    """Each rejected key's reason code (``stale-lease``: its writer was fenced off)."""


class DeadLetterQueue:
    def __init__(self, bucket: Bucket, clock: Callable[[], float] = time.time) -> None:
        self.bucket = bucket
        self._names = OrderedNames(clock)

    def enqueue(self, stream: str, command: Command) -> str:
        """Write a command durably; return its key. ``stream`` is the writer's name (e.g. the ingest group)."""
        if command.kind not in REPLAYABLE:
            raise ValueError(f"{command.kind} is never replayed from the dead letter queue")
        check_tenant(stream)  # the same strict syntax as tenants: it becomes a key segment
        key = f"{DLQ_PREFIX}{stream}/{self._names.next()[0]}.json"
        self.bucket.put_if_absent(key, encode(command))
        DLQ_EVENTS.labels("enqueued").inc()
        log.warning("metastore unreachable: command written to the dead letter queue",
                    extra={"key": key, "command": command.kind})
        return key

    def pending(self, stream: str | None = None) -> list[str]:
        prefix = DLQ_PREFIX + (f"{stream}/" if stream else "")
        keys = [i.key for i in self.bucket.list(prefix) if i.key.endswith(".json")]
        if stream is None:
            DLQ_DEPTH.set(len(keys))
        return keys

    def replay(self, submit: Callable[[bytes], Result], stream: str | None = None) -> ReplayReport:
        """Replay pending commands in key order. Stops a stream at its first command the metastore cannot take
        right now (so later commands of that stream never jump ahead of it)."""
        report = ReplayReport()
        blocked: set[str] = set()
        for key in self.pending(stream):
            name = key[len(DLQ_PREFIX):].split("/", 1)[0]
            if name in blocked:
                report.pending.append(key)
                continue
            try:
                data = self.bucket.get(key)
            except NotFoundError:
                continue  # replayed and deleted by someone else meanwhile
            refused = _unreplayable(data)
            if refused is not None:
                self._set_aside(key, data, refused, report)
                continue
            try:
                result = submit(data)
            except (MetastoreUnavailableError, RetryableError):
                blocked.add(name)
                report.pending.append(key)
                continue
            if result.ok:
                self.bucket.delete(key)
                report.replayed.append(key)
                DLQ_EVENTS.labels("replayed").inc()
                continue
            self._set_aside(key, data, result, report)
        return report

    def queued(self, prefix: str) -> list[Queued]:
        """Every command under ``prefix`` (``DLQ_PREFIX`` or ``REJECTED_PREFIX``), decoded when it is a commit."""
        found = []
        for item in self.bucket.list(prefix):
            try:
                data = self.bucket.get(item.key)
            except NotFoundError:
                continue
            found.append(Queued(item.key, _commit_of(data, item.key.startswith(REJECTED_PREFIX)),
                                item.last_modified))
        return found

    def holding(self, group: str, generation: int, topic: str, partition: int, start: int, end: int) -> list[str]:
        """The queued and rejected commits of ``group`` and ``generation`` that hold offsets of ``topic[partition]``
        in ``[start, end)``: their blocks are a copy of those offsets (for offsets Kafka deleted, the only one)."""
        return [q.key for prefix in (DLQ_PREFIX, REJECTED_PREFIX) for q in self.queued(prefix)
                if q.command is not None and (q.command.group, q.command.generation) == (group, generation)
                and any((r.topic, r.partition) == (topic, partition) and r.start < end and start < r.end
                        and r.end > r.start for r in q.command.ranges)]

    def clean_rejected(self, committed: Callable[[str, int, str, int], Committed | None], now: float) -> list[str]:
        """Remove the rejected commands the cleaning rule allows (module docstring); return their keys.
        ``committed(group, generation, topic, partition)`` is the metastore's view of a partition."""
        removed = []
        for q in self.queued(REJECTED_PREFIX):
            if q.modified + REJECTED_KEEP_SECONDS > now:
                continue
            if q.command is not None and not _all_stored(q.command, committed):
                continue
            self.bucket.delete(q.key)
            removed.append(q.key)
            DLQ_EVENTS.labels("cleaned").inc()
        if removed:
            log.info("rejected dead letter commands removed: their offsets are committed by other blocks",
                     extra={"count": len(removed)})
        return removed

    def _set_aside(self, key: str, data: bytes, result: Result, report: ReplayReport) -> None:
        self.bucket.put(REJECTED_PREFIX + key[len(DLQ_PREFIX):], data + b"\n" + result.model_dump_json().encode())
        self.bucket.delete(key)
        report.rejected.append(key)
        report.reasons[key] = result.reason
        DLQ_EVENTS.labels("rejected").inc()
        log.error("dead letter queue command rejected on replay; moved aside for an operator",
                  extra={"key": key, "reason": result.reason, "detail": result.message})


def _commit_of(data: bytes, rejected: bool) -> CommitIngestBatch | None:
    """The commit in a queued object (a rejected one ends with its result on a line of its own), or None."""
    if rejected:
        data = data.rpartition(b"\n")[0]
    try:
        command = decode(data)
    except CommandRejectedError:
        return None
    return command if isinstance(command, CommitIngestBatch) else None


def _all_stored(command: CommitIngestBatch,
                committed: Callable[[str, int, str, int], Committed | None]) -> bool:
    """Every offset of ``command`` is committed in its incarnation by its group and generation, none as a loss."""
    for r in command.ranges:
        if r.end <= r.start:
            continue
        now = committed(command.group, command.generation, r.topic, r.partition)
        if now is None or (r.incarnation and now.incarnation and r.incarnation != now.incarnation):
            return False  # not committed, or of an incarnation that ended: kept for an operator
        if now.end < r.end or any(a < r.end and r.start < b for a, b in now.lost):
            return False
    return True


def _unreplayable(data: bytes) -> Result | None:
    """Why ``data`` must not be replayed (not a command, or a kind no writer leaves here), or None."""
    try:
        kind = decode(data).kind
    except CommandRejectedError as exc:
        return Result(ok=False, reason=exc.reason, message=str(exc))
    if kind in REPLAYABLE:
        return None
    return Result(ok=False, reason="not-replayable", message=f"{kind} is not replayed from the dead letter queue "
                  f"(only {', '.join(sorted(REPLAYABLE))}): bucket writers cannot propose admin commands")
