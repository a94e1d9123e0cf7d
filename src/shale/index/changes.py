"""The change feed: which blocks each applied log entry added to the index or removed from it, and which topics'
generation rules it changed. A consumer that must follow every change in order (the Iceberg publisher, which turns
each entry into one snapshot) reads it instead of diffing whole states.

Rows are written by ``IndexWriter`` in the same transaction as the change and with the entry's index (collected
while the handler runs, written by ``set_applied``), so every command that adds or removes a block is covered
without the handlers knowing. A rolled-back command leaves no row. The consumer trims the feed through the
``TrimBlockChanges`` command once it has published it; ``published_through`` is the trim point.

One row holds a run of blocks added (or removed) for the same tenant in one entry (an ``AddBlocks`` of 500 blocks of
one tenant is one row): ``subject`` is their ids joined by ``,`` in the order they were changed (a block id is a
ULID, without a comma). A generation change is one row per topic, whatever its name holds. Rows written before
schema version 3 hold one block each, which reads the same.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Literal

from shale.block import BlockMeta
from shale.index.records import decode_meta

DDL = """
CREATE TABLE IF NOT EXISTS block_changes (
    idx INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    change TEXT NOT NULL,
    tenant TEXT NOT NULL,
    subject TEXT NOT NULL,
    PRIMARY KEY (idx, seq)
) WITHOUT ROWID;
"""

ChangeKind = Literal["add", "remove", "generations"]
PUBLISHED_KEY = "changes_published"
SEPARATOR = ","


@dataclass(frozen=True)
class BlockChange:
    """One change of one entry: a block added or removed (``subject`` is its id), or a generation switch appended
    to ``subject``'s rules (a topic)."""

    index: int
    change: ChangeKind
    tenant: str
    subject: str


class PendingChanges:
    """Changes made by the command being applied, written with its index by ``flush``, as runs of the same change
    and tenant. Not thread-safe."""

    def __init__(self) -> None:
        self._runs: list[tuple[str, str, list[str]]] = []

    def record(self, change: ChangeKind, tenant: str, subject: str) -> None:
        runs = self._runs
        if runs and runs[-1][0] == change and runs[-1][1] == tenant and change != "generations":
            runs[-1][2].append(subject)
        else:
            runs.append((change, tenant, [subject]))

    def clear(self) -> None:
        self._runs.clear()

    def tenants(self, *changes: ChangeKind) -> set[str]:
        """The tenants with a pending change of one of these kinds (of any kind if none is named)."""
        return {tenant for change, tenant, _ in self._runs if not changes or change in changes}

    def blocks_of(self, tenant: str) -> tuple[list[str], list[str]]:
        """The tenant's blocks added and removed, in the order they were (a block may be in both)."""
        added: list[str] = []
        removed: list[str] = []
        for change, owner, subjects in self._runs:
            if owner == tenant and change != "generations":
                (added if change == "add" else removed).extend(subjects)
        return added, removed

    def mark(self) -> tuple[int, int]:
        return len(self._runs), len(self._runs[-1][2]) if self._runs else 0

    def forget_since(self, mark: tuple[int, int]) -> None:
        """Drop the changes recorded after ``mark`` (their savepoint was rolled back)."""
        runs, last = mark
        del self._runs[runs:]
        if runs:
            del self._runs[-1][2][last:]

    def flush(self, conn: sqlite3.Connection, index: int) -> None:
        if self._runs:
            conn.executemany("INSERT OR REPLACE INTO block_changes (idx, seq, change, tenant, subject) "
                             "VALUES (?, ?, ?, ?, ?)",
                             [(index, i, change, tenant, SEPARATOR.join(subjects))
                              for i, (change, tenant, subjects) in enumerate(self._runs)])
            self._runs.clear()


def read_changes(conn: sqlite3.Connection, after: int, through: int) -> list[BlockChange]:
    """Changes of entries ``after < index <= through``, in log order (one per block or topic)."""
    return [BlockChange(int(idx), change, tenant, subject) for idx, change, tenant, subjects in conn.execute(
        "SELECT idx, change, tenant, subject FROM block_changes WHERE idx > ? AND idx <= ? ORDER BY idx, seq",
        (after, through)) for subject in (subjects.split(SEPARATOR) if change != "generations" else (subjects,))]


def published_through(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT value FROM state WHERE key = ?", (PUBLISHED_KEY,)).fetchone()
    return int(row[0]) if row else 0


def trim(conn: sqlite3.Connection, through: int) -> int:
    """Forget changes up to ``through`` and remember it as published (never moves back). Returns rows removed (one
    row per run of changes, see the module's docstring)."""
    removed = conn.execute("DELETE FROM block_changes WHERE idx <= ?", (through,)).rowcount
    conn.execute("INSERT INTO state (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET "
                 "value = max(value, excluded.value)", (PUBLISHED_KEY, through))
    return int(removed)


def change_metas(conn: sqlite3.Connection, block_ids: list[str]) -> dict[str, BlockMeta]:
    """Metadata of blocks named by changes: live ones from ``blocks``, removed ones from their tombstones. A block
    whose tombstone is gone (its objects were deleted) is absent."""
    out: dict[str, BlockMeta] = {}
    for table, column in (("blocks", "id"), ("tombstones", "block_id")):
        wanted = [b for b in block_ids if b not in out]
        for i in range(0, len(wanted), 500):
            chunk = wanted[i:i + 500]
            for block_id, meta in conn.execute(
                    f"SELECT {column}, meta FROM {table} WHERE {column} IN ({','.join('?' * len(chunk))})", chunk):
                out[block_id] = decode_meta(meta)
    return out


def pending_entries(conn: sqlite3.Connection) -> int:
    """How many log entries have changes not yet published."""
    return int(conn.execute("SELECT count(DISTINCT idx) FROM block_changes").fetchone()[0])
