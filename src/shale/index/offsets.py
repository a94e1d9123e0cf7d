"""The committed offsets' store: the ``offsets``, ``commits``, ``incarnations`` and ``losses`` tables, their reads
and their writes. Committed offsets are kept per (group, generation, topic, partition) for the topic's current
incarnation (its Kafka topic id); when a topic is deleted and recreated, the old incarnation's row moves to
``incarnations``. ``commits`` remembers the last committed ranges of each partition (exact replays are recognised by
them), ``losses`` the offset ranges an operator acknowledged as lost. What a command changes in them (continuity,
writers, replays) is decided by the metastore's command handlers (``shale.metastore.rules.fsm``), inside the apply
transaction; the reads also run on read connections."""

from __future__ import annotations

import sqlite3

from shale.index.records import IncarnationRow, LossRow, OffsetRow

DDL = """
CREATE TABLE IF NOT EXISTS offsets (
    grp TEXT NOT NULL,
    generation INTEGER NOT NULL,
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    committed_end INTEGER NOT NULL,
    max_event_time INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    incarnation TEXT NOT NULL DEFAULT '',
    writer TEXT NOT NULL DEFAULT '',
    skipped INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (grp, generation, topic, partition)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS commits (
    grp TEXT NOT NULL,
    generation INTEGER NOT NULL,
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    incarnation TEXT NOT NULL,
    start INTEGER NOT NULL,
    "end" INTEGER NOT NULL,
    digest TEXT NOT NULL,
    committed_at INTEGER NOT NULL,
    PRIMARY KEY (grp, generation, topic, partition, incarnation, start)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS incarnations (
    grp TEXT NOT NULL,
    generation INTEGER NOT NULL,
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    incarnation TEXT NOT NULL,
    committed_end INTEGER NOT NULL,
    max_event_time INTEGER NOT NULL,
    skipped INTEGER NOT NULL,
    ended_at INTEGER NOT NULL,
    PRIMARY KEY (grp, generation, topic, partition, incarnation)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS losses (
    grp TEXT NOT NULL,
    generation INTEGER NOT NULL,
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    incarnation TEXT NOT NULL,
    start INTEGER NOT NULL,
    "end" INTEGER NOT NULL,
    reason TEXT NOT NULL,
    acknowledged_at INTEGER NOT NULL,
    PRIMARY KEY (grp, generation, topic, partition, incarnation, start)
) WITHOUT ROWID;
"""


def committed(conn: sqlite3.Connection, group: str, generation: int, topic: str,
              partition: int) -> tuple[int, str, str] | None:
    """(committed end, incarnation, writer) of the current incarnation, or None before the first commit."""
    row = conn.execute(
        "SELECT committed_end, incarnation, writer FROM offsets WHERE grp = ? AND generation = ? AND topic = ? "
        "AND partition = ?", (group, generation, topic, partition)).fetchone()
    return (int(row[0]), str(row[1]), str(row[2])) if row else None


def topic_offsets(conn: sqlite3.Connection, group: str, topic: str) -> dict[int, dict[int, tuple[int, str, str]]]:
    """Per generation of the group, per partition of ``topic``: (committed end, incarnation, writer)."""
    found: dict[int, dict[int, tuple[int, str, str]]] = {}
    for generation, partition, end, incarnation, writer in conn.execute(
            "SELECT generation, partition, committed_end, incarnation, writer FROM offsets WHERE grp = ? AND "
            "topic = ? ORDER BY generation, partition", (group, topic)):
        found.setdefault(int(generation), {})[int(partition)] = (int(end), str(incarnation), str(writer))
    return found


def committed_partitions(conn: sqlite3.Connection, group: str, generation: int) -> set[tuple[str, int]]:
    """Every (topic, partition) of the group's generation with committed offsets."""
    return {(str(t), int(p)) for t, p in conn.execute(
        "SELECT topic, partition FROM offsets WHERE grp = ? AND generation = ?", (group, generation))}


def is_past_incarnation(conn: sqlite3.Connection, group: str, generation: int, topic: str, partition: int,
                        incarnation: str) -> bool:
    return conn.execute(
        "SELECT 1 FROM incarnations WHERE grp = ? AND generation = ? AND topic = ? AND partition = ? "
        "AND incarnation = ?", (group, generation, topic, partition, incarnation)).fetchone() is not None


def end_incarnation(conn: sqlite3.Connection, group: str, generation: int, topic: str, partition: int,
                    now: int) -> None:
    """Move the current incarnation's offsets to the history (its topic was deleted and recreated)."""
    conn.execute(
        "INSERT OR REPLACE INTO incarnations (grp, generation, topic, partition, incarnation, committed_end, "
        "max_event_time, skipped, ended_at) SELECT grp, generation, topic, partition, incarnation, committed_end, "
        "max_event_time, skipped, ? FROM offsets WHERE grp = ? AND generation = ? AND topic = ? AND partition = ?",
        (now, group, generation, topic, partition))
    for table in ("offsets", "commits"):  # an ended incarnation's commits can never be replayed
        conn.execute(f"DELETE FROM {table} WHERE grp = ? AND generation = ? AND topic = ? AND partition = ?",
                     (group, generation, topic, partition))


def set_committed_end(conn: sqlite3.Connection, group: str, generation: int, topic: str, partition: int, end: int,
                      event_time: int, now: int, *, incarnation: str = "", writer: str = "",
                      skipped: int = 0) -> None:
    """Advance the committed end. An empty ``incarnation`` or ``writer`` keeps the stored one."""
    conn.execute(
        "INSERT INTO offsets (grp, generation, topic, partition, committed_end, max_event_time, updated_at, "
        "incarnation, writer, skipped) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (grp, generation, topic, partition) DO UPDATE SET "
        "committed_end = excluded.committed_end, max_event_time = max(max_event_time, excluded.max_event_time), "
        "updated_at = excluded.updated_at, skipped = skipped + excluded.skipped, "
        "incarnation = CASE WHEN excluded.incarnation = '' THEN incarnation ELSE excluded.incarnation END, "
        "writer = CASE WHEN excluded.writer = '' THEN writer ELSE excluded.writer END",
        (group, generation, topic, partition, end, event_time, now, incarnation, writer, skipped))


def find_commit(conn: sqlite3.Connection, group: str, generation: int, topic: str, partition: int, incarnation: str,
                start: int) -> tuple[int, str] | None:
    row = conn.execute(
        'SELECT "end", digest FROM commits WHERE grp = ? AND generation = ? AND topic = ? AND partition = ? '
        "AND incarnation = ? AND start = ?", (group, generation, topic, partition, incarnation, start)).fetchone()
    return (int(row[0]), str(row[1])) if row else None


def record_commit(conn: sqlite3.Connection, group: str, generation: int, topic: str, partition: int, incarnation: str,
                  start: int, end: int, digest: str, now: int, keep: int) -> None:
    """Remember a committed range (exact replays are recognised by it); keep the last ``keep`` per partition."""
    conn.execute(
        'INSERT OR REPLACE INTO commits (grp, generation, topic, partition, incarnation, start, "end", digest, '
        "committed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (group, generation, topic, partition, incarnation, start, end, digest, now))
    key = (group, generation, topic, partition, incarnation)
    conn.execute(
        "DELETE FROM commits WHERE grp = ? AND generation = ? AND topic = ? AND partition = ? AND incarnation = ? "
        "AND start < (SELECT start FROM commits WHERE grp = ? AND generation = ? AND topic = ? AND partition = ? "
        "AND incarnation = ? ORDER BY start DESC LIMIT 1 OFFSET ?)", (*key, *key, keep - 1))


def find_loss(conn: sqlite3.Connection, group: str, generation: int, topic: str, partition: int, incarnation: str,
              start: int) -> int | None:
    row = conn.execute(
        'SELECT "end" FROM losses WHERE grp = ? AND generation = ? AND topic = ? AND partition = ? '
        "AND incarnation = ? AND start = ?", (group, generation, topic, partition, incarnation, start)).fetchone()
    return int(row[0]) if row else None


def record_loss(conn: sqlite3.Connection, group: str, generation: int, topic: str, partition: int, incarnation: str,
                start: int, end: int, reason: str, now: int) -> None:
    conn.execute(
        'INSERT OR REPLACE INTO losses (grp, generation, topic, partition, incarnation, start, "end", reason, '
        "acknowledged_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (group, generation, topic, partition, incarnation, start, end, reason, now))


# -- rows, as the API shows them ---------------------------------------------------------------------

def offset_rows(conn: sqlite3.Connection, group: str | None = None, generation: int | None = None) -> list[OffsetRow]:
    rows = conn.execute(
        "SELECT grp, generation, topic, partition, committed_end, max_event_time, updated_at, incarnation, writer, "
        "skipped FROM offsets ORDER BY grp, generation, topic, partition")
    return [OffsetRow(group=r[0], generation=r[1], topic=r[2], partition=r[3], committed_end=r[4],
                      max_event_time=r[5], updated_at=r[6], incarnation=r[7], writer=r[8], skipped=r[9])
            for r in rows if (group is None or r[0] == group) and (generation is None or r[1] == generation)]


def incarnation_rows(conn: sqlite3.Connection, group: str | None = None,
                     generation: int | None = None) -> list[IncarnationRow]:
    """Past incarnations of topic-partitions (the current one is in ``offsets``)."""
    rows = conn.execute(
        "SELECT grp, generation, topic, partition, incarnation, committed_end, max_event_time, skipped, ended_at "
        "FROM incarnations ORDER BY grp, generation, topic, partition, ended_at")
    return [IncarnationRow(group=r[0], generation=r[1], topic=r[2], partition=r[3], incarnation=r[4],
                           committed_end=r[5], max_event_time=r[6], skipped=r[7], ended_at=r[8])
            for r in rows if (group is None or r[0] == group) and (generation is None or r[1] == generation)]


def loss_rows(conn: sqlite3.Connection, group: str | None = None, generation: int | None = None) -> list[LossRow]:
    """Offset ranges acknowledged as lost."""
    rows = conn.execute(
        'SELECT grp, generation, topic, partition, incarnation, start, "end", reason, acknowledged_at FROM losses '
        "ORDER BY grp, generation, topic, partition, start")
    return [LossRow(group=r[0], generation=r[1], topic=r[2], partition=r[3], incarnation=r[4], start=r[5],
                    end=r[6], reason=r[7], acknowledged_at=r[8])
            for r in rows if (group is None or r[0] == group) and (generation is None or r[1] == generation)]
