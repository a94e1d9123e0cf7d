"""The change feed: every command that adds or removes blocks records them with its entry's index, in the same
transaction; a rejected command records nothing; TrimBlockChanges forgets published rows. Applied twice, every
command leaves the same state."""

from __future__ import annotations

from pathlib import Path

from tests.factories import BASE_MS
from tests.unit.metastore.helpers import meta

from shale.index.changes import BlockChange, published_through, read_changes
from shale.metastore.commands import (
    AddBlocks,
    CommitIngestBatch,
    OffsetRange,
    ReplaceBlocks,
    Result,
    SetActiveGeneration,
    TrimBlockChanges,
    encode,
)
from shale.metastore.fsm import Entry, StateMachine


class Log:
    def __init__(self, path: Path) -> None:
        self.sm = StateMachine(path)
        self.index = 0

    def apply(self, command: object) -> Result:
        self.index += 1
        return self.sm.apply(Entry(self.index, 1, BASE_MS + self.index), encode(command))  # type: ignore[arg-type]

    def feed(self) -> list[BlockChange]:
        return read_changes(self.sm.reader.conn, 0, 2**62)


def test_each_change_is_recorded_with_its_entry(tmp_path: Path) -> None:
    log = Log(tmp_path / "state.db")
    a, b = meta(group="partition", start=0, end=10), meta(group="partition", start=10, end=20)
    assert log.apply(CommitIngestBatch(group="partition", ranges=[OffsetRange(topic="app", partition=0, start=0,
                                                                              end=20)], blocks=[a, b])).ok
    merged = meta(group="partition", start=0, end=20, level=1, key="merged", sources=[a.id, b.id])
    assert log.apply(ReplaceBlocks(tenant="acme", sources=[a.id, b.id], blocks=[merged])).ok
    assert log.apply(SetActiveGeneration(tenant="acme", topic="app", generation=2, start=0, end=BASE_MS)).ok
    assert log.apply(AddBlocks(blocks=[a])).data["rejected"] == [a.id]  # tombstoned: refused, nothing recorded
    assert log.feed() == [
        BlockChange(1, "add", "acme", a.id), BlockChange(1, "add", "acme", b.id),
        BlockChange(2, "remove", "acme", a.id), BlockChange(2, "remove", "acme", b.id),
        BlockChange(2, "add", "acme", merged.id), BlockChange(3, "generations", "acme", "app")]


def test_a_rejected_command_records_nothing(tmp_path: Path) -> None:
    log = Log(tmp_path / "state.db")
    a = meta(group="partition")
    result = log.apply(ReplaceBlocks(tenant="acme", sources=["01J0000000000000000000000X"], blocks=[a]))
    assert not result.ok
    assert log.feed() == []


def test_trim_forgets_published_changes_and_is_idempotent(tmp_path: Path) -> None:
    log = Log(tmp_path / "state.db")
    for i in range(3):
        assert log.apply(AddBlocks(blocks=[meta(start=i * 10, end=i * 10 + 10)])).ok
    assert log.apply(TrimBlockChanges(through=2)).data == {"trimmed": 2}
    before = log.sm.reader.state_hash(with_applied=False)
    assert log.apply(TrimBlockChanges(through=2)).data == {"trimmed": 0}
    assert log.sm.reader.state_hash(with_applied=False) == before
    assert [c.index for c in log.feed()] == [3]
    assert published_through(log.sm.reader.conn) == 2
    assert log.apply(TrimBlockChanges(through=99)).ok  # never past the entry itself
    assert published_through(log.sm.reader.conn) == 5
