"""Partitions paused because the Schema Registry did not answer: what a batch commits, and when they are tried again.

An ingest task that cannot get a writer schema it has not cached (``RegistryUnavailableError``) returns the chunks
it wrote before that one and a ``Paused`` record (``shale.ingest.task``). The batch then commits, for that
partition, exactly the offsets those chunks tile, ``[planned start, paused at)``, or nothing when it paused at its
first chunk; every other partition commits its planned range as usual (``commit_ranges``). The metastore's rule is
unchanged: every committed range starts at its partition's committed end, and a batch may hold any subset of the
group's partitions (a partition with lost offsets is left out the same way). So the paused offsets stay
uncommitted and are planned again, from the same committed end, by a later batch: nothing skipped, nothing
written twice (the paused chunk wrote no block).

``RegistryBackoff`` keeps a paused partition out of the plans for a while, doubling from the trigger interval up
to a minute, as a failed batch waits, so a registry that is down or slow is asked again and again only at that
pace, while the other partitions go on at theirs. Pure: the caller passes the clock's reading.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from shale.ingest.committer import IngestConflictError
from shale.ingest.plan import PartitionRange, TopicPartition
from shale.ingest.task import Paused

MAX_DELAY = 60.0


def backoff(base: float, failures: int) -> float:
    """The delay after ``failures`` in a row: ``base`` doubled per failure, up to ``MAX_DELAY`` (a failed batch's
    and a registry pause's)."""
    return min(MAX_DELAY, base * 2.0 ** min(failures, 6))


def commit_ranges(ranges: Sequence[PartitionRange], paused: Iterable[Paused]) -> list[PartitionRange]:
    """The ranges a batch commits: each planned range, cut where its partition paused (left out when it paused at
    its start). A pause outside its partition's planned range, or of a partition the batch did not plan, is a bug:
    ``IngestConflictError``, and the batch is not committed."""
    at: dict[TopicPartition, int] = {}
    for p in paused:
        planned = next((r for r in ranges if (r.topic, r.partition) == (p.topic, p.partition)), None)
        if planned is None or not planned.start <= p.at <= planned.end or (p.topic, p.partition) in at:
            raise IngestConflictError(f"{p.topic}[{p.partition}]: a task paused at offset {p.at}, outside the "
                                      "batch's planned range (or twice); the batch is not committed")
        at[(p.topic, p.partition)] = p.at
    out = []
    for r in ranges:
        end = at.get((r.topic, r.partition), r.end)
        if end > r.start or (r.topic, r.partition) not in at:
            out.append(replace(r, end=end))
    return out


@dataclass
class Held:
    failures: int
    retry_at: float
    registry: str
    error: str


@dataclass
class RegistryBackoff:
    """The partitions paused on the registry, each with its consecutive pauses and when to try it again."""

    base: float
    """The first delay (``ingest.trigger_interval``, at least a second); it doubles with each pause in a row, up to
    ``MAX_DELAY``."""
    held: dict[TopicPartition, Held] = field(default_factory=dict)

    def waiting(self, now: float) -> set[TopicPartition]:
        """The paused partitions a plan made at ``now`` leaves out (their delay has not passed)."""
        return {tp for tp, h in self.held.items() if h.retry_at > now}

    def record(self, paused: Sequence[Paused], planned: Iterable[TopicPartition], now: float) -> list[TopicPartition]:
        """After a batch: ``paused`` are held again with a longer delay; the other ``planned`` partitions answered,
        so they are held no more. Returns the partitions that resumed (were held before, and are not now)."""
        now_paused = {(p.topic, p.partition): p for p in paused}
        resumed = [tp for tp in planned if tp in self.held and tp not in now_paused]
        for tp in resumed:
            del self.held[tp]
        for tp, p in now_paused.items():
            failures = self.held[tp].failures + 1 if tp in self.held else 1
            delay = backoff(self.base, failures)
            self.held[tp] = Held(failures, now + delay, p.registry, p.error)
        return sorted(resumed)

    def delay(self, tp: TopicPartition) -> float:
        held = self.held.get(tp)
        return backoff(self.base, held.failures) if held else 0.0

    def forget(self, keep: Iterable[TopicPartition]) -> None:
        """Drop partitions no longer planned at all (a topic deleted, a shard that moved)."""
        kept = set(keep)
        self.held = {tp: h for tp, h in self.held.items() if tp in kept}
