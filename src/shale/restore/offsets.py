"""``shale restore offsets``: carry a consumer group's position over to the restored topic.

A group's committed source offset ``S`` of partition ``p`` means "the next record to read is the first at or after
``S``". The restore sends a source partition's records in offset order into the same target partition (same
partition count). The translated offset is the target offset of the first record the restore sent from a source
offset at or after ``S``, or the end of what it sent when the group had read everything restored.

It is anchored on what the restore itself wrote: each transaction commits, with its progress, an anchor (the
target offsets its records landed at, as runs: ``shale.restore.progress.anchor_runs``). Within a run the records
are consecutive in the target, so the translation is the run's first target offset plus the backup's records of
the incarnation between the run's first source offset and ``S`` (read from the blocks: Kafka offsets are not
contiguous), less the records the restore dead-lettered (too large for the target: not sent), plus the records an
erasure removed from the blocks after the restore sent them (``shale erase``: the blocks no longer hold them, the
target does). A run's count says how many records it sent from its source offsets (up to the next run's first):
what the blocks no longer hold of those are erased records it sent, the first ones in offset order (the restore
reads in offset order, so an erasure that ran meanwhile removed the later ones; one that ran before removed them
before the restore read them, and the count says none was sent). Records the target
held before the restore, records other producers wrote meanwhile and records its retention removed since do not
change it. A job restored before anchors were written is translated by counting the target partition's committed
records from its start (exact only when the restore wrote the partition alone, from its start). With a key-hash
mapping a group's position has no single target offset per partition: translation is refused.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient

from shale.block import parse_restore_dead_letter_key, restore_dead_letters_prefix
from shale.config import BucketConfig
from shale.errors import ConfigError, RetryableError
from shale.metastore import erased_offsets, every_erasure
from shale.objstore import BucketReader
from shale.restore.plan import RestorePlan
from shale.restore.progress import Run
from shale.restore.task import PartitionWork, partition_rows


def records_between(plan: RestorePlan, bucket: BucketConfig, partition: int, lo: int, hi: int) -> int:
    """How many of the backup's records of ``partition`` (of the plan's incarnation) the restore holds in source
    offsets ``[lo, hi)``."""
    found = [p for p in plan.partitions if p.partition == partition]
    if not found:
        return 0
    p = found[0]
    start, end = max(lo, p.start), min(hi, p.end)
    if end <= start:
        return 0
    work = PartitionWork("", plan.topic, "", partition, start, end,
                         tuple((i.start, i.end, i.block) for i in p.intervals), 1, 1, None, 1,
                         incarnation=plan.incarnation)
    return sum(table.num_rows for _, table in partition_rows(bucket, work, start))


def records_before(plan: RestorePlan, bucket: BucketConfig, partition: int, source_offset: int) -> int:
    """How many of the backup's records of ``partition`` the restore sent before ``source_offset``."""
    return records_between(plan, bucket, partition, 0, source_offset)


def with_erased(runs: Sequence[Run], kept_between: Callable[[int, int], int], erased: Sequence[int],
                done: int) -> Callable[[int, int], int]:
    """``sent_between`` for ``anchored_offset`` from ``kept_between(lo, hi)``, the records the blocks still hold
    and the restore sent in ``[lo, hi)``, and the ``erased`` source offsets: plus each erased record the run
    starting at ``lo`` sent (the module's docstring). ``done``: the job's next source offset (the last run's end)."""
    ordered = sorted(runs)
    firsts = [run[0] for run in ordered]
    gone = sorted(erased)

    def sent(lo: int, hi: int) -> int:
        kept = kept_between(lo, hi)
        i = bisect.bisect_right(firsts, lo) - 1
        if i < 0 or not gone:
            return kept
        first, _, count = ordered[i]
        end = firsts[i + 1] if i + 1 < len(ordered) else done
        inside = gone[bisect.bisect_left(gone, first):bisect.bisect_left(gone, end)]
        if not inside:
            return kept
        taken = max(0, min(len(inside), count - kept_between(first, end)))
        return kept + sum(1 for o in inside[:taken] if lo <= o < hi)

    return sent


def anchored_offset(runs: Sequence[Run], source_offset: int, sent_between: Callable[[int, int], int]) -> int:
    """Pure: the target offset of the first record sent from ``source_offset`` on (or the end of what was sent),
    from the job's ``runs`` of one partition and ``sent_between(lo, hi)``, the records sent from source offsets
    ``[lo, hi)``."""
    ordered = sorted(runs)
    i = bisect.bisect_right([run[0] for run in ordered], source_offset) - 1
    if i < 0:
        return ordered[0][1]
    first, target, count = ordered[i]
    before = sent_between(first, source_offset)
    if before < count:
        return target + before
    return ordered[i + 1][1] if i + 1 < len(ordered) else target + count


def target_offset(client: Mapping[str, Any], topic: str, partition: int, records: int,
                  timeout: float = 120.0) -> int:
    """The offset of the ``records``-th committed record (0-based) of a target partition, or its end."""
    consumer = Consumer({**client, "group.id": "shale-restore-offsets-probe", "enable.auto.commit": False,
                         "isolation.level": "read_committed", "enable.partition.eof": True})
    try:
        consumer.assign([TopicPartition(topic, partition, -2)])
        seen, deadline = 0, time.monotonic() + timeout
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    return message.offset() or 0
                raise RetryableError(f"reading {topic}[{partition}] failed: {error}")
            if seen == records:
                return message.offset() or 0
            seen += 1
        raise RetryableError(f"reading {topic}[{partition}] did not reach record {records} in {timeout:.0f}s")
    finally:
        consumer.close()


def committed_offsets(client: Mapping[str, Any], group: str, topic: str) -> dict[int, int]:
    """A group's committed offsets of ``topic`` in a cluster (partitions without a commit left out)."""
    admin = AdminClient(dict(client))
    request = [ConsumerGroupTopicPartitions(group)]
    result = next(iter(admin.list_consumer_group_offsets(request).values())).result(timeout=30)
    return {tp.partition: tp.offset for tp in result.topic_partitions if tp.topic == topic and tp.offset >= 0}


def dead_lettered(bucket: BucketReader, tenant: str, job: str) -> dict[int, list[int]]:
    """Per source partition, the offsets the restore job dead-lettered (one LIST of the job's small prefix)."""
    out: dict[int, list[int]] = {}
    for item in bucket.list(restore_dead_letters_prefix(tenant, job)):
        parsed = parse_restore_dead_letter_key(item.key)
        if parsed is not None:
            out.setdefault(parsed[0], []).append(parsed[1])
    return out


def translate(plan: RestorePlan, bucket: BucketConfig, client: Mapping[str, Any], target_topic: str,
              source: Mapping[int, int], skipped: Mapping[int, Sequence[int]] | None = None,
              anchors: Mapping[int, Sequence[Run]] | None = None,
              restored: Mapping[int, int] | None = None,
              erased: Mapping[int, Sequence[int]] | None = None) -> dict[int, int]:
    """Per partition, the target offset at which a consumer resumes with the first record it had not seen.
    ``skipped``: the offsets the restore dead-lettered (``dead_lettered``), which the target does not hold;
    ``anchors``: the job's runs per partition (``read_anchors``); ``restored``: the job's next source offset per
    partition (``read_progress``): the blocks are read only below it, where the restore read them (a partition
    that stopped at a block it could not read is counted up to there); ``erased``: the source offsets erasures
    removed from the blocks (``erased_source_offsets``), counted where the restore sent them. A job restored
    before anchors were written counts the blocks' records only (**known limit**: an erasure since makes its
    translation low by the erased records before the group's offset)."""
    if plan.mapping.by_key:
        raise ConfigError("the restore mapped records by key into another partition count: a group's position has "
                          "no single offset per target partition; translate only same-partition restores")
    skipped = skipped or {}
    anchors = anchors or {}
    out: dict[int, int] = {}
    for p, offset in sorted(source.items()):
        gone = (erased or {}).get(p, ())
        erased_here = set(gone)
        dead = [o for o in skipped.get(p, ()) if o not in erased_here]  # an erased one is not in the blocks either
        done = (restored or {}).get(p, offset)
        if anchors.get(p):
            def kept(lo: int, hi: int, p: int = p, dead: Sequence[int] = dead, done: int = done) -> int:
                return records_between(plan, bucket, p, lo, min(hi, done)) - sum(1 for o in dead if lo <= o < hi)
            out[p] = anchored_offset(anchors[p], offset, with_erased(anchors[p], kept, gone, done))
        else:
            out[p] = target_offset(client, target_topic, p, records_before(plan, bucket, p, min(offset, done))
                                   - sum(1 for o in dead if o < offset))
    return out


def erased_source_offsets(metastore: object, plan: RestorePlan) -> dict[int, list[int]]:
    """Per source partition, the offsets (of the plan's tenant and incarnation) erasures removed from the blocks
    (a metastore that keeps no erasures: none)."""
    rows = getattr(metastore, "erasures", None)
    if rows is None:
        return {}
    erased = erased_offsets(every_erasure(rows), plan.topic, plan.incarnation, plan.tenant)
    return {p: sorted(offsets) for p, offsets in erased.items()}


def set_offsets(client: Mapping[str, Any], group: str, topic: str, offsets: Mapping[int, int]) -> None:
    """Commit ``offsets`` for ``group`` on the target (the group must have no active member)."""
    admin = AdminClient(dict(client))
    request = [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p, o) for p, o in sorted(offsets.items())])]
    for future in admin.alter_consumer_group_offsets(request).values():
        future.result(timeout=30)
