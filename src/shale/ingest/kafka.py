"""What the driver asks Kafka directly (with confluent-kafka): topics and partitions, their offsets, and the
offsets that exist (for ``shale verify``). Spark's own connector does the reading of records."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from shale.errors import RetryableError

TIMEOUT = 30.0


def _admin(bootstrap: str, options: dict[str, str]) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap, **options})


def list_partitions(bootstrap: str, topics: Iterable[str] = (), pattern: str = "",
                    options: dict[str, str] | None = None) -> dict[str, list[int]]:
    """Partitions of the named topics, or of every topic matching ``pattern`` (internal topics excluded)."""
    try:
        metadata = _admin(bootstrap, options or {}).list_topics(timeout=TIMEOUT)
    except KafkaException as exc:
        raise RetryableError(f"Kafka at {bootstrap} did not answer a metadata request: {exc}") from exc
    wanted = set(topics)
    out: dict[str, list[int]] = {}
    for name, topic in metadata.topics.items():
        if name.startswith("__"):
            continue
        if (wanted and name in wanted) or (pattern and re.fullmatch(pattern, name)):
            out[name] = sorted(topic.partitions)
    return out


def watermarks(bootstrap: str, partitions: dict[str, list[int]],
               options: dict[str, str] | None = None) -> dict[tuple[str, int], tuple[int, int]]:
    """(earliest, end) offsets per topic-partition."""
    admin = _admin(bootstrap, options or {})
    tps = [TopicPartition(t, p) for t, ps in partitions.items() for p in ps]
    result: dict[tuple[str, int], list[int]] = {(tp.topic, tp.partition): [0, 0] for tp in tps}
    specs: list[tuple[Any, int]] = [(OffsetSpec.earliest(), 0), (OffsetSpec.latest(), 1)]  # type: ignore[no-untyped-call]
    for spec, index in specs:
        futures = admin.list_offsets(dict.fromkeys(tps, spec), request_timeout=TIMEOUT)
        for tp, future in futures.items():
            result[(tp.topic, tp.partition)][index] = int(future.result().offset)
    return {k: (v[0], v[1]) for k, v in result.items()}


def existing_offsets(bootstrap: str, topic: str, partition: int, start: int, end: int,
                     options: dict[str, str] | None = None) -> list[int]:
    """Every offset in ``[start, end)`` that holds a record (transaction markers and compacted-away offsets do
    not), read with a consumer that does not commit."""
    if end <= start:
        return []
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"shale-verify-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "fetch.max.bytes": 64 * 1024 * 1024, **(options or {})})
    offsets: list[int] = []
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        idle = 0
        while idle < 20:
            messages = consumer.consume(num_messages=10_000, timeout=0.5)
            if not messages:
                idle += 1
                continue
            idle = 0
            for message in messages:
                offset = message.offset()
                if message.error() is None and offset is not None:
                    if offset >= end:
                        return offsets
                    offsets.append(offset)
            if offsets and offsets[-1] >= end - 1:
                return offsets
    finally:
        consumer.close()
    return offsets


def delete_records_before(bootstrap: str, topic: str, partition: int, offset: int,
                          options: dict[str, str] | None = None) -> None:
    """Kafka's delete-records API: drop a partition's records below ``offset``."""
    from confluent_kafka.admin import AdminClient as _Admin

    admin: Any = _Admin({"bootstrap.servers": bootstrap, **(options or {})})
    futures = admin.delete_records([TopicPartition(topic, partition, offset)], request_timeout=TIMEOUT)
    for future in futures.values():
        future.result()
