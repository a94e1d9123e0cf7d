"""What Shale asks Kafka directly, with librdkafka (confluent-kafka): topics, their ids (incarnations) and
partitions, the offsets that bound what may be read, and the offsets that hold records (for ``shale verify``).
Spark's own Java consumer reads the records.

Both clients get the same typed security settings from ``KafkaConfig``, translated here, because they name them
differently (``sasl.jaas.config`` for Java, ``sasl.username``/``sasl.password`` for librdkafka). A CA file is
handed to Spark as inline PEM (``ssl.truststore.certificates``), so executors on other machines need no file.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from confluent_kafka import Consumer, IsolationLevel, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from shale.config import KafkaConfig
from shale.errors import ConfigError, RetryableError

T = TypeVar("T")
TIMEOUT = 30.0
UNKNOWN_TOPIC = 3  # librdkafka's UNKNOWN_TOPIC_OR_PART
FETCH_BYTES = 16 * 2**20
"""What an ingest task's consumer fetches per partition and request at most (``max.partition.fetch.bytes``;
Kafka's default is 1 MiB; less under a small ``ingest.max_task_bytes``, ``shale.ingest.source``). With 1-4 MiB,
Spark's consumer waited on Kafka for about a third of a task's time (a 1,000,000-record read: 2.3 s at 1 MiB,
1.2-1.4 s at 8-32 MiB). A larger record is still fetched whole: the limit is a target, not a cap."""
FETCH_WAIT_MS = 1
"""How long the broker may hold a fetch of an ingest task's consumer that finds no new record
(``fetch.wait.max.ms``; Kafka's default is 500). A batch reads ranges that are already written, so a wait never
brings a record; it only delays the answer for the partitions that do have records once one partition of the
fetch is at its end."""
SAMPLE_RECORDS, SAMPLE_BYTES = 100, 2**20


def _ca_pem(kafka: KafkaConfig) -> str:
    try:
        return Path(kafka.ssl_ca_file).read_text()
    except OSError as exc:
        raise ConfigError(f"kafka.ssl_ca_file = {kafka.ssl_ca_file!r} cannot be read: {exc.strerror}") from None


def client_options(kafka: KafkaConfig) -> dict[str, Any]:
    """A librdkafka client configuration (bootstrap servers included). Holds the SASL password: never log it."""
    options: dict[str, Any] = {"bootstrap.servers": kafka.bootstrap_servers,
                               "security.protocol": kafka.security_protocol}
    if kafka.security_protocol.startswith("SASL"):
        options.update({"sasl.mechanisms": kafka.sasl_mechanism, "sasl.username": kafka.sasl_username,
                        "sasl.password": kafka.sasl_password.get_secret_value()})
    if kafka.security_protocol.endswith("SSL"):
        if kafka.ssl_ca_file:
            options["ssl.ca.pem"] = _ca_pem(kafka)
        options["ssl.endpoint.identification.algorithm"] = "https" if kafka.ssl_verify_hostname else "none"
    # librdkafka's own log lines (such as "BGQUEUE ... Purging unserved events" when a client closes) go through
    # Python logging instead of straight to the console: shale.kafka.librdkafka, shown at DEBUG.
    options["logger"] = LIBRDKAFKA_LOG
    return {**options, **kafka.client_options}


LIBRDKAFKA_LOG = logging.getLogger("shale.kafka.librdkafka")


def admin(kafka: KafkaConfig) -> AdminClient:
    return AdminClient(client_options(kafka))


def incarnation_of(topic_id: object) -> str:
    """Kafka's own spelling of a topic id (URL-safe base64, as `kafka-topics --describe` prints it)."""
    return str(topic_id).replace("+", "-").replace("/", "_").rstrip("=")


@dataclass(frozen=True)
class TopicState:
    """A topic as Kafka has it now: its incarnation (topic id) and its partitions."""

    name: str
    incarnation: str
    partitions: tuple[int, ...]


def _retrying(what: str, request: Callable[[], T], attempts: int = 5) -> T:
    """``request()``, issued again (a new request, not the failed future) after a retriable error such as a
    leader moving, with backoff; the last error, or one Kafka calls final, as a :class:`RetryableError`."""
    for attempt in range(attempts):
        try:
            return request()
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            retriable = getattr(error, "retriable", lambda: False)()
            if attempt == attempts - 1 or not retriable:
                raise RetryableError(f"Kafka did not answer {what}: {exc}") from exc
            time.sleep(0.2 * 2**attempt)
    raise AssertionError("unreachable")


def describe_topics(kafka: KafkaConfig, topics: Iterable[str] = (), pattern: str = "",
                    client: AdminClient | None = None, timeout: float = TIMEOUT) -> dict[str, TopicState]:
    """The named topics that exist, or every topic matching ``pattern`` (internal topics excluded)."""
    client = client if client is not None else admin(kafka)  # a client with no request in flight is falsy
    try:
        metadata = client.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise RetryableError(f"Kafka at {kafka.bootstrap_servers} did not answer a metadata request: {exc}") from exc
    wanted = set(topics)
    names = sorted(n for n in metadata.topics if not n.startswith("__")
                   and ((wanted and n in wanted) or (pattern and re.fullmatch(pattern, n))))
    if not names:
        return {}

    def describe() -> dict[str, Any]:
        out = {}
        for name, future in client.describe_topics(TopicCollection(names), request_timeout=timeout).items():
            try:
                out[name] = future.result()
            except KafkaException as exc:
                if exc.args and getattr(exc.args[0], "code", lambda: None)() == UNKNOWN_TOPIC:
                    continue  # deleted between the listing and the description
                raise
        return out

    return {name: TopicState(name, incarnation_of(d.topic_id), tuple(sorted(p.id for p in d.partitions)))
            for name, d in _retrying(f"a description of {', '.join(names)}", describe).items()}


def offset_bounds(kafka: KafkaConfig, partitions: Iterable[tuple[str, int]],
                  client: AdminClient | None = None) -> dict[tuple[str, int], tuple[int, int]]:
    """(earliest, end) per topic-partition, ``end`` as a read_committed consumer sees it: the last stable offset,
    before any open transaction, so a batch never waits on records that may still be aborted."""
    client = client if client is not None else admin(kafka)  # a client with no request in flight is falsy
    tps = [TopicPartition(t, p) for t, p in partitions]
    if not tps:
        return {}

    def offsets(spec: OffsetSpec) -> dict[tuple[str, int], int]:
        futures = client.list_offsets(dict.fromkeys(tps, spec), isolation_level=IsolationLevel.READ_COMMITTED,
                                      request_timeout=TIMEOUT)
        return {(tp.topic, tp.partition): int(future.result().offset) for tp, future in futures.items()}

    what = f"the offsets of {len(tps)} partitions"
    earliest = _retrying(what, lambda: offsets(OffsetSpec.earliest()))  # type: ignore[no-untyped-call]
    end = _retrying(what, lambda: offsets(OffsetSpec.latest()))  # type: ignore[no-untyped-call]
    return {tp: (earliest[tp], end[tp]) for tp in earliest}


def value_bytes_per_offset(kafka: KafkaConfig, ranges: Mapping[tuple[str, int], tuple[int, int]],
                           timeout: float = 2.0) -> dict[tuple[str, int], float]:
    """Bytes of record values per offset at the start of each ``[start, end)``, from its first records (up to
    ``SAMPLE_RECORDS`` of them or ``SAMPLE_BYTES``, at least one), read with a consumer that commits nothing: how a
    plan sizes a partition it has never read. A partition without a record value within ``timeout`` (only aborted
    records or tombstones, say) gets 0.0: unknown."""
    if not ranges:
        return {}
    consumer = Consumer({**client_options(kafka), "group.id": f"shale-sample-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         # Small first fetches (grown for a larger record): 1 MiB ones of one partition filled the
                         # queue while the others waited (measured: 0.08 s for 4 partitions, against 0.35 s).
                         "fetch.message.max.bytes": 64 * 1024})
    seen: dict[tuple[str, int], list[int]] = {}  # [value bytes, records, next offset]
    try:
        consumer.assign([TopicPartition(t, p, start) for (t, p), (start, _) in ranges.items()])
        todo, deadline = set(ranges), time.monotonic() + timeout
        while todo and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=1000, timeout=0.1):
                tp, offset = (message.topic(), message.partition()), message.offset()
                if message.error() is not None or tp not in todo or offset is None or offset >= ranges[tp][1]:
                    continue
                stats = seen.setdefault(tp, [0, 0, 0])
                stats[0] += len(message.value() or b"")
                stats[1] += 1
                stats[2] = offset + 1
                if stats[1] >= SAMPLE_RECORDS or stats[0] >= SAMPLE_BYTES or stats[2] >= ranges[tp][1]:
                    todo.discard(tp)
                    consumer.pause([TopicPartition(*tp)])
    finally:
        consumer.close()
    sizes = {tp: size / (end - ranges[tp][0]) for tp, (size, _, end) in seen.items()}
    return {tp: sizes.get(tp, 0.0) for tp in ranges}


def list_partitions(kafka: KafkaConfig, topics: Iterable[str] = (), pattern: str = "") -> dict[str, list[int]]:
    """Partitions of the named topics, or of every topic matching ``pattern``."""
    return {name: list(state.partitions) for name, state in describe_topics(kafka, topics, pattern).items()}


def watermarks(kafka: KafkaConfig, partitions: dict[str, list[int]]) -> dict[tuple[str, int], tuple[int, int]]:
    """(earliest, end) offsets per topic-partition (read_committed)."""
    return offset_bounds(kafka, [(t, p) for t, ps in partitions.items() for p in ps])


def existing_offsets(kafka: KafkaConfig, topic: str, partition: int, start: int, end: int) -> list[int]:
    """Every offset in ``[start, end)`` that holds a record a read_committed consumer sees (transaction markers,
    aborted records and compacted-away offsets do not), read with a consumer that commits nothing."""
    if end <= start:
        return []
    consumer = Consumer({**client_options(kafka), "group.id": f"shale-verify-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "fetch.max.bytes": 64 * 1024 * 1024})
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
            position = consumer.position([TopicPartition(topic, partition)])[0].offset
            if (offsets and offsets[-1] >= end - 1) or position >= end:
                return offsets
    finally:
        consumer.close()
    return offsets


def delete_records_before(kafka: KafkaConfig, topic: str, partition: int, offset: int) -> None:
    """Kafka's delete-records API: drop a partition's records below ``offset`` (what retention does)."""
    client: Any = admin(kafka)
    futures = client.delete_records([TopicPartition(topic, partition, offset)], request_timeout=TIMEOUT)
    for future in futures.values():
        future.result()
