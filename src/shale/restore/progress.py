"""The restore's progress: per (restore job, source partition), the next source offset to restore, kept in the
compacted topic ``_shale_restore_progress`` of the target cluster and written in the same Kafka transaction as the
records it covers. Whatever a ``read_committed`` consumer sees there is exactly what the target topic holds.

Reading it is safe only once no transaction of the same partition can still commit: ``fence`` (Kafka's
``init_transactions``) bumps the transactional id's epoch, which aborts the open transaction of a killed run and
fences every zombie producer of that id. A ``read_committed`` consumer stops at the last stable offset, which the
open transactions of other partitions' tasks hold back until they commit (every few thousand records, and never
across a read from the bucket), so ``read_progress`` reads on until it has passed the log end it saw first.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from shale.errors import RetryableError

PROGRESS_TOPIC = "_shale_restore_progress"
READ_TIMEOUT_S = 120.0


def transactional_id(job: str, partition: int) -> str:
    """One transactional id per (restore job, source partition): a task retried, speculated or started again after
    a crash uses the same id, so Kafka fences the older one."""
    return f"shale-restore-{job}-{partition}"


def progress_key(job: str, partition: int) -> bytes:
    return f"{job}/{partition}".encode()


def progress_value(next_offset: int, restored: int) -> bytes:
    return json.dumps({"next": next_offset, "restored": restored}).encode()


def parse_progress(key: bytes | None, value: bytes | None, job: str) -> tuple[int, int, int] | None:
    """``(partition, next offset, records restored)`` of one progress record of ``job``, else None."""
    if key is None or value is None:
        return None
    name, _, partition = key.decode(errors="replace").rpartition("/")
    if name != job or not partition.isdigit():
        return None
    data = json.loads(value)
    return int(partition), int(data["next"]), int(data["restored"])


def ensure_progress_topic(admin: AdminClient) -> None:
    """Create the compacted progress topic when it is missing (one partition: it is small)."""
    if PROGRESS_TOPIC in admin.list_topics(timeout=30).topics:
        return
    topic = NewTopic(PROGRESS_TOPIC, 1, config={"cleanup.policy": "compact", "min.compaction.lag.ms": "60000"})
    for future in admin.create_topics([topic]).values():
        try:
            future.result(timeout=30)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise


def fence(client: Mapping[str, Any], job: str, partitions: Iterable[int]) -> None:
    """``init_transactions`` for each partition's transactional id: aborts a killed run's open transactions and
    fences its zombies, so that the progress read next is final."""
    for partition in partitions:
        producer = Producer({**client, "transactional.id": transactional_id(job, partition)})
        producer.init_transactions(60)
        producer.flush(10)


def read_progress(client: Mapping[str, Any], job: str, timeout: float = READ_TIMEOUT_S
                  ) -> dict[int, tuple[int, int]]:
    """Per source partition of ``job``: (next source offset, records restored so far), as committed."""
    settings = {**client, "group.id": f"shale-restore-reader-{job}", "enable.auto.commit": False,
                "enable.partition.eof": True, "auto.offset.reset": "earliest"}
    # The log end of an uncommitted read (a read_committed one answers the last stable offset, which another
    # task's open transaction may hold below our last commit): every record our fenced ids wrote is below it.
    ends = Consumer({**settings, "isolation.level": "read_uncommitted"})
    try:
        low, high = ends.get_watermark_offsets(TopicPartition(PROGRESS_TOPIC, 0), timeout=30, cached=False)
    finally:
        ends.close()
    found: dict[int, tuple[int, int]] = {}
    if high <= low:
        return found
    consumer = Consumer({**settings, "isolation.level": "read_committed"})
    try:
        consumer.assign([TopicPartition(PROGRESS_TOPIC, 0, low)])
        deadline = time.monotonic() + timeout
        while True:
            if time.monotonic() > deadline:
                raise RetryableError(f"the restore progress topic {PROGRESS_TOPIC} did not become stable up to "
                                     f"offset {high} in {timeout:.0f}s (a transaction of another restore is open)")
            message = consumer.poll(1.0)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    raise RetryableError(f"reading {PROGRESS_TOPIC} failed: {error}")
                if (message.offset() or 0) >= high:
                    return found
                continue
            parsed = parse_progress(message.key(), message.value(), job)
            if parsed is not None:
                partition, next_offset, restored = parsed
                found[partition] = (next_offset, restored)
            if (message.offset() or 0) + 1 >= high:
                return found
    finally:
        consumer.close()
