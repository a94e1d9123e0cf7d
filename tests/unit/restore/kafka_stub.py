"""An in-memory Kafka target for restore unit tests: partition logs with offsets, transactions (a commit or an
abort takes an offset of its own, as Kafka's markers do), a ``read_committed`` view, retention, and other
producers writing into a partition between the restore's records. ``StubProducer`` has the methods of
confluent_kafka's ``Producer`` that a restore task calls."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shale.restore.progress import PROGRESS_TOPIC, Run, parse_anchor, parse_progress

Callback = Callable[[Any, Any], None]


@dataclass
class Entry:
    offset: int
    key: bytes | None
    value: bytes | None
    state: str  # "open", "committed", "aborted", "marker"


@dataclass(frozen=True)
class StubMessage:
    _topic: str
    _partition: int
    _offset: int

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset


@dataclass
class StubKafka:
    logs: dict[tuple[str, int], list[Entry]] = field(default_factory=lambda: defaultdict(list))
    starts: dict[tuple[str, int], int] = field(default_factory=lambda: defaultdict(int))
    interleave: int = 0
    """Every ``interleave``-th record a transactional producer sends, another producer's record lands first."""
    sent: int = 0

    def end(self, topic: str, partition: int) -> int:
        log = self.logs[(topic, partition)]
        return log[-1].offset + 1 if log else self.starts[(topic, partition)]

    def append(self, topic: str, partition: int, key: bytes | None, value: bytes | None, state: str) -> int:
        offset = self.end(topic, partition)
        self.logs[(topic, partition)].append(Entry(offset, key, value, state))
        return offset

    def committed(self, topic: str, partition: int) -> list[Entry]:
        """What a ``read_committed`` consumer reads from the log start."""
        return [e for e in self.logs[(topic, partition)] if e.state == "committed"]

    def retain_from(self, topic: str, partition: int, offset: int) -> None:
        """Retention: every record below ``offset`` is deleted."""
        self.logs[(topic, partition)] = [e for e in self.logs[(topic, partition)] if e.offset >= offset]
        self.starts[(topic, partition)] = max(self.starts[(topic, partition)], offset)

    def progress(self, job: str) -> dict[int, tuple[int, int]]:
        found: dict[int, tuple[int, int]] = {}
        for e in self.committed(PROGRESS_TOPIC, 0):
            parsed = parse_progress(e.key, e.value, job)
            if parsed is not None:
                found[parsed[0]] = parsed[1:]
        return found

    def anchors(self, job: str) -> dict[int, list[Run]]:
        found: dict[int, dict[int, list[Run]]] = {}
        for e in self.committed(PROGRESS_TOPIC, 0):
            parsed = parse_anchor(e.key, e.value, job)
            if parsed is not None and parsed[1]:
                found.setdefault(parsed[0], {})[parsed[1][0][0]] = parsed[1]
        return {p: [run for first in sorted(runs) for run in runs[first]] for p, runs in found.items()}


class Killed(BaseException):
    """The task's process died (SIGKILL): nothing after it runs; the next producer of the id aborts what was open."""


class StubProducer:
    """A transactional producer of ``StubKafka``: records become visible to ``read_committed`` at the commit.
    ``kill_after``: the process dies when it sends that many records (``Killed``)."""

    def __init__(self, kafka: StubKafka, kill_after: int | None = None) -> None:
        self.kafka = kafka
        self.kill_after = kill_after
        self.open: list[tuple[str, int, Entry]] = []
        self.pending: list[tuple[Callback, StubMessage]] = []

    def begin_transaction(self) -> None:
        assert not self.open, "a transaction is open already"

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None, partition: int = 0,
                callback: Callback | None = None, on_delivery: Callback | None = None, timestamp: int = 0,
                headers: object = None) -> None:
        if topic != PROGRESS_TOPIC:
            if self.kill_after is not None:
                if self.kill_after == 0:
                    raise Killed
                self.kill_after -= 1
            self.kafka.sent += 1
            if self.kafka.interleave and self.kafka.sent % self.kafka.interleave == 0:
                self.kafka.append(topic, partition, b"other", b"another producer's record", "committed")
        offset = self.kafka.append(topic, partition, key, value, "open")
        entry = self.kafka.logs[(topic, partition)][-1]
        self.open.append((topic, partition, entry))
        report = on_delivery or callback
        if report is not None:
            self.pending.append((report, StubMessage(topic, partition, offset)))

    def poll(self, timeout: float = 0) -> int:
        return self.flush(timeout)

    def flush(self, timeout: float = 0) -> int:
        pending, self.pending = self.pending, []
        for report, message in pending:
            report(None, message)
        return 0

    def _end(self, state: str) -> None:
        self.flush()
        for _, _, entry in self.open:
            entry.state = state
        for topic, partition in {(t, p) for t, p, _ in self.open}:
            self.kafka.append(topic, partition, None, None, "marker")
        self.open = []

    def commit_transaction(self, timeout: float = 0) -> None:
        self._end("committed")

    def abort_transaction(self, timeout: float = 0) -> None:
        self._end("aborted")

    def fence(self) -> None:
        """What the next ``init_transactions`` of the id does to a dead producer: abort its open transaction
        (whose records were never delivered)."""
        self.pending = []
        self._end("aborted")
