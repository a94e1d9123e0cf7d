"""A restore task (one per source partition, on a Spark executor): resume after the committed progress, read the
partition's backup rows of the restored incarnation in source offset order and send them to the target topic in
Kafka transactions, each carrying the progress record that covers it and an anchor: where in the target its records
landed (``shale.restore.offsets`` translates consumer group positions by it). Reaching the ``--until`` stop point
ends the partition cleanly.

A transaction ends every ``commit_every`` records and at the end of each block's rows, so none stays open across a
read from the bucket. A gap, a corrupt block or a record the target refuses ends the partition with an error that
names the block and the offsets; the transactions before it are committed, the one it was in is aborted.

A record larger than the target topic's ``max.message.bytes`` (its exact size as a batch of one, ``record_size``)
is found before it is sent: the records before it are committed and the partition stops there, naming it, unless
the restore was asked to dead-letter such records: then the record is written to the bucket
(``restore_dead_letter_key``) before the transaction that moves the progress past it commits.
"""

from __future__ import annotations

import base64
import itertools
import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import KafkaError, KafkaException, Message, Producer
from pydantic import TypeAdapter

from shale.block import BlockMeta, backup_rows, restore_dead_letter_key
from shale.config import BucketConfig
from shale.errors import ShaleError
from shale.failpoints import failpoint
from shale.objstore import task_bucket
from shale.restore.attribution import attribute
from shale.restore.partitioner import PartitionMapping
from shale.restore.progress import (
    PROGRESS_TOPIC,
    anchor_key,
    anchor_runs,
    anchor_value,
    progress_key,
    progress_value,
    read_progress,
    transactional_id,
    transactional_producer,
)
from shale.restore.throttle import RestoreLimits, Throttle


@dataclass(frozen=True)
class PartitionWork:
    """What crosses into a task (as JSON): one source partition's offsets ``[start, end)`` and the blocks that
    hold them, in offset order (a block may hold several intervals of the partition)."""

    job: str
    topic: str
    target_topic: str
    partition: int
    start: int
    end: int
    intervals: tuple[tuple[int, int, BlockMeta], ...]
    source_partitions: int
    target_partitions: int
    until_ms: int | None
    commit_every: int
    stop_error: str = ""
    """Why the partition stops at ``end`` (a gap), reported once the range before it is restored."""
    tenant: str = ""
    limits: RestoreLimits = field(default_factory=RestoreLimits)
    """This task's share of the job's throttle."""
    max_message_bytes: int = 0
    """The target topic's ``max.message.bytes`` (0: not known; the broker decides)."""
    dead_letter: bool = False
    """Write a record larger than ``max_message_bytes`` to the bucket and go on, instead of stopping there."""
    incarnation: str = ""
    """The topic incarnation restored: only its rows are read (``shale.restore.attribution``)."""


@dataclass
class PartitionOutcome:
    partition: int
    next: int
    restored: int
    sent_now: int
    error: str = ""
    dead_lettered: list[str] = field(default_factory=list)
    """The bucket keys of the records this run dead-lettered."""
    reached_until: bool = False
    """The partition reached its ``--until`` stop point: it is done, whatever the backup holds after it."""


_WORK = TypeAdapter(PartitionWork)


def encode_work(work: PartitionWork) -> str:
    return _WORK.dump_json(work).decode()


def decode_work(text: str) -> PartitionWork:
    return _WORK.validate_json(text)


MAX_RECORD_BYTES = 64 << 20
"""The producer's own size limit, above any broker's usual one: the target topic's ``max.message.bytes`` decides."""
BATCH_BYTES = 1_000_000
"""librdkafka's default ``batch.size``; lowered to the target's ``max.message.bytes`` when that is smaller, or a
batch of small records would be refused whole."""
RECORD_BATCH_OVERHEAD = 61
"""Bytes of a record batch's header (Kafka's v2 format), counted by the broker against ``max.message.bytes``."""
TRANSACTION_SECONDS = 10.0
"""A transaction ends after this long even short of ``commit_every`` records (a throttled restore), well inside the
producer's ``transaction.timeout.ms`` (60 s)."""
VARINTS_BOUND = 5 * 5
"""At most five bytes for each of a record's five varints other than the headers' (length, the two deltas, the key
and value lengths), one byte of attributes aside."""


def _varint_size(value: int) -> int:
    zigzag = (value << 1) ^ (value >> 63)
    size = 1
    while zigzag >= 0x80:
        zigzag >>= 7
        size += 1
    return size


def size_bound(table: pa.Table) -> int:
    """An upper bound of ``record_size`` over the rows of ``table`` (vectorized): the largest key and value plus
    every header of the table, as if one record held them all."""
    if table.num_rows == 0:
        return 0
    lengths = [pc.max(pc.binary_length(table.column(name))).as_py() or 0 for name in ("key", "value")]
    flat = pc.list_flatten(table.column("headers").combine_chunks())
    header_bytes = sum(pc.sum(pc.binary_length(flat.field(name))).as_py() or 0
                       for name in ("key", "value")) if len(flat) else 0
    most_headers = pc.max(pc.list_value_length(table.column("headers"))).as_py() or 0
    return (RECORD_BATCH_OVERHEAD + 1 + VARINTS_BOUND + sum(lengths) + header_bytes + 5 + 10 * most_headers)


def record_size(key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes | None]]) -> int:
    """The size the broker checks against ``max.message.bytes`` for this record sent alone, uncompressed: a v2
    record batch's header and the one record (its timestamp and offset deltas are 0)."""
    body = 1 + 1 + 1  # attributes, timestamp delta, offset delta
    for field_bytes in (key, value):
        body += _varint_size(-1) if field_bytes is None else _varint_size(len(field_bytes)) + len(field_bytes)
    body += _varint_size(len(headers))
    for name, data in headers:
        encoded = name.encode()
        body += _varint_size(len(encoded)) + len(encoded)
        body += _varint_size(-1) if data is None else _varint_size(len(data)) + len(data)
    return RECORD_BATCH_OVERHEAD + _varint_size(body) + body


class PartitionStoppedError(ShaleError):
    """One partition cannot go on; the others are not affected."""


def partition_rows(bucket_config: BucketConfig, work: PartitionWork, start: int
                   ) -> Iterator[tuple[str, pa.Table]]:
    """(block id, rows of the partition's incarnation from ``start`` in offset order) per interval, checked against
    the block's metadata: offsets inside the interval, strictly increasing, never repeated. A row its block cannot
    attribute to one incarnation stops the partition after the rows before it."""
    bucket = task_bucket(bucket_config)
    for lo, hi, meta in work.intervals:
        if hi <= start or lo >= work.end:
            continue
        first, last = max(lo, start), min(hi, work.end)
        try:
            tables = backup_rows(bucket, meta, work.topic, work.partition, first, last, incarnations=True)
        except ShaleError as exc:
            raise PartitionStoppedError(f"partition {work.partition}: block {meta.id} holding offsets [{lo}, {hi}) "
                                        f"cannot be read: {exc}") from exc
        if not tables:
            continue
        found = attribute(meta, pa.concat_tables(tables, promote_options="permissive"), work.topic, work.partition,
                          work.incarnation)
        table = found.rows.sort_by([("offset", "ascending")])
        offsets = table.column("offset").to_pylist()
        if any(b <= a for a, b in itertools.pairwise(offsets)):
            raise PartitionStoppedError(f"partition {work.partition}: block {meta.id} holds offsets of "
                                        f"[{first}, {last}) of incarnation {work.incarnation!r} more than once: the "
                                        "block is corrupt; nothing of it was sent")
        if found.ambiguous:
            stop = min(found.ambiguous)
            before = table.filter(pc.less(table.column("offset"), stop))
            if before.num_rows:
                yield meta.id, before
            raise PartitionStoppedError(
                f"partition {work.partition}: block {meta.id} holds offsets of both incarnation "
                f"{work.incarnation!r} and {', '.join(map(repr, found.others))} from offset {stop} (compacted from "
                "blocks of both topics) and its rows do not say whose they are: nothing from offset "
                f"{stop} on was sent. Restore the partition up to there (--offsets {work.partition}:START-{stop}), "
                "or restore it from the topic's other incarnation")
        yield meta.id, table


def run_partition(work_json: str, client: dict[str, Any], bucket_config: BucketConfig) -> str:
    """A Spark task: restore one source partition, resuming after its committed progress. Returns the
    ``PartitionOutcome`` as JSON."""
    work = decode_work(work_json)
    batch = min(BATCH_BYTES, work.max_message_bytes or BATCH_BYTES)
    # Fences every older producer of this partition and aborts its open transaction.
    producer = transactional_producer({
        "enable.idempotence": True, "acks": "all", "linger.ms": 20, "transaction.timeout.ms": 60_000,
        "message.max.bytes": MAX_RECORD_BYTES, "batch.size": batch, **client,
        "transactional.id": transactional_id(work.job, work.partition)})
    progress = read_progress(client, work.job).get(work.partition, (work.start, 0))
    return json.dumps(asdict(restore_partition(work, producer, progress, bucket_config)))


def restore_partition(work: PartitionWork, producer: Producer, progress: tuple[int, int],
                      bucket_config: BucketConfig) -> PartitionOutcome:
    """Restore one source partition with an initialized transactional ``producer`` from its committed
    ``progress`` (next source offset, records restored). A gap at ``work.end`` stops the partition only when its
    ``--until`` stop point was not reached before it."""
    outcome = PartitionOutcome(work.partition, progress[0], progress[1], 0)
    try:
        _send(producer, work, bucket_config, outcome)
        if work.stop_error and outcome.next >= work.end and not outcome.reached_until:
            outcome.error = f"{work.stop_error}; restored up to offset {outcome.next - 1}, nothing after it"
    except PartitionStoppedError as exc:
        outcome.error = str(exc)
    except KafkaException as exc:  # fenced by a newer attempt, or the target cluster failed the transaction
        outcome.error = (f"partition {work.partition}: Kafka ended the transaction: {exc}; committed up to source "
                         f"offset {outcome.next - 1}; run the restore again to resume")
    return outcome


def _send(producer: Producer, work: PartitionWork, bucket_config: BucketConfig, outcome: PartitionOutcome) -> None:
    mapping = PartitionMapping(work.source_partitions, work.target_partitions)
    until_us = None if work.until_ms is None else work.until_ms * 1000
    failures: list[str] = []
    # Where each record of the open transaction went: its source offset when sent, its target offset when
    # delivered (one target partition, so deliveries come in the order sent). Committed with the progress as the
    # transaction's anchor, which ``shale restore offsets`` translates by.
    anchored = not mapping.by_key
    sources: list[int] = []
    targets: list[int] = []

    def delivered(error: KafkaError | None, message: Message) -> None:
        if error is not None:
            if len(failures) < 3:
                failures.append(f"{error.str()} (target partition {message.partition()})")
        elif anchored and message.topic() == work.target_topic:
            targets.append(message.offset() or 0)

    def commit(last_offset: int, count: int) -> None:
        if anchored and sources:
            producer.flush(120)
            if not failures and len(targets) == len(sources):
                producer.produce(PROGRESS_TOPIC, key=anchor_key(work.job, work.partition, sources[0]),
                                 value=anchor_value(anchor_runs(sources, targets)), on_delivery=delivered)
        producer.produce(PROGRESS_TOPIC, key=progress_key(work.job, work.partition),
                         value=progress_value(last_offset + 1, outcome.restored + count), on_delivery=delivered)
        producer.flush(120)
        if failures or (anchored and len(targets) != len(sources)):
            producer.abort_transaction(60)
            raise PartitionStoppedError(f"partition {work.partition}: the target refused a record at or before source "
                                        f"offset {last_offset}: {'; '.join(failures) or 'no delivery report'}; "
                                        f"nothing after offset {outcome.next - 1} was committed")
        if outcome.sent_now:
            failpoint("restore.before-commit")
        producer.commit_transaction(120)
        sources.clear()
        targets.clear()
        outcome.next, outcome.restored, outcome.sent_now = last_offset + 1, outcome.restored + count, \
            outcome.sent_now + count

    def abort() -> None:
        producer.abort_transaction(60)
        sources.clear()
        targets.clear()

    throttle = Throttle(work.limits) if work.limits.limited else None
    same_partition = None if mapping.by_key else work.partition
    for block, table in partition_rows(bucket_config, work, outcome.next):
        stamps = table.column("timestamp").cast(pa.int64()).to_pylist()  # microseconds
        keys, values = table.column("key").to_pylist(), table.column("value").to_pylist()
        headers, offsets = table.column("headers").to_pylist(), table.column("offset").to_pylist()
        # A record's exact size is needed only to throttle bytes, or when the block may hold one over the limit.
        sizing = bool(work.limits.bytes_per_s) or bool(work.max_message_bytes and
                                                       size_bound(table) > work.max_message_bytes)
        count, last, opened = 0, -1, time.monotonic()
        producer.begin_transaction()
        for i, offset in enumerate(offsets):
            if until_us is not None and stamps[i] >= until_us:
                if count:
                    commit(last, count)
                else:
                    abort()
                # The point in time is reached: the partition is done, whatever the backup holds after it.
                outcome.next, outcome.reached_until = offset, True
                return
            record_headers = [(h["key"], h["value"]) for h in headers[i]] if headers[i] else None
            size = record_size(keys[i], values[i], record_headers or []) if sizing else 0
            if throttle is not None:
                throttle.take(1, size)
            if sizing and work.max_message_bytes and size > work.max_message_bytes:
                if not work.dead_letter:
                    if count:
                        commit(last, count)
                    else:
                        abort()
                    raise PartitionStoppedError(
                        f"partition {work.partition}: block {block}: source offset {offset} is {size} bytes, over the "
                        f"target topic's max.message.bytes ({work.max_message_bytes}); restored up to offset "
                        f"{outcome.next - 1}. Raise max.message.bytes on {work.target_topic} and run the restore "
                        "again, or pass --oversized dead-letter to keep such records in the bucket and go on")
                # The progress moves past it with this transaction, which counts it as restored.
                outcome.dead_lettered.append(_dead_letter(bucket_config, work, block, offset, size, keys[i],
                                                          values[i], record_headers or [], stamps[i]))
            else:
                partition = same_partition if same_partition is not None else mapping.target(work.partition,
                                                                                              keys[i])
                while True:
                    try:
                        # Positional (topic, value, key, partition, callback, on_delivery, timestamp, headers):
                        # no keyword dict per record in this loop.
                        producer.produce(work.target_topic, values[i], keys[i], partition, delivered, None,
                                         stamps[i] // 1000, record_headers)
                        break
                    except BufferError:
                        producer.poll(0.5)  # the local queue is full: let deliveries drain it
                    except KafkaException as exc:
                        abort()
                        raise PartitionStoppedError(
                            f"partition {work.partition}: block {block}: source offset {offset} cannot be sent: "
                            f"{exc}; nothing after offset {outcome.next - 1} was committed") from exc
                if anchored:
                    sources.append(offset)
                if i % 1000 == 0:
                    producer.poll(0)  # serve delivery callbacks now and then; flush serves the rest
            count, last = count + 1, offset
            if outcome.sent_now and count == max(1, work.commit_every // 2):
                failpoint("restore.mid-transaction")
            if count >= work.commit_every or time.monotonic() - opened >= TRANSACTION_SECONDS:
                commit(last, count)
                count, opened = 0, time.monotonic()
                producer.begin_transaction()
        if count:
            commit(last, count)
        else:
            abort()
    outcome.next = max(outcome.next, work.end)


def _dead_letter(bucket_config: BucketConfig, work: PartitionWork, block: str, offset: int, size: int,
                 key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes | None]],
                 timestamp_us: int) -> str:
    """Write one refused record, whole, to the bucket; return its key. Idempotent: a retried task writes the same
    object."""
    def b64(data: bytes | None) -> str | None:
        return None if data is None else base64.b64encode(data).decode()

    key_name = restore_dead_letter_key(work.tenant, work.job, work.partition, offset)
    # The source position in full (its incarnation too): an erasure decides by it whether the record is one of
    # its own (shale.erase.leftover), and deletes it (shale.erase.outside).
    body = {"job": work.job, "topic": work.topic, "incarnation": work.incarnation, "target_topic": work.target_topic,
            "partition": work.partition, "offset": offset, "block": block, "size": size,
            "max_message_bytes": work.max_message_bytes,
            "reason": "larger than the target topic's max.message.bytes", "timestamp_ms": timestamp_us // 1000,
            "key": b64(key), "value": b64(value), "headers": [[name, b64(data)] for name, data in headers]}
    task_bucket(bucket_config).put(key_name, json.dumps(body).encode())
    return key_name
