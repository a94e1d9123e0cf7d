"""The ingest leases' and shard maps' store: the ``ingest_leases``, ``ingest_shards``, ``ingest_placement`` and
``ingest_load`` tables, their reads and their writes, and the log's last entry time (the ``state`` key
``LOG_TIME``). What a command changes in them (fencing tokens, takeovers, resizes, placement, load windows) is
decided by ``shale.metastore.rules.leases`` and ``shale.metastore.rules.shards``, inside the apply transaction; the
reads also run on read connections."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass

# In two parts, which the index schema creates where these tables have always been created (the same file layout).
LEASES_DDL = """
CREATE TABLE IF NOT EXISTS ingest_leases (
    grp TEXT NOT NULL,
    generation INTEGER NOT NULL,
    shard INTEGER NOT NULL,
    holder TEXT NOT NULL,
    token INTEGER NOT NULL,
    acquired_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    duration_ms INTEGER NOT NULL,
    takeovers INTEGER NOT NULL,
    PRIMARY KEY (grp, generation, shard)
) WITHOUT ROWID;
"""
SHARDS_DDL = """
CREATE TABLE IF NOT EXISTS ingest_shards (
    grp TEXT NOT NULL,
    generation INTEGER NOT NULL,
    shards INTEGER NOT NULL,
    version INTEGER NOT NULL,
    PRIMARY KEY (grp, generation)
) WITHOUT ROWID;

-- shale.metastore.rules.shards: each committed partition's shard under the group's current map (the others follow the
-- hash), and each partition's load window (bytes per second of log time).
CREATE TABLE IF NOT EXISTS ingest_placement (
    grp TEXT NOT NULL,
    generation INTEGER NOT NULL,
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    shard INTEGER NOT NULL,
    PRIMARY KEY (grp, generation, topic, partition)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS ingest_load (
    grp TEXT NOT NULL,
    generation INTEGER NOT NULL,
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    rate INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    since INTEGER NOT NULL,
    PRIMARY KEY (grp, generation, topic, partition)
) WITHOUT ROWID;
"""

_COLUMNS = "grp, generation, shard, holder, token, acquired_at, expires_at, duration_ms, takeovers"
LeaseRow = tuple[str, int, int, str, int, int, int, int, int]
"""A lease in ``ingest_leases``' column order: group, generation, shard, holder, token, acquired_at, expires_at,
duration_ms, takeovers."""
Key = tuple[str, int]
"""A topic-partition."""
LOG_TIME = "log_time_ms"
"""The ``state`` key holding the time of the last entry applied (the leader's clock, never decreasing)."""


def lease(conn: sqlite3.Connection, group: str, generation: int, shard: int) -> LeaseRow | None:
    row: LeaseRow | None = conn.execute(
        f"SELECT {_COLUMNS} FROM ingest_leases WHERE grp = ? AND generation = ? AND shard = ?",
        (group, generation, shard)).fetchone()
    return row


def leases(conn: sqlite3.Connection) -> list[LeaseRow]:
    """Every shard's lease, by group, generation and shard."""
    return conn.execute(f"SELECT {_COLUMNS} FROM ingest_leases ORDER BY grp, generation, shard").fetchall()


def save_lease(conn: sqlite3.Connection, row: LeaseRow) -> None:
    conn.execute(f"INSERT OR REPLACE INTO ingest_leases ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", row)


def extend_leases(conn: sqlite3.Connection, silence_ms: int, since: int, share: float) -> None:
    """Add ``silence_ms`` to every held lease that was live at ``since`` and whose duration times ``share`` is
    shorter than the silence."""
    conn.execute("UPDATE ingest_leases SET expires_at = expires_at + ? WHERE holder != '' AND expires_at > ? "
                 "AND ? > duration_ms * ?", (silence_ms, since, silence_ms, share))


def log_time(conn: sqlite3.Connection) -> int:
    """The time of the last entry applied (0 before the first)."""
    row = conn.execute("SELECT value FROM state WHERE key = ?", (LOG_TIME,)).fetchone()
    return int(row[0]) if row else 0


def set_log_time(conn: sqlite3.Connection, time_ms: int) -> None:
    conn.execute("INSERT OR REPLACE INTO state (key, value) VALUES (?, ?)", (LOG_TIME, time_ms))


@dataclass(frozen=True)
class ShardMap:
    shards: int
    version: int
    """The log index of the ``SetIngestShards`` that set this count (0: seeded by the first lease)."""


def shard_map(conn: sqlite3.Connection, group: str, generation: int) -> ShardMap | None:
    row = conn.execute("SELECT shards, version FROM ingest_shards WHERE grp = ? AND generation = ?",
                       (group, generation)).fetchone()
    return ShardMap(int(row[0]), int(row[1])) if row else None


def shard_maps(conn: sqlite3.Connection) -> dict[tuple[str, int], ShardMap]:
    return {(str(g), int(n)): ShardMap(int(s), int(v))
            for g, n, s, v in conn.execute("SELECT grp, generation, shards, version FROM ingest_shards")}


def save_shard_map(conn: sqlite3.Connection, group: str, generation: int, shards: ShardMap) -> None:
    conn.execute("INSERT OR REPLACE INTO ingest_shards (grp, generation, shards, version) VALUES (?, ?, ?, ?)",
                 (group, generation, shards.shards, shards.version))


def placement(conn: sqlite3.Connection, group: str, generation: int) -> dict[Key, int]:
    """The shard of each partition the group's map placed (the others follow
    ``shale.metastore.rules.shards.shard_of``)."""
    return {(str(t), int(p)): int(s) for t, p, s in conn.execute(
        "SELECT topic, partition, shard FROM ingest_placement WHERE grp = ? AND generation = ?", (group, generation))}


def placed(conn: sqlite3.Connection, group: str, generation: int, topic: str, partition: int) -> int | None:
    """The shard the group's map placed ``topic[partition]`` in, if it placed it."""
    row = conn.execute("SELECT shard FROM ingest_placement WHERE grp = ? AND generation = ? AND topic = ? AND "
                       "partition = ?", (group, generation, topic, partition)).fetchone()
    return int(row[0]) if row else None


def save_placement(conn: sqlite3.Connection, group: str, generation: int, shards: Mapping[Key, int]) -> None:
    """Replace the group's placement with ``shards``."""
    conn.execute("DELETE FROM ingest_placement WHERE grp = ? AND generation = ?", (group, generation))
    conn.executemany("INSERT INTO ingest_placement (grp, generation, topic, partition, shard) VALUES (?, ?, ?, ?, ?)",
                     [(group, generation, t, p, s) for (t, p), s in sorted(shards.items())])


def load_window(conn: sqlite3.Connection, group: str, generation: int, topic: str,
         partition: int) -> tuple[int, int, int] | None:
    """A partition's load window: the last whole window's rate (-1: none ended yet), the bytes of the current one
    so far, and when it began."""
    row = conn.execute("SELECT rate, bytes, since FROM ingest_load WHERE grp = ? AND generation = ? AND "
                       "topic = ? AND partition = ?", (group, generation, topic, partition)).fetchone()
    return (int(row[0]), int(row[1]), int(row[2])) if row else None


def save_load_window(conn: sqlite3.Connection, group: str, generation: int, topic: str, partition: int, rate: int,
              total: int, since: int) -> None:
    conn.execute("INSERT OR REPLACE INTO ingest_load (grp, generation, topic, partition, rate, bytes, since) "
                 "VALUES (?, ?, ?, ?, ?, ?, ?)", (group, generation, topic, partition, rate, total, since))


def load_windows(conn: sqlite3.Connection, group: str, generation: int) -> list[tuple[Key, int, int, int]]:
    """Each partition's load window of the group: the partition, then as ``load_window``."""
    return [((str(t), int(p)), int(rate), int(total), int(since)) for t, p, rate, total, since in conn.execute(
        "SELECT topic, partition, rate, bytes, since FROM ingest_load WHERE grp = ? AND generation = ?",
        (group, generation))]
