"""An ingest task's Kafka read: one librdkafka consumer per task, assigned every partition the task reads.

Spark's Kafka source reads a task's partitions one after another, each through its own pooled consumer, and asks
the broker for the partition's offset range after every poll; a batch over many partitions paid those round trips
per partition (docs/DESIGN.md 10.9: 2.6 s of a 199,680-record read over 256 partitions, against 0.7 s over 8).
One consumer assigned to all of them fetches many partitions per request, so its round trips follow the bytes.

Records are handed on as Arrow batches of one partition each, every partition's records in one run and in offset
order, as the chunk writer needs (``ChunkWriter``): the partition being handed on streams, the others are held
until their turn. While more than ``held_bytes`` of records are held, the partitions not being handed on are paused
(not fetched) until the current one ends, so a task holds at most about that much whatever its ranges.

A partition's range ``[start, end)`` is read when the consumer returns a record at or past ``end - 1``, or reaches
the partition's end (its last stable offset: read_committed) at or past ``end``; offsets without a record (a
transaction's markers, aborted records, compacted records) need no record. An offset the broker no longer holds
(retention deleted it after planning) fails the read: the driver plans the batch again and reports the loss.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Consumer, KafkaError, KafkaException, Message, TopicPartition

from shale.block import HEADERS
from shale.errors import RetryableError
from shale.ingest.plan import PartitionRange
from shale.kafka import FETCH_BYTES, FETCH_WAIT_MS

CONSUME_BATCH = 10_000
"""Records asked of the consumer per call."""
RUN_ROWS = 50_000
"""A partition being handed on is handed on in batches of at most this many records, and of at most a quarter of
what the task may hold (``held_bytes``) as soon as a record passes it."""
HELD_BYTES = 64 * 2**20
"""At most this many bytes of records a task's consumer holds or prefetches (less under a small
``ingest.max_task_bytes``: a thirty-second of it)."""
STALL_SECONDS = 60.0
"""How long a read may go without a record or a partition's end before it fails (the batch is planned again)."""
TIMESTAMP_TYPES = {0: -1, 1: 0, 2: 1}
"""librdkafka's timestamp types (not available, create, log append) as Kafka's own ids, as Spark gave them."""
COLUMNS = pa.schema([("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()),
                     ("partition", pa.int32()), ("offset", pa.int64()), ("timestamp", pa.timestamp("us", "UTC")),
                     ("timestampType", pa.int32()), ("headers", HEADERS)])
"""The columns a task's records arrive in (``shale.encoder.records.normalize`` takes them)."""


def consumer_options(client: dict[str, Any], group: str, held: int) -> dict[str, Any]:
    """A task consumer's librdkafka configuration: ``client`` (``shale.kafka.client_options``: holds the SASL
    password, never log it) with exact offsets, read_committed, no offset ever committed to Kafka, and at most
    ``held`` bytes fetched ahead (per request and in its queue)."""
    fetch = min(FETCH_BYTES, held)
    return {"group.id": group, **client, "enable.auto.commit": False, "enable.auto.offset.store": False,
            "auto.offset.reset": "error", "isolation.level": "read_committed", "enable.partition.eof": True,
            "max.partition.fetch.bytes": fetch, "fetch.max.bytes": max(fetch, held),
            "queued.max.messages.kbytes": max(fetch, held) // 1024, "fetch.wait.max.ms": FETCH_WAIT_MS}


def assign_tasks(ranges: Sequence[PartitionRange], count: int) -> list[list[PartitionRange]]:
    """The ranges shared out over ``count`` tasks, the largest first to the task with the fewest offsets so far
    (deterministic: a retried task reads what the first attempt read)."""
    shares: list[list[PartitionRange]] = [[] for _ in range(max(1, count))]
    sizes = [0] * len(shares)
    for r in sorted(ranges, key=lambda r: (-(r.end - r.start), r.topic, r.partition)):
        least = sizes.index(min(sizes))
        shares[least].append(r)
        sizes[least] += r.end - r.start
    return [sorted(s, key=lambda r: (r.topic, r.partition)) for s in shares if s]


class _Partition:
    """One partition's range, and its messages read and not handed on yet."""

    def __init__(self, r: PartitionRange) -> None:
        self.range = r
        self.done = False
        self.messages: list[Message] = []
        self.bytes = 0

    def batch(self) -> pa.RecordBatch:
        """The messages held, handed on as Arrow columns (and no longer held)."""
        ms, r = self.messages, self.range
        kinds, ats = zip(*[m.timestamp() for m in ms], strict=True)
        headers: list[list[tuple[str, bytes | None]] | None] = [m.headers() for m in ms]  # type: ignore[misc]
        times = pa.array(ats, pa.int64())
        if TIMESTAMP_NOT_AVAILABLE in kinds:  # rare: a record without a time has a null one
            times = pc.if_else(pc.equal(pa.array(kinds, pa.int32()), TIMESTAMP_NOT_AVAILABLE), None, times)
        out = pa.RecordBatch.from_arrays([
            pa.array([m.key() for m in ms], pa.binary()), pa.array([m.value() for m in ms], pa.binary()),
            pa.array([r.topic] * len(ms), pa.string()), pa.array([r.partition] * len(ms), pa.int32()),
            pa.array([m.offset() for m in ms], pa.int64()),
            pc.multiply_checked(times, 1000).cast(pa.timestamp("us", "UTC")),
            pa.array([TIMESTAMP_TYPES.get(kind, -1) for kind in kinds], pa.int32()),
            pa.array([[{"key": k, "value": v} for k, v in h] if h else None for h in headers], HEADERS)
            if any(headers) else pa.nulls(len(ms), HEADERS)],
            schema=COLUMNS)
        self.messages, self.bytes = [], 0
        return out


def read_ranges(options: dict[str, Any], ranges: Sequence[PartitionRange], held_bytes: int,
                stall: float = STALL_SECONDS) -> Iterator[pa.RecordBatch]:
    """Every record of ``ranges`` (read_committed), as batches of one partition each, each partition's in one run
    in offset order. ``options`` is ``consumer_options``'s."""
    parts = {(r.topic, r.partition): _Partition(r) for r in ranges if r.end > r.start}
    if not parts:
        return
    consumer = Consumer(options)
    try:
        consumer.assign([TopicPartition(t, p, x.range.start) for (t, p), x in parts.items()])
        order = list(parts)  # the order partitions are handed on in: the first to end, then the fullest
        current = order[0]
        paused: list[TopicPartition] = []
        last_progress = time.monotonic()
        seen, seen_bytes = 0, 1
        while True:
            cur = parts[current]
            if cur.messages and (cur.done or len(cur.messages) >= RUN_ROWS or cur.bytes >= held_bytes // 4):
                yield cur.batch()
            if cur.done:
                order.remove(current)
                if not order:
                    return
                current = max(order, key=lambda tp: (parts[tp].done, parts[tp].bytes))
                if paused:
                    consumer.resume([tp for tp in paused if not parts[(tp.topic, tp.partition)].done])
                    paused = []
                continue
            held = sum(x.bytes for tp, x in parts.items() if tp != current)
            if held > held_bytes and not paused:
                paused = [TopicPartition(t, p) for (t, p) in order if (t, p) != current and not parts[(t, p)].done]
                if paused:
                    consumer.pause(paused)
            # As many records as a quarter of what may be held, by the records' average size so far. A call that
            # waits asks for one record: librdkafka's consume() waits for its full count or its timeout.
            want = 1 if not seen else max(1, min(CONSUME_BATCH, held_bytes // 4 * seen // seen_bytes))
            messages = consumer.consume(want, timeout=0) or consumer.consume(1, timeout=1.0)
            if messages:
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > stall:
                waiting = [f"{t}[{p}]" for (t, p) in order if not parts[(t, p)].done]
                raise RetryableError(f"Kafka gave no record of {', '.join(waiting[:10])} for {stall:.0f} s; the "
                                     "batch is planned again")
            for m in messages:  # per record: kept to plain calls (no typing.cast, no repeated lookups)
                error = m.error()
                x = parts.get((m.topic(), m.partition()))  # type: ignore[arg-type]
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        raise RetryableError(f"Kafka refused the read of {m.topic()}[{m.partition()}]: "
                                             f"{error.str()} (offsets the broker no longer holds are reported by "
                                             "the next plan)")
                    if x is not None and not x.done and m.offset() >= x.range.end:  # type: ignore[operator]
                        _finish(consumer, x)
                    continue
                if x is None or x.done:
                    continue
                offset: int = m.offset()  # type: ignore[assignment]
                end = x.range.end
                if offset >= end:
                    _finish(consumer, x)
                    continue
                x.messages.append(m)
                key = m.key()
                size = len(m) + (len(key) if key else 0) + 64  # value, key, and about what the rest of a record takes
                x.bytes += size
                seen += 1
                seen_bytes += size
                if offset >= end - 1:
                    _finish(consumer, x)
    except KafkaException as exc:
        raise RetryableError(f"Kafka failed the read: {exc}") from None
    finally:
        consumer.close()


def read_share(options: dict[str, Any], shares: Sequence[Sequence[PartitionRange]], held: int,
               index: int) -> Iterator[pa.RecordBatch]:
    """Task ``index``'s records: ``read_ranges`` of its share."""
    return read_ranges(options, shares[index], held)


def _finish(consumer: Consumer, x: _Partition) -> None:
    """The partition's range is read: stop fetching it."""
    x.done = True
    consumer.pause([TopicPartition(x.range.topic, x.range.partition)])
