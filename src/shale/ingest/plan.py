"""Planning one ingest batch: the exact Kafka offsets ``[start, end)`` each partition reads. Pure: no I/O.

The metastore's committed offsets are the authority. A partition continues at its committed end, in the same
topic incarnation (Kafka topic id). A topic deleted and recreated is a new incarnation and starts at its earliest
offset, whatever the old incarnation had committed. A partition never committed starts where
``ingest.starting_offsets`` says.

What the plan refuses to read:

* offsets Kafka deleted before they were read (the committed end is below the partition's earliest offset):
  reported as a ``Loss`` with the exact range; the partition waits for an operator's
  ``shale offsets acknowledge-loss`` while the others go on;
* a committed end beyond Kafka's end in the same incarnation (the log was truncated, e.g. by an unclean leader
  election): reported as ``Ahead``; reading on would silently skip the records Kafka writes at those offsets;
* a partition ``held`` by the caller (paused on a Schema Registry that did not answer, ``shale.ingest.pauses``):
  its lag is known, it reads nothing until its delay has passed.

Each planned range ends at most at Kafka's end for a read_committed consumer (the last stable offset), so a batch
never waits for open transactions. Sizes: ``max_records`` offsets per batch in all, shared by lag (as Spark's
``maxOffsetsPerTrigger``), and about ``max_bytes`` per batch, estimated from the record sizes seen so far per
partition; a partition whose record size is not known yet reads ``PROBE_RECORDS`` offsets first.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

PROBE_RECORDS = 1_000

TopicPartition = tuple[str, int]


@dataclass(frozen=True)
class PartitionRange:
    topic: str
    partition: int
    incarnation: str
    start: int
    end: int


@dataclass(frozen=True)
class Loss:
    """Offsets ``[start, earliest)`` were deleted by Kafka before they were read."""

    topic: str
    partition: int
    incarnation: str
    start: int
    earliest: int


@dataclass(frozen=True)
class Ahead:
    """The committed end is beyond Kafka's end offset in the same incarnation."""

    topic: str
    partition: int
    incarnation: str
    committed_end: int
    kafka_end: int


@dataclass(frozen=True)
class Limits:
    max_records: int
    max_bytes: int
    record_bytes: Mapping[TopicPartition, float] = field(default_factory=dict)
    """Average bytes per offset seen so far, per partition."""


@dataclass
class BatchPlan:
    read_time_ms: int
    ranges: list[PartitionRange] = field(default_factory=list)
    losses: list[Loss] = field(default_factory=list)
    ahead: list[Ahead] = field(default_factory=list)
    lag: dict[TopicPartition, int] = field(default_factory=dict)
    """Offsets between each partition's start and Kafka's end (what is left after this plan: lag - planned)."""
    held: list[TopicPartition] = field(default_factory=list)
    """Partitions with records to read that this plan leaves out because the caller holds them."""
    quiet: list[PartitionRange] = field(default_factory=list)
    """Partitions of a topic's current incarnation never committed and with nothing to read now, as empty ranges
    ``[start, start)``: a batch commits them with its ranges, so the metastore knows every partition of the topic,
    those that never held a record too (restore counts a source's partitions from what ingestion committed)."""

    @property
    def offsets(self) -> int:
        return sum(r.end - r.start for r in self.ranges)

    def range_of(self, topic: str, partition: int) -> PartitionRange | None:
        return next((r for r in self.ranges if (r.topic, r.partition) == (topic, partition)), None)


def _share(total: int, weight: float, weights: float) -> int:
    return max(1, int(total * weight / weights)) if weights > 0 else total


def recreated(ranges: list[PartitionRange], current: Mapping[str, str]) -> list[str]:
    """Topics of ``ranges`` whose incarnation (``current``: topic -> Kafka topic id now) is no longer the one the
    batch was planned for: the topic was deleted and recreated while the batch read it by name, so the records
    read may be the new topic's and must not be committed under the old incarnation. A topic that is gone is not
    among them: the read succeeded, so it read the only incarnation there was."""
    return sorted({r.topic for r in ranges
                   if r.incarnation and current.get(r.topic, r.incarnation) != r.incarnation})


def plan_batch(incarnations: Mapping[str, str], bounds: Mapping[TopicPartition, tuple[int, int]],
               committed: Mapping[TopicPartition, tuple[int, str]], starts: Mapping[TopicPartition, int],
               limits: Limits, read_time_ms: int, targets: Mapping[TopicPartition, int] | None = None,
               held: AbstractSet[TopicPartition] = frozenset()) -> BatchPlan:
    """Plan the next batch.

    ``incarnations``: each current topic's id; ``bounds``: (earliest, end) per partition; ``committed``: the
    metastore's (committed end, incarnation) per partition; ``starts``: where partitions without a committed end in
    the current incarnation start (the caller resolves ``starting_offsets``, pinning "latest" once); ``targets``:
    with --available-now, the end offsets to stop at; ``held``: partitions to leave out of this batch.
    """
    plan = BatchPlan(read_time_ms)
    wanted: dict[TopicPartition, tuple[str, int, int]] = {}
    for (topic, partition), (earliest, end) in sorted(bounds.items()):
        incarnation = incarnations.get(topic)
        if incarnation is None:
            continue
        tp = (topic, partition)
        done = committed.get(tp)
        if done is not None and (not done[1] or done[1] == incarnation):
            start = done[0]
            if start < earliest:
                plan.losses.append(Loss(topic, partition, incarnation, start, earliest))
                continue
            if start > end:
                plan.ahead.append(Ahead(topic, partition, incarnation, start, end))
                continue
        else:
            start = max(earliest, min(end, starts.get(tp, earliest)))
            if start == end:
                plan.quiet.append(PartitionRange(topic, partition, incarnation, start, start))
        stop = min(end, targets[tp]) if targets is not None and tp in targets else end
        plan.lag[tp] = max(0, end - start)
        if stop > start and tp in held:
            plan.held.append(tp)
        elif stop > start:
            wanted[tp] = (incarnation, start, stop)
    available = {tp: stop - start for tp, (_, start, stop) in wanted.items()}
    total = sum(available.values())
    known = {tp: limits.record_bytes[tp] for tp in wanted if limits.record_bytes.get(tp)}
    estimated = sum(available[tp] * size for tp, size in known.items())
    for tp, (incarnation, start, _) in wanted.items():
        count = available[tp]
        if total > limits.max_records:
            count = min(count, _share(limits.max_records, available[tp], total))
        if tp not in known:
            count = min(count, PROBE_RECORDS)
        elif estimated > limits.max_bytes:
            share = limits.max_bytes * available[tp] * known[tp] / estimated
            count = min(count, max(1, int(share / known[tp])))
        plan.ranges.append(PartitionRange(tp[0], tp[1], incarnation, start, start + count))
    return plan
