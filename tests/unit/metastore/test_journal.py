"""The durable Raft journal: what survives a reopen, how a partly written tail is cut, pysyncobj's journal imported."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from pysyncobj.journal import FileJournal

from shale.metastore.raft.journal import MAGIC, DurableJournal

commands = st.lists(st.binary(max_size=40), min_size=1, max_size=12)


def _journal(directory: Path, entries: list[tuple[bytes, int, int]]) -> DurableJournal:
    journal = DurableJournal(directory / "raft.log")
    for entry in entries:
        journal.add(*entry)
    journal.sync()
    return journal


def _entries(payloads: list[bytes], first: int = 1, term: int = 1) -> list[tuple[bytes, int, int]]:
    return [(p, first + i, term) for i, p in enumerate(payloads)]


@settings(max_examples=60, deadline=None)
@given(payloads=commands, cut=st.integers(min_value=0), garbage=st.binary(max_size=30))
def test_a_torn_tail_is_cut_and_every_whole_record_before_it_is_kept(payloads: list[bytes], cut: int,
                                                                      garbage: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "raft.log"
        written = _journal(Path(tmp), _entries(payloads))
        ends = [*written.offsets[1:], written.end]
        written._destroy()
        data = path.read_bytes()
        cut = len(MAGIC) + cut % (len(data) - len(MAGIC) + 1)
        path.write_bytes(data[:cut] + garbage)

        reopened = DurableJournal(path)
        kept = len(reopened)
        # Every whole record is kept; past them only bytes that happen to repeat the written ones make a record.
        assert kept >= sum(1 for end in ends if end <= cut)
        assert list(reopened[:]) == _entries(payloads)[:kept]
        assert path.read_bytes() == data[:reopened.end]  # the tail is gone from the file too
        reopened.add(b"next", kept + 1, 1)
        reopened._destroy()
        assert list(DurableJournal(path)[:])[-1] == (b"next", kept + 1, 1)


def test_a_stale_record_behind_a_newer_one_is_cut(tmp_path: Path) -> None:
    """A truncation that did not reach the disk while the records written after it did: the old record after the
    new one has a lower term and is not read."""
    journal = _journal(tmp_path, _entries([b"x" * 8, b"old-2", b"old-3"], term=2))
    stale_tail = (tmp_path / "raft.log").read_bytes()[journal.offsets[2]:]
    journal.deleteEntriesFrom(1)
    journal.add(b"new-2", 2, 3)
    journal._destroy()
    path = tmp_path / "raft.log"
    path.write_bytes(path.read_bytes() + stale_tail)
    assert list(DurableJournal(path)[:]) == [(b"x" * 8, 1, 2), (b"new-2", 2, 3)]


def test_term_vote_and_compaction_survive_a_reopen(tmp_path: Path) -> None:
    journal = _journal(tmp_path, _entries([b"a", b"b", b"c", b"d"]))
    journal.setCurrentTerm(7, "127.0.0.1:9")
    journal.setRaftCommitIndex(3)
    journal.onOneSecondTimer()
    journal.deleteEntriesTo(2)
    journal._destroy()
    reopened = DurableJournal(tmp_path / "raft.log")
    assert (reopened.getCurrentTerm(), reopened.getVotedForNodeId(), reopened.getRaftCommitIndex()) == \
        (7, "127.0.0.1:9", 3)
    assert list(reopened[:]) == [(b"c", 3, 1), (b"d", 4, 1)]


def test_the_commit_hint_never_passes_the_journal(tmp_path: Path) -> None:
    journal = _journal(tmp_path, _entries([b"a", b"b"]))
    journal.setRaftCommitIndex(9)
    assert journal.getRaftCommitIndex() == 2


def test_pysyncobj_journal_is_imported(tmp_path: Path) -> None:
    old = FileJournal(str(tmp_path / "raft.journal"))
    for entry in _entries([b"one", b"two"], term=4):
        old.add(*entry)
    old.setCurrentTerm(5, "127.0.0.1:7")
    old._destroy()
    journal = DurableJournal(tmp_path / "raft.log")
    assert list(journal[:]) == _entries([b"one", b"two"], term=4)
    assert (journal.getCurrentTerm(), journal.getVotedForNodeId()) == (5, "127.0.0.1:7")
    assert not (tmp_path / "raft.journal").exists()


def test_sync_is_one_call_for_many_entries(tmp_path: Path) -> None:
    journal = _journal(tmp_path, [])
    for entry in _entries([b"e"] * 50):
        journal.add(*entry)
    assert journal.dirty
    journal.sync()
    assert not journal.dirty


def test_a_journal_whose_header_never_reached_the_disk_opens_empty(tmp_path: Path) -> None:
    path = tmp_path / "raft.log"
    for content in (b"", MAGIC[:5]):
        path.write_bytes(content)
        journal = DurableJournal(path)
        assert len(journal) == 0
        journal.add(b"a", 1, 1)
        journal._destroy()
        assert list(DurableJournal(path)[:]) == [(b"a", 1, 1)]
