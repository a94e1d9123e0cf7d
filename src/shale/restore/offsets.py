"""``shale restore offsets``: carry a consumer group's position over to the restored topic.

A group's committed source offset ``S`` of partition ``p`` means "the next record to read is the first at or after
``S``". The restore sends a source partition's records in offset order into the same target partition (same
partition count), so the records before ``S`` are the first ``k`` committed records of the target partition, where
``k`` counts the backup's records of ``p`` in ``[restore start, S)`` (read from the blocks: Kafka offsets are not
contiguous). The translated offset is the target offset of the ``k``-th committed record (0-based) of the target
partition, found by reading it ``read_committed`` (transaction markers take offsets of their own), or its end when
fewer were restored. It is exact, and costs a read of the partition up to there. Records the restore dead-lettered
(too large for the target) were not sent: those before ``S`` are taken off ``k``. With a key-hash mapping a group's
position has no single target offset per partition: translation is refused.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient

from shale.block.layout import parse_restore_dead_letter_key, restore_dead_letters_prefix
from shale.config import BucketConfig
from shale.errors import ConfigError, RetryableError
from shale.objstore import BucketReader
from shale.restore.plan import RestorePlan
from shale.restore.task import PartitionWork, partition_rows


def records_before(plan: RestorePlan, bucket: BucketConfig, partition: int, source_offset: int) -> int:
    """How many of the backup's records of ``partition`` the restore sent before ``source_offset``."""
    found = [p for p in plan.partitions if p.partition == partition]
    if not found:
        return 0
    p = found[0]
    end = min(source_offset, p.end)
    work = PartitionWork("", plan.topic, "", partition, p.start, end,
                         tuple((i.start, i.end, i.block) for i in p.intervals), 1, 1, None, 1)
    return sum(table.num_rows for _, table in partition_rows(bucket, work, p.start)) if end > p.start else 0


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
              source: Mapping[int, int], skipped: Mapping[int, Sequence[int]] | None = None) -> dict[int, int]:
    """Per partition, the target offset at which a consumer resumes with the first record it had not seen.
    ``skipped``: the offsets the restore dead-lettered (``dead_lettered``), which the target does not hold."""
    if plan.mapping.by_key:
        raise ConfigError("the restore mapped records by key into another partition count: a group's position has "
                          "no single offset per target partition; translate only same-partition restores")
    skipped = skipped or {}
    return {p: target_offset(client, target_topic, p, records_before(plan, bucket, p, offset)
                             - sum(1 for o in skipped.get(p, ()) if o < offset))
            for p, offset in sorted(source.items())}


def set_offsets(client: Mapping[str, Any], group: str, topic: str, offsets: Mapping[int, int]) -> None:
    """Commit ``offsets`` for ``group`` on the target (the group must have no active member)."""
    admin = AdminClient(dict(client))
    request = [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p, o) for p, o in sorted(offsets.items())])]
    for future in admin.alter_consumer_group_offsets(request).values():
        future.result(timeout=30)
