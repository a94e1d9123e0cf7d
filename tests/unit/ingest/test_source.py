"""An ingest task's Kafka read (``shale.ingest.source``) against a model of librdkafka's consumer: whatever order the
consumer interleaves partitions in, whichever offsets hold no record (markers, aborted or compacted records), and
however little the task may hold, every record of the planned ranges is handed on exactly once, each partition's
in one run in offset order, nothing outside them, and no record waits out the consumer's timeout. The real
consumer is exercised by the integration tests (transactions, compacted topics, secured brokers)."""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    TIMESTAMP_NOT_AVAILABLE,
    KafkaError,
    TopicPartition,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from shale.errors import RetryableError
from shale.ingest import source
from shale.ingest.plan import PartitionRange


class _Error:
    def __init__(self, code: int) -> None:
        self._code = code

    def code(self) -> int:
        return self._code

    def str(self) -> str:
        return f"error {self._code}"


class _Message:
    def __init__(self, topic: str, partition: int, offset: int, error: _Error | None = None) -> None:
        self._t, self._p, self._o, self._e = topic, partition, offset, error

    def topic(self) -> str:
        return self._t

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o

    def error(self) -> _Error | None:
        return self._e

    def timestamp(self) -> tuple[int, int]:
        """Create time mostly, log-append time every seventh record, none every eleventh (librdkafka's -1)."""
        if self._o % 11 == 10:
            return TIMESTAMP_NOT_AVAILABLE, -1
        return (TIMESTAMP_LOG_APPEND_TIME if self._o % 7 == 6 else TIMESTAMP_CREATE_TIME), 1_700_000_000_000 + self._o

    def key(self) -> bytes | None:
        return None if self._o % 3 else b"k%d" % self._o

    def value(self) -> bytes:
        return b"v%d" % self._o * 10

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        return [("h", b"%d" % self._o)] if self._o % 5 == 0 else None

    def __len__(self) -> int:
        return len(self.value())


class _Consumer:
    """librdkafka's consumer as the read uses it: each assigned, unpaused partition delivers its next records in
    fetches of a few records, partitions interleaved in a random order, and a partition-end event each time a
    partition reaches its log end, and, like librdkafka's, a call with a timeout that returns fewer records than it
    asked for has waited out its timeout (counted in ``sat``). ``logs`` holds each partition's offsets that have a
    record, and its end."""

    logs: dict[tuple[str, int], tuple[list[int], int]] = {}
    rng = random.Random(0)
    opened: list[_Consumer] = []

    def __init__(self, options: dict[str, Any]) -> None:
        self.options = options
        self.position: dict[tuple[str, int], int] = {}
        self.paused: set[tuple[str, int]] = set()
        self.at_end: set[tuple[str, int]] = set()
        self.closed = False
        self.queue: list[_Message] = []
        self.sat = 0
        _Consumer.opened.append(self)

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.position = {(tp.topic, tp.partition): tp.offset for tp in partitions}

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.paused |= {(tp.topic, tp.partition) for tp in partitions}

    def resume(self, partitions: list[TopicPartition]) -> None:
        self.paused -= {(tp.topic, tp.partition) for tp in partitions}

    def close(self) -> None:
        self.closed = True

    def consume(self, num_messages: int, timeout: float) -> list[_Message]:
        # What was fetched and not returned yet comes first (a paused partition's included, as librdkafka may).
        out, self.queue = self.queue[:num_messages], self.queue[num_messages:]
        if out:
            return out
        live = [tp for tp in self.position if tp not in self.paused]
        self.rng.shuffle(live)
        for tp in live:
            offsets, end = self.logs[tp]
            at = self.position[tp]
            fetched = [o for o in offsets if o >= at][:self.rng.randint(1, 4)]
            out += [_Message(*tp, o) for o in fetched]
            if fetched:
                self.position[tp] = fetched[-1] + 1
            elif tp not in self.at_end:
                self.position[tp] = end  # offsets without records up to the end are skipped
                self.at_end.add(tp)
                out.append(_Message(*tp, end, _Error(KafkaError._PARTITION_EOF)))
        out, self.queue = out[:num_messages], out[num_messages:]
        if out and len(out) < num_messages and timeout > 0:
            self.sat += 1  # librdkafka would have held these records back for the whole timeout
        return out


@st.composite
def _logs(draw: st.DrawFn) -> tuple[dict[tuple[str, int], tuple[list[int], int]], list[PartitionRange]]:
    logs, ranges = {}, []
    for partition in range(draw(st.integers(1, 6))):
        end = draw(st.integers(0, 60))
        offsets = sorted(draw(st.sets(st.integers(0, max(0, end - 1)), max_size=end)))
        start = draw(st.integers(0, end))
        stop = draw(st.integers(start, end))
        logs[("t", partition)] = (offsets, end)
        ranges.append(PartitionRange("t", partition, "inc", start, stop))
    return logs, ranges


def _read(monkeypatch: pytest.MonkeyPatch, logs: dict[tuple[str, int], tuple[list[int], int]],
          ranges: list[PartitionRange], held: int, seed: int) -> list[pa.RecordBatch]:
    _Consumer.logs, _Consumer.rng, _Consumer.opened = logs, random.Random(seed), []
    monkeypatch.setattr(source, "Consumer", _Consumer)
    monkeypatch.setattr(source, "RUN_ROWS", 7)
    return list(source.read_ranges({}, ranges, held))


@settings(max_examples=150, deadline=None)
@given(_logs(), st.sampled_from([0, 200, 10**9]), st.integers(0, 2**16))
def test_every_planned_record_is_handed_on_once_in_partition_runs_whatever_the_interleaving(
        case: tuple[dict[tuple[str, int], tuple[list[int], int]], list[PartitionRange]], held: int, seed: int) -> None:
    logs, ranges = case
    with pytest.MonkeyPatch.context() as monkeypatch:
        batches = _read(monkeypatch, logs, ranges, held, seed)
    runs: list[tuple[str, int]] = []
    got: dict[tuple[str, int], list[int]] = {}
    for batch in batches:
        assert batch.schema == source.COLUMNS
        [tp] = {(t, p) for t, p in zip(batch.column("topic").to_pylist(), batch.column("partition").to_pylist(),
                                        strict=True)}
        if not runs or runs[-1] != tp:
            runs.append(tp)
        got.setdefault(tp, []).extend(batch.column("offset").to_pylist())
        for row in batch.to_pylist():
            o = row["offset"]
            assert row["value"] == b"v%d" % o * 10
            assert row["key"] == (None if o % 3 else b"k%d" % o)
            assert row["headers"] == ([{"key": "h", "value": b"%d" % o}] if o % 5 == 0 else None)
            kind, at = _Message(tp[0], tp[1], o).timestamp()
            assert row["timestampType"] == {TIMESTAMP_NOT_AVAILABLE: -1, TIMESTAMP_CREATE_TIME: 0,
                                            TIMESTAMP_LOG_APPEND_TIME: 1}[kind]
            assert row["timestamp"] == (None if kind == TIMESTAMP_NOT_AVAILABLE
                                        else dt.datetime.fromtimestamp(at / 1000, dt.UTC))
    assert len(runs) == len(set(runs)), f"a partition was handed on in more than one run: {runs}"
    expected = {(r.topic, r.partition): [o for o in logs[(r.topic, r.partition)][0] if r.start <= o < r.end]
                for r in ranges}
    assert got == {tp: offsets for tp, offsets in expected.items() if offsets}
    assert all(c.closed for c in _Consumer.opened)
    assert not any(c.sat for c in _Consumer.opened), "the read waited out a timeout on records it could hand on"


def test_a_read_that_gets_no_record_fails_so_that_the_batch_is_planned_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # The log ends below the planned end (a range the broker no longer serves): no record, no end reached.
    logs = {("t", 0): ([0, 1], 2)}
    _Consumer.logs, _Consumer.opened = logs, []
    monkeypatch.setattr(source, "Consumer", _Consumer)
    reader: Iterator[pa.RecordBatch] = source.read_ranges({}, [PartitionRange("t", 0, "inc", 0, 5)], 10**9, stall=0.0)
    with pytest.raises(RetryableError, match=r"t\[0\]"):
        list(reader)
    assert _Consumer.opened[0].closed


def test_tasks_share_the_ranges_evenly_and_the_same_way_every_time() -> None:
    ranges = [PartitionRange("t", p, "inc", 0, size) for p, size in enumerate([100, 5, 60, 50, 1, 40])]
    shares = source.assign_tasks(ranges, 2)
    assert sorted(r.partition for share in shares for r in share) == list(range(6))
    sizes = [sum(r.end - r.start for r in share) for share in shares]
    assert max(sizes) - min(sizes) <= 100  # never more apart than the largest range
    assert shares == source.assign_tasks(list(reversed(ranges)), 2)
    assert len(source.assign_tasks(ranges[:1], 4)) == 1  # no empty task
