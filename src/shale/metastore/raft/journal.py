"""The Raft journal on disk: entries, and the node's term and vote, durable before the node says anything about them.

pysyncobj's own file journal writes entries through a memory map that is never flushed and stores the term and vote
with a rename that is never fsynced, so a machine that loses power forgets entries it acknowledged and votes it
cast. This journal replaces it (``install``) for every Raft node of the process:

* ``raft.log``: a header line (``MAGIC``) then one framed record per entry, ``>IIQQ`` (command length, CRC-32 of
  the rest of the record, index, term) followed by the command bytes. Entries are written at once but not synced:
  ``sync`` makes everything written so far durable with one ``fdatasync`` (group commit). The node calls it before
  it acknowledges entries to the leader and, on the leader, before it counts its own copy towards a majority
  (log.py, ``_RaftNode``).
* ``raft.term``: the current term, the vote and a hint of the commit index, replaced atomically (write a temporary
  file, fsync it, rename, fsync the directory) before pysyncobj sends a vote or a vote request.

Opening the journal reads records until the first one that is cut short, fails its CRC, does not follow the one
before it (index + 1, term not lower), and cuts the file there: that tail was being written when the machine
stopped, and the node never acknowledged it. A journal of pysyncobj's own format (``raft.journal`` beside it) is
imported once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import struct
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pysyncobj.syncobj
from pysyncobj.journal import FileJournal, Journal, MemoryJournal

log = logging.getLogger(__name__)
MAGIC = b"SHALE-RAFT-JOURNAL 1\n"
RECORD = struct.Struct(">IIQQ")
TERM_FILE = "raft.term"
PYSYNCOBJ_JOURNAL = "raft.journal"
UNSYNCED_BASELINE_ENV = "SHALE_TEST_ONLY_UNSYNCED_RAFT_JOURNAL"
"""Benchmarks and the power-loss test set this to ``1`` to run nodes on pysyncobj's own unsynced journal, the
behaviour before this module, as their baseline. It is not a setting: it loses acknowledged commits."""

Entry = tuple[bytes, int, int]


def fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def durable_directory(directory: Path) -> None:
    """Create ``directory`` if needed and make its entry, and its parents' entries, durable: a journal fsynced
    inside a directory whose own name never reached the disk is lost with it."""
    directory.mkdir(parents=True, exist_ok=True)
    for path in [directory, *directory.parents]:
        fsync_directory(path)


def replace_durably(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that after a crash the file holds either its old content or ``data``."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
    fsync_directory(path.parent)


def _record(command: bytes, idx: int, term: int) -> bytes:
    body = struct.pack(">QQ", idx, term) + command
    return RECORD.pack(len(command), zlib.crc32(struct.pack(">I", len(command)) + body), idx, term) + command


def read_records(data: bytes) -> tuple[list[Entry], list[int], int]:
    """The entries of a journal file's bytes, each one's offset, and where the last whole record ends."""
    entries: list[Entry] = []
    offsets: list[int] = []
    pos = len(MAGIC)
    while pos + RECORD.size <= len(data):
        size, crc, idx, term = RECORD.unpack_from(data, pos)
        end = pos + RECORD.size + size
        if end > len(data):
            break
        command = data[pos + RECORD.size:end]
        if zlib.crc32(struct.pack(">IQQ", size, idx, term) + command) != crc:
            break
        if entries and (idx != entries[-1][1] + 1 or term < entries[-1][2]):
            break  # a record left from before a truncation, behind a newer one the machine did write
        entries.append((command, idx, term))
        offsets.append(pos)
        pos = end
    return entries, offsets, pos


class DurableJournal(Journal):  # type: ignore[misc]
    """pysyncobj's journal interface over ``raft.log`` and ``raft.term`` (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.directory = path.parent
        self.term_path = self.directory / TERM_FILE
        self._meta: dict[str, Any] = {"term": 0, "voted_for": None, "commit_index": 1}
        self._meta_saved = True
        self.dirty = False
        self._rebased = False
        if not path.exists():
            self._create()
        self.fd = os.open(path, os.O_RDWR)
        data = _read_all(self.fd)
        if len(data) < len(MAGIC) and MAGIC.startswith(data):  # created, header never reached the disk
            os.pwrite(self.fd, MAGIC[len(data):], len(data))
            os.fsync(self.fd)
            data = MAGIC
        if not data.startswith(MAGIC):
            os.close(self.fd)
            raise OSError(f"{path} is not a Shale Raft journal (it does not start with {MAGIC!r})")
        self.entries, self.offsets, self.end = read_records(data)
        self.synced_index = self.entries[-1][1] if self.entries else 0
        """The last index known to be on disk: nothing past it is acknowledged or applied."""
        if self.end < len(data):
            log.warning("cut a partly written tail off the Raft journal", extra={
                "journal": str(path), "offset": self.end, "bytes": len(data) - self.end,
                "last_index": self.entries[-1][1] if self.entries else None})
            os.ftruncate(self.fd, self.end)
            os.fsync(self.fd)
        if self.term_path.exists():
            self._meta.update(json.loads(self.term_path.read_text()))

    def _create(self) -> None:
        """A new journal, holding pysyncobj's entries, term and vote when its own journal is beside it."""
        entries: list[Entry] = []
        old = self.directory / PYSYNCOBJ_JOURNAL
        if old.exists():
            previous = FileJournal(str(old))
            entries = [previous[i] for i in range(len(previous))]
            self._meta = {"term": previous.getCurrentTerm(), "voted_for": previous.getVotedForNodeId(),
                          "commit_index": previous.getRaftCommitIndex()}
            previous._destroy()
            replace_durably(self.term_path, json.dumps(self._meta).encode())
            log.info("imported pysyncobj's Raft journal", extra={"journal": str(old), "entries": len(entries)})
        replace_durably(self.path, MAGIC + b"".join(_record(*e) for e in entries))
        for leftover in (old, old.with_name(old.name + ".meta")):
            leftover.unlink(missing_ok=True)

    # -- entries ------------------------------------------------------------------------------------

    def add(self, command: bytes, idx: int, term: int) -> None:
        record = _record(bytes(command), idx, term)
        os.pwrite(self.fd, record, self.end)
        self.entries.append((bytes(command), idx, term))
        self.offsets.append(self.end)
        self.end += len(record)
        self.dirty = True

    def clear(self) -> None:
        self.entries, self.offsets = [], []
        self.synced_index = 0
        self.end = len(MAGIC)
        os.ftruncate(self.fd, self.end)
        self.dirty = True
        self._rebased = True  # a snapshot replaces the log: it must be on disk before the cut journal is

    def deleteEntriesFrom(self, entryFrom: int) -> None:  # noqa: N802,N803 - pysyncobj's names
        if entryFrom >= len(self.entries):
            return
        self.end = self.offsets[entryFrom]
        del self.entries[entryFrom:], self.offsets[entryFrom:]
        self.synced_index = min(self.synced_index, self.entries[-1][1] if self.entries else 0)
        os.ftruncate(self.fd, self.end)
        self.dirty = True

    def deleteEntriesTo(self, entryTo: int) -> None:  # noqa: N802,N803 - pysyncobj's names
        """Drop the entries a snapshot now holds: the snapshot (written beside the journal) reaches the disk
        first, then a new journal of the rest replaces this one."""
        self.sync()
        fsync_directory(self.directory)
        rest = self.entries[entryTo:]
        replace_durably(self.path, MAGIC + b"".join(_record(*e) for e in rest))
        os.close(self.fd)
        self.fd = os.open(self.path, os.O_RDWR)
        self.entries, self.offsets, self.end = read_records(_read_all(self.fd))

    def __getitem__(self, item: int | slice) -> Any:
        return self.entries[item]

    def __len__(self) -> int:
        return len(self.entries)

    def sync(self) -> None:
        """Make every entry written so far durable: one fdatasync, however many entries (group commit)."""
        if not self.dirty:
            return
        if self._rebased:
            dump = self.directory / "raft.snapshot"
            if dump.exists():
                with open(dump, "rb") as f:
                    os.fsync(f.fileno())
            fsync_directory(self.directory)
            self._rebased = False
        os.fdatasync(self.fd)
        self.dirty = False
        self.synced_index = self.entries[-1][1] if self.entries else 0

    def _destroy(self) -> None:
        with contextlib.suppress(OSError):
            self.sync()
            if not self._meta_saved:
                self._store_meta()
        with contextlib.suppress(OSError):
            os.close(self.fd)

    # -- term, vote and commit index ----------------------------------------------------------------

    def _store_meta(self) -> None:
        replace_durably(self.term_path, json.dumps(self._meta).encode())
        self._meta_saved = True

    def setCurrentTerm(self, term: int, votedForNodeId: Any) -> None:  # noqa: N802,N803 - pysyncobj's names
        # pysyncobj sends the vote or vote request right after this returns: it must be on disk first.
        self._meta.update(term=int(term), voted_for=None if votedForNodeId is None else str(votedForNodeId))
        self._store_meta()

    def getCurrentTerm(self) -> int:  # noqa: N802 - pysyncobj's name
        return int(self._meta["term"])

    def getVotedForNodeId(self) -> Any:  # noqa: N802 - pysyncobj's name
        return self._meta["voted_for"]

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:  # noqa: N802,N803 - pysyncobj's names
        # A hint only (Raft's commit index is volatile state): saved once a second, never ahead of the journal.
        if raftCommitIndex != self._meta["commit_index"]:
            self._meta["commit_index"] = int(raftCommitIndex)
            self._meta_saved = False

    def getRaftCommitIndex(self) -> int:  # noqa: N802 - pysyncobj's name
        last = self.entries[-1][1] if self.entries else 1
        return min(int(self._meta["commit_index"]), last)

    def onOneSecondTimer(self) -> None:  # noqa: N802 - pysyncobj's name
        if not self._meta_saved:
            self.sync()  # the hint never names entries that are not on disk
            self._store_meta()


def _read_all(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    return os.pread(fd, size, 0) if size else b""


def _create_journal(journal_file: str | None = None) -> Journal:
    if journal_file is None:
        return MemoryJournal()
    if os.environ.get(UNSYNCED_BASELINE_ENV) == "1":
        return FileJournal(journal_file)
    return DurableJournal(Path(journal_file))


def install() -> None:
    """Make every pysyncobj node of this process keep its journal in a ``DurableJournal``."""
    create: Callable[..., Journal] = _create_journal
    pysyncobj.syncobj.createJournal = create
