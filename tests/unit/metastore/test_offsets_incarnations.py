"""Committed offsets per topic incarnation: recreated topics, stale batches, one writer kind per generation,
skipped offsets, acknowledged losses, and the migration of a version-1 index. Every command is applied twice."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from tests.factories import BASE_MS
from tests.unit.metastore.helpers import meta

from shale.block import KafkaRange
from shale.index import connect, create
from shale.index.schema import SCHEMA_VERSION
from shale.metastore.rules.commands import AcknowledgeOffsetLoss, CommitIngestBatch, OffsetRange, Result, encode
from shale.metastore.rules.fsm import Entry, StateMachine

OLD, NEW = "AAAAAAAAAAAAAAAAAAAAAA", "BBBBBBBBBBBBBBBBBBBBBB"


class Log:
    def __init__(self, path: Path) -> None:
        self.sm = StateMachine(path)
        self.index = 0

    def apply(self, command: object) -> Result:
        self.index += 1
        return self.sm.apply(Entry(self.index, 1, BASE_MS + self.index), encode(command))  # type: ignore[arg-type]

    def twice(self, command: object) -> tuple[Result, Result]:
        first, hash1 = self.apply(command), self.sm.reader.state_hash(with_applied=False)
        second, hash2 = self.apply(command), self.sm.reader.state_hash(with_applied=False)
        assert hash1 == hash2
        return first, second

    def offsets(self) -> dict[tuple[str, int], tuple[int, str, str, int]]:
        return {(o.topic, o.partition): (o.committed_end, o.incarnation, o.writer, o.skipped)
                for o in self.sm.reader.offsets("backup", 1)}


@pytest.fixture
def log(tmp_path: Path) -> Log:
    return Log(tmp_path / "state.db")


def batch(start: int, end: int, incarnation: str = OLD, stored: int | None = None, writer: str = "ingest",
          rows: int | None = None) -> CommitIngestBatch:
    block = meta(start=start, end=end, key=f"{incarnation}/{start}/{end}")
    block = block.model_copy(update={"kafka": [KafkaRange(topic="app", partition=0, start=start, end=end,
                                                          incarnation=incarnation)]})
    return CommitIngestBatch(group="backup", generation=1, writer=writer,  # type: ignore[arg-type]
                             ranges=[OffsetRange(topic="app", partition=0, start=start, end=end,
                                                 incarnation=incarnation, stored=stored)],
                             blocks=[block] if rows is None or rows else [])


def test_skipped_offsets_are_recorded_once(log: Log) -> None:
    first, second = log.twice(batch(0, 100, stored=90))
    assert first.ok
    assert first.data["replay"] is False
    assert second.ok
    assert second.data["replay"] is True
    assert log.offsets()[("app", 0)] == (100, OLD, "ingest", 10)


def test_recreated_topic_starts_a_new_incarnation_from_any_offset(log: Log) -> None:
    assert log.apply(batch(0, 500)).ok
    # The topic was deleted and recreated: its offsets restart at 0, below the old committed end.
    first, second = log.twice(batch(0, 40, incarnation=NEW))
    assert first.ok
    assert first.data["new_incarnations"] == ["app[0]"]
    assert second.ok
    assert second.data["replay"] is True
    assert log.offsets()[("app", 0)] == (40, NEW, "ingest", 0)
    [past] = log.sm.reader.incarnations("backup", 1)
    assert (past.incarnation, past.committed_end) == (OLD, 500)
    # The new incarnation continues as usual; a late batch read from the old topic can never be committed.
    assert log.apply(batch(40, 90, incarnation=NEW)).ok
    late = log.apply(batch(500, 600, incarnation=OLD))
    assert not late.ok
    assert late.reason == "stale-incarnation"
    assert log.offsets()[("app", 0)][0] == 90


def test_unrecorded_incarnation_is_adopted_and_matches(log: Log) -> None:
    assert log.apply(batch(0, 10, incarnation="")).ok
    assert log.apply(batch(10, 20, incarnation=OLD)).ok  # the first commit that knows the topic id adopts it
    assert log.offsets()[("app", 0)][1] == OLD
    assert log.apply(batch(20, 30, incarnation="")).ok  # a writer that does not know it still continues


def test_gap_and_overlap_within_an_incarnation_are_refused(log: Log) -> None:
    assert log.apply(batch(0, 100)).ok
    gap = log.apply(batch(120, 130))
    assert not gap.ok
    assert gap.reason == "offset-gap"
    assert "acknowledge-loss" in gap.message
    overlap = log.apply(batch(50, 130))
    assert not overlap.ok
    assert overlap.reason == "offset-overlap"
    assert log.offsets()[("app", 0)][0] == 100


def test_one_kind_of_writer_per_generation(log: Log) -> None:
    assert log.apply(batch(0, 100, writer="reprocess")).ok
    refused = log.apply(batch(100, 200, writer="ingest"))
    assert not refused.ok
    assert refused.reason == "generation-owned"
    assert log.offsets()[("app", 0)][:3] == (100, OLD, "reprocess")


def test_acknowledged_loss_moves_the_committed_end_once(log: Log) -> None:
    assert log.apply(batch(0, 100)).ok
    ack = AcknowledgeOffsetLoss(group="backup", generation=1, topic="app", partition=0, incarnation=OLD, start=100,
                                end=250, reason="retention deleted them")
    first, second = log.twice(ack)
    assert first.ok
    assert first.data == {"replay": False, "lost": 150}
    assert second.ok
    assert second.data["replay"] is True
    assert log.offsets()[("app", 0)][0] == 250
    [loss] = log.sm.reader.losses("backup", 1)
    assert (loss.start, loss.end, loss.reason) == (100, 250, "retention deleted them")
    assert log.apply(batch(250, 300)).ok
    moved = log.apply(ack.model_copy(update={"start": 300, "end": 400}).model_copy(update={"start": 299}))
    assert not moved.ok
    assert moved.reason == "offset-moved"


def test_loss_of_an_uncommitted_partition_is_refused(log: Log) -> None:
    result = log.apply(AcknowledgeOffsetLoss(group="backup", generation=1, topic="app", partition=3, start=0, end=5))
    assert not result.ok
    assert result.reason == "no-offsets"


def test_version_1_index_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    conn = sqlite3.connect(path)
    conn.executescript("""
        CREATE TABLE state (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
        INSERT INTO state VALUES ('schema_version', 1), ('applied_index', 7), ('applied_term', 1);
        CREATE TABLE offsets (grp TEXT NOT NULL, generation INTEGER NOT NULL, topic TEXT NOT NULL,
            partition INTEGER NOT NULL, committed_end INTEGER NOT NULL, max_event_time INTEGER NOT NULL,
            updated_at INTEGER NOT NULL, PRIMARY KEY (grp, generation, topic, partition)) WITHOUT ROWID;
        CREATE TABLE commits (grp TEXT NOT NULL, generation INTEGER NOT NULL, topic TEXT NOT NULL,
            partition INTEGER NOT NULL, start INTEGER NOT NULL, "end" INTEGER NOT NULL, digest TEXT NOT NULL,
            committed_at INTEGER NOT NULL, PRIMARY KEY (grp, generation, topic, partition, start)) WITHOUT ROWID;
        INSERT INTO offsets VALUES ('backup', 1, 'app', 0, 100, 5, 6);
        INSERT INTO commits VALUES ('backup', 1, 'app', 0, 0, 100, 'd', 6);
    """)
    conn.close()
    migrated = connect(str(path))
    create(migrated)
    assert migrated.execute("SELECT value FROM state WHERE key = 'schema_version'").fetchone()[0] == SCHEMA_VERSION
    assert migrated.execute("SELECT committed_end, incarnation, writer, skipped FROM offsets").fetchall() == [
        (100, "", "", 0)]
    assert migrated.execute("SELECT incarnation, start, \"end\" FROM commits").fetchall() == [("", 0, 100)]
    migrated.close()
    sm = StateMachine(path)
    assert sm.applied() == (7, 1)
    result = sm.apply(Entry(8, 1, BASE_MS), encode(batch(100, 150)))
    assert result.ok
    assert [(o.committed_end, o.incarnation) for o in sm.reader.offsets()] == [(150, OLD)]
