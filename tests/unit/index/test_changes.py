"""The change feed: every command that adds or removes blocks records them with its entry's index, in the same
transaction; a rejected command records nothing; TrimBlockChanges forgets published rows. Applied twice, every
command leaves the same state."""

from __future__ import annotations

from pathlib import Path

from tests.factories import BASE_MS
from tests.unit.metastore.helpers import meta

from shale.index.changes import BlockChange, PendingChanges, published_through, read_changes
from shale.metastore.rules.commands import (
    AddBlocks,
    CommitIngestBatch,
    OffsetRange,
    ReplaceBlocks,
    Result,
    SetActiveGeneration,
    TrimBlockChanges,
    encode,
)
from shale.metastore.rules.fsm import Entry, StateMachine


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
    assert log.feed() == [  # the topic's first ingest commit records its generation as the active one
        BlockChange(1, "add", "acme", a.id), BlockChange(1, "add", "acme", b.id),
        BlockChange(1, "generations", "acme", "app"),
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


def test_one_row_per_run_of_one_tenant_and_every_change_read_back_in_order(tmp_path: Path) -> None:
    log = Log(tmp_path / "state.db")
    acme = [meta(start=i * 10, end=i * 10 + 10) for i in range(3)]
    beta = [meta(tenant="beta", start=i * 10, end=i * 10 + 10) for i in range(2)]
    mixed = [acme[0], acme[1], beta[0], acme[2], beta[1]]
    assert log.apply(AddBlocks(blocks=mixed)).ok
    assert log.feed() == [BlockChange(1, "add", m.tenant, m.id) for m in mixed]
    rows = log.sm.reader.conn.execute("SELECT tenant, subject FROM block_changes ORDER BY idx, seq").fetchall()
    assert rows == [("acme", f"{acme[0].id},{acme[1].id}"), ("beta", beta[0].id), ("acme", acme[2].id),
                    ("beta", beta[1].id)]


def test_blocks_already_present_are_not_recorded_again(tmp_path: Path) -> None:
    # The second AddBlocks hits a present block: its savepoint is rolled back and only the new blocks are recorded.
    log = Log(tmp_path / "state.db")
    a, b, c = (meta(start=i * 10, end=i * 10 + 10) for i in range(3))
    assert log.apply(AddBlocks(blocks=[a])).ok
    assert log.apply(AddBlocks(blocks=[b, a, c])).data["added"] == [b.id, c.id]
    assert log.feed() == [BlockChange(1, "add", "acme", a.id), BlockChange(2, "add", "acme", b.id),
                          BlockChange(2, "add", "acme", c.id)]


def test_a_generation_change_is_never_split(tmp_path: Path) -> None:
    log = Log(tmp_path / "state.db")
    for topic in ("a,b", "c"):
        assert log.apply(SetActiveGeneration(tenant="acme", topic=topic, generation=2, start=0, end=BASE_MS)).ok
    assert log.feed() == [BlockChange(1, "generations", "acme", "a,b"), BlockChange(2, "generations", "acme", "c")]


def test_rows_of_one_block_each_read_the_same(tmp_path: Path) -> None:
    # Schema version 2 wrote one row per block; such rows stay readable after the upgrade.
    log = Log(tmp_path / "state.db")
    a, b = meta(start=0, end=10), meta(start=10, end=20)
    log.sm.conn.executemany("INSERT INTO block_changes (idx, seq, change, tenant, subject) VALUES (?, ?, ?, ?, ?)",
                            [(1, 0, "add", "acme", a.id), (1, 1, "add", "acme", b.id), (2, 0, "remove", "acme", a.id)])
    assert log.feed() == [BlockChange(1, "add", "acme", a.id), BlockChange(1, "add", "acme", b.id),
                          BlockChange(2, "remove", "acme", a.id)]


def test_pending_changes_forget_what_a_rolled_back_savepoint_did_mid_run(tmp_path: Path) -> None:
    log = Log(tmp_path / "state.db")
    pending = PendingChanges()
    pending.record("add", "acme", "A")
    mark = pending.mark()
    pending.record("add", "acme", "B")  # extends the run the mark is inside
    pending.record("remove", "acme", "C")
    pending.forget_since(mark)
    pending.record("add", "beta", "D")
    pending.flush(log.sm.conn, 9)
    assert read_changes(log.sm.conn, 0, 9) == [BlockChange(9, "add", "acme", "A"), BlockChange(9, "add", "beta", "D")]
    pending.forget_since((0, 0))  # nothing left to forget after a flush
    pending.flush(log.sm.conn, 10)
    assert [c.index for c in read_changes(log.sm.conn, 0, 99)] == [9, 9]
