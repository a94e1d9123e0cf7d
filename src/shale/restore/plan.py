"""The restore plan: from the backup group's blocks (found through the index, never a bucket LIST) to what each
source partition will send. Pure: it takes block metadata and the acknowledged losses and returns data, so every
rule here is a unit test.

Per source partition of the chosen topic incarnation, the backup blocks' ``KafkaRange`` intervals are put in offset
order. The range is ``[start, end)`` in source offsets: by default from the first backed-up offset to the last, or
the offsets the user names per partition. ``--until`` (a time) cuts each partition's range at its first record
stamped at or after the time; which record that is shows only when the blocks are read, so the plan drops the blocks
that start at or after it (a block's ``min_time`` is a lower bound of its records' timestamps) and the task stops at
the record. Offsets no block holds are a gap: the partition is restored up to the gap's first offset and stops
there with an error naming the gap (and the operator's reason when the loss was acknowledged), unless its
``--until`` stop point comes first (then the gap is irrelevant); nothing past a gap is sent, so nothing is skipped
silently.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shale.block import BlockMeta
from shale.errors import ConfigError, NotFoundError
from shale.index import IncarnationRow, LossRow, OffsetRow
from shale.restore.partitioner import PartitionMapping

if TYPE_CHECKING:
    from shale.kafka import TopicState


@dataclass(frozen=True)
class RestoreRange:
    """What to restore: everything backed up (the default), records before ``until_ms``, or per-partition source
    offsets ``[start, end)`` (a partition not named is not restored)."""

    until_ms: int | None = None
    offsets: Mapping[int, tuple[int, int]] | None = None


@dataclass(frozen=True)
class Gap:
    start: int
    end: int
    reason: str


@dataclass(frozen=True)
class Interval:
    """Source offsets ``[start, end)`` of one partition held by one backup block."""

    start: int
    end: int
    block: BlockMeta


@dataclass
class PartitionPlan:
    partition: int
    start: int
    end: int
    """Source offsets ``[start, end)`` to restore; ``end`` is the first gap's start when there is a gap."""
    intervals: list[Interval] = field(default_factory=list)
    gaps: list[Gap] = field(default_factory=list)
    records: int = 0
    """Records in the range, from the blocks' row counts (a block holding several partitions or a range cut by
    ``start``/``end`` is counted pro rata by offsets; ``--until`` is not counted in: an upper bound)."""
    bytes: int = 0

    @property
    def blocks(self) -> list[str]:
        return list(dict.fromkeys(i.block.id for i in self.intervals))


@dataclass
class RestorePlan:
    tenant: str
    topic: str
    incarnation: str
    incarnations: list[str]
    mapping: PartitionMapping
    until_ms: int | None
    partitions: list[PartitionPlan]
    counted_from: str = "metastore"
    """Where the source's partition count comes from: ``kafka`` (the source topic itself, same incarnation),
    ``operator`` (``--source-partitions``) or ``metastore`` (the partitions ingestion committed: every one since
    ingestion commits a partition that never held a record as an empty range, ``BatchPlan.quiet``)."""

    @property
    def oldest_ms(self) -> int:
        """The smallest record time of the blocks to restore (a lower bound)."""
        return min((i.block.min_time for p in self.partitions for i in p.intervals), default=0)

    @property
    def gaps(self) -> list[tuple[int, Gap]]:
        return [(p.partition, g) for p in self.partitions for g in p.gaps]

    def summary(self) -> dict[str, object]:
        return {
            "tenant": self.tenant, "topic": self.topic, "incarnation": self.incarnation,
            "incarnations": self.incarnations, "mapping": self.mapping.describe(), "until_ms": self.until_ms,
            "source_partitions": self.mapping.source_partitions, "source_partitions_from": self.counted_from,
            "records": sum(p.records for p in self.partitions), "bytes": sum(p.bytes for p in self.partitions),
            "blocks": len({b for p in self.partitions for b in p.blocks}),
            "partitions": [{"partition": p.partition, "start": p.start, "end": p.end, "records": p.records,
                            "bytes": p.bytes, "blocks": len(p.blocks),
                            "gaps": [{"start": g.start, "end": g.end, "reason": g.reason} for g in p.gaps]}
                           for p in self.partitions],
        }


def incarnations_of(blocks: Sequence[BlockMeta], topic: str) -> list[str]:
    """The topic's incarnations in the blocks, oldest first (by their first block's time)."""
    first: dict[str, int] = {}
    for meta in blocks:
        for r in meta.kafka:
            if r.topic == topic and r.end > r.start:
                first[r.incarnation] = min(first.get(r.incarnation, meta.min_time), meta.min_time)
    return sorted(first, key=lambda i: (first[i], i))


def choose_incarnation(blocks: Sequence[BlockMeta], topic: str, named: str | None = None,
                       at_ms: int | None = None) -> str:
    """The named incarnation, the one live at ``at_ms`` (the newest whose first record is at or before it), or the
    newest."""
    found = incarnations_of(blocks, topic)
    if not found:
        raise NotFoundError(f"no backup block of topic {topic!r}: nothing to restore (was it ingested with the "
                            "backup group, under this tenant?)")
    if named is not None:
        if named not in found:
            raise ConfigError(f"topic {topic!r} has no backed-up incarnation {named!r}; it has {found}")
        return named
    if at_ms is not None:
        firsts = {i: min(m.min_time for m in blocks for r in m.kafka if r.topic == topic and r.incarnation == i)
                  for i in found}
        live = [i for i in found if firsts[i] <= at_ms]
        if not live:
            raise ConfigError(f"topic {topic!r} had no backed-up incarnation at {at_ms}: the oldest starts at "
                              f"{firsts[found[0]]}")
        return live[-1]
    return found[-1]


def _share(interval: Interval, lo: int, hi: int) -> tuple[int, int]:
    """Records and bytes of ``interval``'s block that fall in ``[lo, hi)`` of its interval, pro rata by offsets."""
    meta = interval.block
    offsets = sum(r.end - r.start for r in meta.kafka) or 1
    part = max(0, min(hi, interval.end) - max(lo, interval.start))
    rows = sum(d.rows for d in meta.datasets if d.kind == "records")
    size = sum(d.bytes for d in meta.datasets if d.kind == "records")
    return rows * part // offsets, size * part // offsets


def _loss_reason(losses: Sequence[LossRow], start: int, end: int) -> str:
    reasons = [f"acknowledged lost [{loss.start}, {loss.end}): {loss.reason}" for loss in losses
               if loss.start < end and loss.end > start]
    return "; ".join(reasons) or "no backup block holds these offsets"


def plan_partition(partition: int, intervals: Sequence[Interval], wanted: tuple[int, int] | None,
                   until_ms: int | None, losses: Sequence[LossRow] = ()) -> PartitionPlan:
    """One partition's plan from its intervals (any order) and the wanted offsets (None: all backed up)."""
    ordered = sorted(intervals, key=lambda i: (i.start, i.end))
    if wanted is None:
        start = ordered[0].start if ordered else 0
        end = max((i.end for i in ordered), default=0)
    else:
        start, end = wanted
    plan = PartitionPlan(partition, start, end)
    covered = start
    for interval in ordered:
        if interval.end <= covered or interval.start >= end:
            continue
        if interval.start > covered:
            plan.gaps.append(Gap(covered, interval.start, _loss_reason(losses, covered, interval.start)))
            break
        if until_ms is not None and interval.block.min_time >= until_ms:
            end = covered  # every record from here on is stamped at or after --until
            break
        plan.intervals.append(interval)
        covered = min(interval.end, end)
    else:
        if covered < end:
            plan.gaps.append(Gap(covered, end, _loss_reason(losses, covered, end)))
    plan.end = min(end, covered)
    for interval in plan.intervals:
        records, size = _share(interval, plan.start, plan.end)
        plan.records += records
        plan.bytes += size
    return plan


def recorded_partitions(rows: Iterable[OffsetRow | IncarnationRow | LossRow], topic: str,
                        incarnation: str) -> set[int]:
    """The partitions of ``topic``'s ``incarnation`` that ingestion committed offsets of (its current offsets, the
    history of ended incarnations, acknowledged losses): facts of the metastore that outlive every block."""
    return {row.partition for row in rows if row.topic == topic and row.incarnation == incarnation}


def source_count(source: TopicState | None, incarnation: str) -> int | None:
    """The source topic's partition count as Kafka describes it now, when it is still the incarnation restored (the
    same topic id: a recreated topic of the same name is another topic); None otherwise."""
    if source is None or source.incarnation != incarnation or not source.partitions:
        return None
    return max(source.partitions) + 1


def build_plan(blocks: Sequence[BlockMeta], *, tenant: str, topic: str, incarnation: str,
               target_partitions: int | None, range_: RestoreRange = RestoreRange(),
               losses: Sequence[LossRow] = (), recorded: Iterable[int] = (), counted: int | None = None,
               counted_from: str = "kafka") -> RestorePlan:
    """The plan over the backup ``blocks`` of ``topic`` (any order; blocks of other topics and incarnations are
    ignored). ``target_partitions`` is the target topic's partition count (None: it will be created with the
    source's). The source's partition count is ``counted`` when known (from Kafka, ``source_count``, or the
    operator: ``counted_from``), else one more than the highest partition of the incarnation that ingestion ever
    committed (``recorded``, ``recorded_partitions``) or that a block holds: a partition whose blocks retention
    removed, or that has been quiet since, still counts; so does one that never held a record (committed as an empty
    range), except in a topic backed up before ingestion did so. A count
    below those facts is refused (it would put records in partitions the topic does not have)."""
    per: dict[int, list[Interval]] = defaultdict(list)
    for meta in blocks:
        for r in meta.kafka:
            if r.topic == topic and r.incarnation == incarnation and r.end > r.start:
                per[r.partition].append(Interval(r.start, r.end, meta))
    partitions = sorted(per) if range_.offsets is None else sorted(range_.offsets)
    facts = max([*per, *recorded, *(loss.partition for loss in losses
                                    if loss.topic == topic and loss.incarnation == incarnation)], default=-1) + 1
    if counted is not None and counted < facts:
        raise ConfigError(f"{topic}: the source's partition count is given as {counted} ({counted_from}), but "
                          f"partition {facts - 1} of incarnation {incarnation} was backed up; give its real count")
    count = facts if counted is None else counted
    mapping = PartitionMapping(count, target_partitions or count)
    plans = []
    for partition in partitions:
        wanted = None if range_.offsets is None else range_.offsets[partition]
        lost = [loss for loss in losses if loss.topic == topic and loss.partition == partition
                and loss.incarnation == incarnation]
        plans.append(plan_partition(partition, per.get(partition, []), wanted, range_.until_ms, lost))
    return RestorePlan(tenant, topic, incarnation, incarnations_of(blocks, topic), mapping, range_.until_ms, plans,
                       "metastore" if counted is None else counted_from)
