"""A restore task (one per source partition, on a Spark executor): resume after the committed progress, read the
partition's backup rows in source offset order and send them to the target topic in Kafka transactions, each
carrying the progress record that covers it.

A transaction ends every ``commit_every`` records and at the end of each block's rows, so none stays open across a
read from the bucket. A gap, a corrupt block or a record the target refuses ends the partition with an error that
names the block and the offsets; the transactions before it are committed, the one it was in is aborted.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa
from confluent_kafka import KafkaError, KafkaException, Message, Producer
from pydantic import TypeAdapter

from shale.block import BlockMeta, backup_rows
from shale.config import BucketConfig
from shale.errors import ShaleError
from shale.failpoints import failpoint
from shale.objstore import task_bucket
from shale.restore.partitioner import PartitionMapping
from shale.restore.progress import (
    PROGRESS_TOPIC,
    progress_key,
    progress_value,
    read_progress,
    transactional_id,
)


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


@dataclass
class PartitionOutcome:
    partition: int
    next: int
    restored: int
    sent_now: int
    error: str = ""


_WORK = TypeAdapter(PartitionWork)


def encode_work(work: PartitionWork) -> str:
    return _WORK.dump_json(work).decode()


def decode_work(text: str) -> PartitionWork:
    return _WORK.validate_json(text)


MAX_RECORD_BYTES = 64 << 20
"""The producer's own size limit, above any broker's usual one: the target topic's ``max.message.bytes`` decides."""


class PartitionStoppedError(ShaleError):
    """One partition cannot go on; the others are not affected."""


def partition_rows(bucket_config: BucketConfig, work: PartitionWork, start: int
                   ) -> Iterator[tuple[str, pa.Table]]:
    """(block id, rows of the partition from ``start`` in offset order) per interval, checked against the block's
    metadata: offsets inside the interval, strictly increasing, never repeated."""
    bucket = task_bucket(bucket_config)
    for lo, hi, meta in work.intervals:
        if hi <= start or lo >= work.end:
            continue
        first, last = max(lo, start), min(hi, work.end)
        try:
            tables = backup_rows(bucket, meta, work.topic, work.partition, first, last)
        except ShaleError as exc:
            raise PartitionStoppedError(f"partition {work.partition}: block {meta.id} holding offsets [{lo}, {hi}) "
                                        f"cannot be read: {exc}") from exc
        if not tables:
            continue
        table = pa.concat_tables(tables).sort_by([("offset", "ascending")])
        offsets = table.column("offset").to_pylist()
        if any(b <= a for a, b in itertools.pairwise(offsets)):
            raise PartitionStoppedError(f"partition {work.partition}: block {meta.id} holds offsets of "
                                        f"[{first}, {last}) more than once: the block is corrupt; nothing of it "
                                        "was sent")
        yield meta.id, table


def run_partition(work_json: str, client: dict[str, Any], bucket_config: BucketConfig) -> str:
    """A Spark task: restore one source partition, resuming after its committed progress. Returns the
    ``PartitionOutcome`` as JSON."""
    work = decode_work(work_json)
    producer = Producer({"enable.idempotence": True, "acks": "all", "linger.ms": 20, "transaction.timeout.ms": 60_000,
                         "message.max.bytes": MAX_RECORD_BYTES, **client,
                         "transactional.id": transactional_id(work.job, work.partition)})
    producer.init_transactions(60)  # fences every older producer of this partition, aborts its open transaction
    next_offset, restored = read_progress(client, work.job).get(work.partition, (work.start, 0))
    outcome = PartitionOutcome(work.partition, next_offset, restored, 0)
    try:
        _send(producer, work, bucket_config, outcome)
        if work.stop_error and outcome.next >= work.end:
            outcome.error = work.stop_error
    except PartitionStoppedError as exc:
        outcome.error = str(exc)
    except KafkaException as exc:  # fenced by a newer attempt, or the target cluster failed the transaction
        outcome.error = (f"partition {work.partition}: Kafka ended the transaction: {exc}; committed up to source "
                         f"offset {outcome.next - 1}; run the restore again to resume")
    return json.dumps(asdict(outcome))


def _send(producer: Producer, work: PartitionWork, bucket_config: BucketConfig, outcome: PartitionOutcome) -> None:
    mapping = PartitionMapping(work.source_partitions, work.target_partitions)
    until_us = None if work.until_ms is None else work.until_ms * 1000
    failures: list[str] = []

    def delivered(error: KafkaError | None, message: Message) -> None:
        if error is not None and len(failures) < 3:
            failures.append(f"{error.str()} (target partition {message.partition()})")

    def commit(last_offset: int, count: int) -> None:
        producer.produce(PROGRESS_TOPIC, key=progress_key(work.job, work.partition),
                         value=progress_value(last_offset + 1, outcome.restored + count), on_delivery=delivered)
        producer.flush(120)
        if failures:
            producer.abort_transaction(60)
            raise PartitionStoppedError(f"partition {work.partition}: the target refused a record at or before source "
                                        f"offset {last_offset}: {'; '.join(failures)}; nothing after offset "
                                        f"{outcome.next - 1} was committed")
        if outcome.sent_now:
            failpoint("restore.before-commit")
        producer.commit_transaction(120)
        outcome.next, outcome.restored, outcome.sent_now = last_offset + 1, outcome.restored + count, \
            outcome.sent_now + count

    for block, table in partition_rows(bucket_config, work, outcome.next):
        stamps = table.column("timestamp").cast(pa.int64()).to_pylist()  # microseconds
        keys, values = table.column("key").to_pylist(), table.column("value").to_pylist()
        headers, offsets = table.column("headers").to_pylist(), table.column("offset").to_pylist()
        count, last = 0, -1
        producer.begin_transaction()
        for i, offset in enumerate(offsets):
            if until_us is not None and stamps[i] >= until_us:
                if count:
                    commit(last, count)
                else:
                    producer.abort_transaction(60)
                outcome.next = work.end  # the point in time is reached: the partition is done
                return
            record = {"value": values[i], "key": keys[i], "partition": mapping.target(work.partition, keys[i]),
                      "timestamp": stamps[i] // 1000, "headers": [(h["key"], h["value"]) for h in headers[i] or []],
                      "on_delivery": delivered}
            while True:
                try:
                    producer.produce(work.target_topic, **record)
                    break
                except BufferError:
                    producer.poll(0.5)  # the local queue is full: let deliveries drain it
                except KafkaException as exc:
                    producer.abort_transaction(60)
                    raise PartitionStoppedError(f"partition {work.partition}: block {block}: source offset {offset} "
                                                f"cannot be sent: {exc}; nothing after offset {outcome.next - 1} was "
                                                "committed") from exc
            producer.poll(0)
            count, last = count + 1, offset
            if outcome.sent_now and count == max(1, work.commit_every // 2):
                failpoint("restore.mid-transaction")
            if count >= work.commit_every:
                commit(last, count)
                count = 0
                producer.begin_transaction()
        if count:
            commit(last, count)
        else:
            producer.abort_transaction(60)
    outcome.next = max(outcome.next, work.end)
