"""The change feed: which blocks each applied log entry added to the index or removed from it, and which topics'
generation rules it changed. A consumer that must follow every change in order (the Iceberg publisher, which turns
each entry into one snapshot) reads it instead of diffing whole states.

Rows are written by ``IndexWriter`` in the same transaction as the change and with the entry's index (collected
while the handler runs, written by ``set_applied``), so every command that adds or removes a block is covered
without the handlers knowing. A rolled-back command leaves no row. The consumer trims the feed through the
``TrimBlockChanges`` command once it has published it; ``published_through`` is the trim point.
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


@dataclass(frozen=True)
class BlockChange:
    """One change of one entry: a block added or removed (``subject`` is its id), or a generation switch appended
    to ``subject``'s rules (a topic)."""

    index: int
    change: ChangeKind
    tenant: str
    subject: str


class PendingChanges:
    """Changes made by the command being applied, written with its index by ``flush``. Not thread-safe."""

    def __init__(self) -> None:
        self._items: list[tuple[str, str, str]] = []

    def record(self, change: ChangeKind, tenant: str, subject: str) -> None:
        self._items.append((change, tenant, subject))

    def clear(self) -> None:
        self._items.clear()

    def mark(self) -> int:
        return len(self._items)

    def forget_since(self, mark: int) -> None:
        """Drop the changes recorded after ``mark`` (their savepoint was rolled back)."""
        del self._items[mark:]

    def flush(self, conn: sqlite3.Connection, index: int) -> None:
        if self._items:
            conn.executemany("INSERT OR REPLACE INTO block_changes (idx, seq, change, tenant, subject) "
                             "VALUES (?, ?, ?, ?, ?)", [(index, i, *item) for i, item in enumerate(self._items)])
            self._items.clear()


def read_changes(conn: sqlite3.Connection, after: int, through: int) -> list[BlockChange]:
    """Changes of entries ``after < index <= through``, in log order."""
    return [BlockChange(int(r[0]), r[1], r[2], r[3]) for r in conn.execute(
        "SELECT idx, change, tenant, subject FROM block_changes WHERE idx > ? AND idx <= ? ORDER BY idx, seq",
        (after, through))]


def published_through(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT value FROM state WHERE key = ?", (PUBLISHED_KEY,)).fetchone()
    return int(row[0]) if row else 0


def trim(conn: sqlite3.Connection, through: int) -> int:
    """Forget changes up to ``through`` and remember it as published (never moves back). Returns rows removed."""
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
