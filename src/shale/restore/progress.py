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
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from shale.errors import RetryableError

log = logging.getLogger(__name__)

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


Run = tuple[int, int, int]
"""(source offset, target offset, records): records sent one after the other from ``source offset`` on (the
restored records of the source partition, in offset order) that landed at consecutive target offsets from
``target offset`` on."""


def anchor_key(job: str, partition: int, first_source: int) -> bytes:
    """The key of one transaction's anchor: its own key (never compacted away by a later transaction's)."""
    return f"{job}/{partition}/{first_source}".encode()


def anchor_value(runs: Sequence[Run]) -> bytes:
    return json.dumps({"runs": [list(run) for run in runs]}).encode()


def anchor_runs(sources: Sequence[int], targets: Sequence[int]) -> list[Run]:
    """The runs of one transaction from each sent record's source and target offsets, in the order sent. Another
    producer writing into the target partition meanwhile starts a new run."""
    runs: list[Run] = []
    for source, target in zip(sources, targets, strict=True):
        if runs and runs[-1][1] + runs[-1][2] == target:
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((source, target, 1))
    return runs


def parse_anchor(key: bytes | None, value: bytes | None, job: str) -> tuple[int, list[Run]] | None:
    """``(partition, runs)`` of one anchor record of ``job``, else None."""
    if key is None or value is None:
        return None
    parts = key.decode(errors="replace").rsplit("/", 2)
    if len(parts) != 3 or parts[0] != job or not parts[1].isdigit() or not parts[2].isdigit():
        return None
    return int(parts[1]), [(int(a), int(b), int(c)) for a, b, c in json.loads(value)["runs"]]


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


def transactional_producer(settings: Mapping[str, Any]) -> Producer:
    """A producer with ``transactional.id`` in ``settings``, initialized: ``init_transactions`` aborts the open
    transaction of an older producer of the id and fences it. The cluster's metadata is read first: asked before
    the producer is connected, librdkafka retries its coordinator request 500 ms later (measured: 0.5 s in most
    of a restore's inits, 60 ms with the metadata first, which takes about 55 ms)."""
    producer = Producer(dict(settings))
    producer.list_topics(timeout=30)
    producer.init_transactions(60)
    return producer


def fence(client: Mapping[str, Any], job: str, partitions: Iterable[int]) -> None:
    """``init_transactions`` for each partition's transactional id: aborts a killed run's open transactions and
    fences its zombies, so that the progress read next is final."""
    def one(partition: int) -> None:
        transactional_producer({**client, "transactional.id": transactional_id(job, partition)}).flush(10)

    with ThreadPoolExecutor(max_workers=8, thread_name_prefix="restore-fence") as pool:
        list(pool.map(one, partitions))  # each is a round trip to the coordinator: side by side


def read_progress(client: Mapping[str, Any], job: str, timeout: float = READ_TIMEOUT_S
                  ) -> dict[int, tuple[int, int]]:
    """Per source partition of ``job``: (next source offset, records restored so far), as committed."""
    found: dict[int, tuple[int, int]] = {}
    for key, value in _read_committed(client, job, timeout):
        parsed = parse_progress(key, value, job)
        if parsed is not None:
            found[parsed[0]] = parsed[1:]
    return found


def read_anchors(client: Mapping[str, Any], job: str, timeout: float = READ_TIMEOUT_S) -> dict[int, list[Run]]:
    """Per source partition of ``job``: the runs of its committed transactions, in source offset order."""
    found: dict[int, dict[int, list[Run]]] = {}
    for key, value in _read_committed(client, job, timeout):
        parsed = parse_anchor(key, value, job)
        if parsed is not None and parsed[1]:
            found.setdefault(parsed[0], {})[parsed[1][0][0]] = parsed[1]
    return {p: [run for first in sorted(runs) for run in runs[first]] for p, runs in found.items()}


def _read_committed(client: Mapping[str, Any], job: str, timeout: float) -> list[tuple[bytes | None, bytes | None]]:
    """The progress topic's committed records (key, value), read to the log end seen first."""
    # The topic's last offset is a transaction's commit marker, never a message: the read ends at the partition's
    # end, which a fetch reports only after fetch.wait.max.ms (500 ms by default, paid by the driver and each task).
    settings = {**client, "group.id": f"shale-restore-reader-{job}", "enable.auto.commit": False,
                "enable.partition.eof": True, "auto.offset.reset": "earliest", "fetch.wait.max.ms": 10}
    # The log end of an uncommitted read (a read_committed one answers the last stable offset, which another
    # task's open transaction may hold below our last commit): every record our fenced ids wrote is below it.
    ends = Consumer({**settings, "isolation.level": "read_uncommitted"})
    try:
        low, high = ends.get_watermark_offsets(TopicPartition(PROGRESS_TOPIC, 0), timeout=30, cached=False)
    finally:
        ends.close()
    found: list[tuple[bytes | None, bytes | None]] = []
    prefix = f"{job}/".encode()
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
            key = message.key()
            if key is not None and key.startswith(prefix):
                found.append((key, message.value()))
            if (message.offset() or 0) + 1 >= high:
                return found
    finally:
        consumer.close()


class ProgressWatcher:
    """Follows the committed progress of ``job`` while its tasks run (a ``read_committed`` consumer of the progress
    topic in a thread of the driver) and calls ``report`` with the latest progress per partition every
    ``interval`` seconds and once at the end. What it reports is what the target topic holds: progress commits in
    the records' own transactions."""

    def __init__(self, client: Mapping[str, Any], job: str, report: Callable[[dict[int, tuple[int, int]]], None],
                 interval: float = 5.0) -> None:
        self.client, self.job, self.report, self.interval = client, job, report, interval
        self.found: dict[int, tuple[int, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"restore-progress-{job}", daemon=True)

    def __enter__(self) -> ProgressWatcher:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        consumer = Consumer({**self.client, "group.id": f"shale-restore-watch-{self.job}",
                             "enable.auto.commit": False, "isolation.level": "read_committed"})
        try:
            consumer.assign([TopicPartition(PROGRESS_TOPIC, 0, OFFSET_BEGINNING)])
            next_report = time.monotonic() + self.interval
            while not self._stop.is_set():
                message = consumer.poll(0.1)  # the job's end waits for this poll
                if message is not None and message.error() is None:
                    parsed = parse_progress(message.key(), message.value(), self.job)
                    if parsed is not None:
                        self.found[parsed[0]] = parsed[1:]
                if time.monotonic() >= next_report:
                    self.report(dict(self.found))
                    next_report = time.monotonic() + self.interval
        except KafkaException as exc:  # progress is for the eyes only: the restore goes on without it
            log.warning("restore progress unavailable", extra={"job": self.job, "error": str(exc)})
        finally:
            consumer.close()
            self._catch_up()
            self.report(dict(self.found))

    def _catch_up(self) -> None:
        """At the job's end, read the progress to the log end: the tasks' last transactions committed before it
        ended, but the poll loop may not have reached them yet (each transaction also carries its anchor)."""
        if not self._stop.is_set():
            return
        try:
            self.found.update(read_progress(self.client, self.job, timeout=30))
        except (KafkaException, RetryableError) as exc:
            log.warning("restore progress unavailable", extra={"job": self.job, "error": str(exc)})


@dataclass(frozen=True)
class ProgressLine:
    """What a progress report says: records restored of those planned, the rate since the start, an ETA."""

    restored: int
    planned: int
    per_second: float
    eta_seconds: float | None

    def text(self, job: str) -> str:
        share = f" ({100 * self.restored / self.planned:.0f}%)" if self.planned else ""
        eta = "ETA unknown" if self.eta_seconds is None else f"ETA {_duration(self.eta_seconds)}"
        return (f"restore {job}: {self.restored:,}/{self.planned:,} records{share}, "
                f"{self.per_second:,.0f} records/s, {eta}")


def progress_line(planned: Mapping[int, int], first: Mapping[int, tuple[int, int]],
                  now: Mapping[int, tuple[int, int]], elapsed: float) -> ProgressLine:
    """Pure: ``planned`` records per partition (an upper bound under --until), the progress seen when the run
    started (a resumed job has some) and now, and the seconds between."""
    restored = sum(min(planned.get(p, 0), now.get(p, (0, 0))[1]) for p in planned)
    sent = sum(now.get(p, (0, 0))[1] - first.get(p, (0, 0))[1] for p in planned)
    total = sum(planned.values())
    rate = sent / elapsed if elapsed > 0 else 0.0
    left = max(0, total - restored)
    eta = 0.0 if left == 0 else (left / rate if rate > 0 else None)
    return ProgressLine(restored, total, rate, eta)


def _duration(seconds: float) -> str:
    whole = int(seconds + 0.5)
    hours, rest = divmod(whole, 3600)
    return f"{hours}h{rest // 60:02d}m{rest % 60:02d}s" if hours else f"{rest // 60}m{rest % 60:02d}s"
