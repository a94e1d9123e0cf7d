"""The erasures' store: the ``erasures``, ``erasure_positions`` and ``erasure_blocks`` tables, their reads and their
writes. One row per erasure request (``shale erase``), the Kafka positions of its records, and each block rewritten
without them. What a command changes in them (a replayed request, the checks on a plan, when an erasure is
rewritten) is decided by ``shale.metastore.rules.erasures``, inside the apply transaction; the reads also run on read
connections."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any

from shale.block import BlockMeta
from shale.index.records import decode_meta

DDL = """
-- Erasures (``shale erase``, ``shale.metastore.rules.erasures``): each request, the Kafka positions of its records
-- (found in the backup group, matched in both), and each block rewritten without them.
CREATE TABLE IF NOT EXISTS erasures (
    id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    by TEXT NOT NULL,
    tenant TEXT NOT NULL,
    topics TEXT NOT NULL,
    key_sha256 TEXT NOT NULL,
    watermarks TEXT NOT NULL,
    state TEXT NOT NULL,
    requested_at INTEGER NOT NULL,
    planned_at INTEGER NOT NULL,
    ended_at INTEGER NOT NULL,
    matches INTEGER NOT NULL,
    receipt TEXT NOT NULL,
    matched_by TEXT NOT NULL DEFAULT 'key',  -- 'key', or 'column:<path>' (key_sha256: the value's canonical hash)
    delete_delay_ms INTEGER NOT NULL DEFAULT 0  -- the delete delay asked for its replaced blocks; 0: the configured
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS erasure_positions (
    tenant TEXT NOT NULL,
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    offset INTEGER NOT NULL,
    incarnation TEXT NOT NULL,
    erasure TEXT NOT NULL,
    PRIMARY KEY (tenant, topic, partition, offset, incarnation, erasure)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS erasure_blocks (
    erasure TEXT NOT NULL,
    old_block TEXT NOT NULL,
    new_block TEXT NOT NULL,
    grp TEXT NOT NULL,
    generation INTEGER NOT NULL,
    rows_removed INTEGER NOT NULL,
    old_files TEXT NOT NULL,
    new_files TEXT NOT NULL,
    rewritten_at INTEGER NOT NULL,
    old_prefix TEXT NOT NULL,
    new_prefix TEXT NOT NULL,
    PRIMARY KEY (erasure, old_block)
) WITHOUT ROWID;
"""
COLUMNS = ("id", "seq", "by", "tenant", "topics", "key_sha256", "watermarks", "state", "requested_at", "planned_at",
           "ended_at", "matches", "receipt", "matched_by", "delete_delay_ms")
_SELECT = ", ".join(f'"{c}"' for c in COLUMNS)

Position = tuple[str, int, int, str]
"""(topic, partition, offset, incarnation) of an erased record."""


# -- requests --------------------------------------------------------------------------------------

def request(conn: sqlite3.Connection, erasure: str) -> tuple[str, int, str] | None:
    """A request's state, request time and requester, if it was requested."""
    row = conn.execute("SELECT state, requested_at, by FROM erasures WHERE id = ?", (erasure,)).fetchone()
    return None if row is None else (row[0], row[1], row[2])


def add_request(conn: sqlite3.Connection, row: dict[str, Any]) -> None:
    """Write a new request's row (every one of ``COLUMNS``)."""
    conn.execute(f"INSERT INTO erasures ({_SELECT}) VALUES ({', '.join('?' * len(COLUMNS))})",
                 tuple(row[c] for c in COLUMNS))


def scope(conn: sqlite3.Connection, erasure: str) -> tuple[str, str, str, str] | None:
    """A request's state, tenant, topics and watermarks (both as their JSON), if it was requested."""
    row = conn.execute("SELECT state, tenant, topics, watermarks FROM erasures WHERE id = ?", (erasure,)).fetchone()
    return None if row is None else (row[0], row[1], row[2], row[3])


def receipt(conn: sqlite3.Connection, erasure: str) -> tuple[str, str] | None:
    """A request's state and receipt, if it was requested."""
    row = conn.execute("SELECT state, receipt FROM erasures WHERE id = ?", (erasure,)).fetchone()
    return None if row is None else (row[0], row[1])


def delete_delay(conn: sqlite3.Connection, erasure: str) -> int:
    """The delete delay the erasure asked for its replaced blocks (ms; 0: the configured, or no such erasure)."""
    row = conn.execute("SELECT delete_delay_ms FROM erasures WHERE id = ?", (erasure,)).fetchone()
    return int(row[0]) if row else 0


def set_planned(conn: sqlite3.Connection, erasure: str, at: int, matches: int) -> None:
    conn.execute("UPDATE erasures SET state = 'rewriting', planned_at = ?, matches = ? WHERE id = ?",
                 (at, matches, erasure))


def set_rewritten(conn: sqlite3.Connection, erasure: str, at: int) -> None:
    """A ``rewriting`` erasure becomes ``rewritten`` at ``at``."""
    conn.execute("UPDATE erasures SET state = 'rewritten', ended_at = ? WHERE id = ? AND state = 'rewriting'",
                 (at, erasure))


def set_rewriting(conn: sqlite3.Connection, erasure: str) -> None:
    """A ``rewritten`` erasure is ``rewriting`` again (a job of it was made since)."""
    conn.execute("UPDATE erasures SET state = 'rewriting', ended_at = 0 WHERE id = ? AND state = 'rewritten'",
                 (erasure,))


def set_done(conn: sqlite3.Connection, erasure: str, receipt: str, at: int) -> None:
    conn.execute("UPDATE erasures SET state = 'done', receipt = ?, ended_at = ? WHERE id = ?", (receipt, at, erasure))


def states(conn: sqlite3.Connection) -> dict[str, str]:
    """Every erasure's state (requested, rewriting, rewritten, done)."""
    return {r[0]: r[1] for r in conn.execute("SELECT id, state FROM erasures")}


def shortest_delete_delay(conn: sqlite3.Connection, erasures: Sequence[str]) -> int:
    """The shortest delete delay ``erasures`` asked for (ms); 0 if none asked for one."""
    asked = [int(r[0]) for e in erasures for r in conn.execute(
        "SELECT delete_delay_ms FROM erasures WHERE id = ? AND delete_delay_ms > 0", (e,))]
    return min(asked, default=0)


def held_delete_delay(conn: sqlite3.Connection, meta: BlockMeta) -> int:
    """The shortest delete delay (ms; 0: none asked) of the erasures whose records ``meta`` still holds: those with
    a position inside its Kafka ranges that it was not written without (``BlockMeta.erased``). A block removed from
    the index while holding an erasure's records keeps them verbatim until its objects go, and the erasure's
    receipt waits for them: they go with the erasure's delay, not ``block.delete_delay``."""
    if not any_positions(conn):
        return 0
    done = set(meta.erased or ())
    held = {row[0] for r in meta.kafka if r.end > r.start
            for row in positions_between(conn, None, meta.tenant, r.topic, r.partition, r.start, r.end,
                                         r.incarnation)} - done
    return shortest_delete_delay(conn, sorted(held))


def shorten_tombstones(conn: sqlite3.Connection, tenant: str) -> int:
    """Give every tombstone of ``tenant`` whose block holds an erasure's records (``held_delete_delay``) that
    erasure's delay where it is shorter than its own (a merge's sources tombstoned before the erasure was planned);
    the tombstones changed."""
    changed = []
    for block_id, encoded, delay in conn.execute(
            "SELECT block_id, meta, delay_ms FROM tombstones WHERE tenant = ?", (tenant,)).fetchall():
        held = held_delete_delay(conn, decode_meta(encoded))
        if held and (not delay or held < delay):
            changed.append((held, block_id))
    conn.executemany("UPDATE tombstones SET delay_ms = ? WHERE block_id = ?", changed)
    return len(changed)


# -- positions -------------------------------------------------------------------------------------

def add_positions(conn: sqlite3.Connection, erasure: str, tenant: str, positions: Iterable[Position]) -> None:
    conn.executemany("INSERT OR IGNORE INTO erasure_positions (tenant, topic, partition, offset, incarnation, "
                     "erasure) VALUES (?, ?, ?, ?, ?, ?)",
                     [(tenant, topic, partition, offset, incarnation, erasure)
                      for topic, partition, offset, incarnation in positions])


def any_positions(conn: sqlite3.Connection) -> bool:
    """Whether any erasure has positions."""
    return conn.execute("SELECT 1 FROM erasure_positions LIMIT 1").fetchone() is not None


def positions_between(conn: sqlite3.Connection, erasure: str | None, tenant: str, topic: str, partition: int,
                      start: int, end: int, incarnation: str) -> list[tuple[str, str, int, int, str]]:
    """(erasure, topic, partition, offset, incarnation) of the erased records of ``topic[partition]`` in
    ``[start, end)`` of ``incarnation`` ('' on either side matches any), of one erasure or of all."""
    sql = ("SELECT erasure, topic, partition, offset, incarnation FROM erasure_positions WHERE tenant = ? AND "
           "topic = ? AND partition = ? AND offset >= ? AND offset < ? AND (incarnation = ? OR incarnation = '' "
           "OR ? = '')")
    args: list[object] = [tenant, topic, partition, start, end, incarnation, incarnation]
    if erasure is not None:
        sql += " AND erasure = ?"
        args.append(erasure)
    return list(conn.execute(sql, args))


def positions_of(conn: sqlite3.Connection, erasures: Sequence[str]) -> list[Position]:
    """The (topic, partition, offset, incarnation) of the records ``erasures`` remove."""
    return sorted({(r[0], int(r[1]), int(r[2]), r[3]) for e in erasures for r in conn.execute(
        "SELECT topic, partition, offset, incarnation FROM erasure_positions WHERE erasure = ?", (e,))})


# -- rewritten blocks ------------------------------------------------------------------------------

def add_rewrite(conn: sqlite3.Connection, erasure: str, old_block: str, new_block: str, group: str,
                generation: int, rows_removed: int, old_files: list[dict[str, Any]], new_files: list[dict[str, Any]],
                at: int, old_prefix: str, new_prefix: str) -> None:
    """Record that ``old_block`` (of ``group`` and ``generation``) was rewritten into ``new_block`` without the
    erasure's records: the files and object prefixes of both, for the receipt."""
    conn.execute(
        "INSERT OR REPLACE INTO erasure_blocks (erasure, old_block, new_block, grp, generation, rows_removed, "
        "old_files, new_files, rewritten_at, old_prefix, new_prefix) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (erasure, old_block, new_block, group, generation, rows_removed, json.dumps(old_files),
         json.dumps(new_files), at, old_prefix, new_prefix))


def erasure_rows(conn: sqlite3.Connection, erasure: str | None = None, limit: int = 100,
                 before: int | None = None) -> list[dict[str, Any]]:
    """Erasures, newest first (or the one named), with the blocks rewritten for each and their positions; with
    ``before``, only those requested before that log index (the next page: the last row's ``seq``)."""
    sql = f"SELECT {_SELECT} FROM erasures WHERE 1"
    args: list[object] = []
    if erasure is not None:
        sql += " AND id = ?"
        args.append(erasure)
    if before is not None:
        sql += " AND seq < ?"
        args.append(before)
    rows = []
    for r in conn.execute(sql + " ORDER BY seq DESC LIMIT ?", [*args, limit]).fetchall():
        row = dict(zip(COLUMNS, r, strict=True))
        row["topics"] = json.loads(row["topics"])
        row["watermarks"] = json.loads(row["watermarks"])
        row["blocks"] = [
            {"old": b[0], "new": b[1], "group": b[2], "generation": b[3], "rows_removed": b[4],
             "old_files": json.loads(b[5]), "new_files": json.loads(b[6]), "rewritten_at": b[7],
             "old_prefix": b[8], "new_prefix": b[9]}
            for b in conn.execute("SELECT old_block, new_block, grp, generation, rows_removed, old_files, new_files, "
                                  "rewritten_at, old_prefix, new_prefix FROM erasure_blocks WHERE erasure = ? "
                                  "ORDER BY rewritten_at, old_block", (row["id"],))]
        row["positions"] = [list(p) for p in conn.execute(
            "SELECT topic, partition, offset, incarnation FROM erasure_positions WHERE erasure = ? "
            "ORDER BY topic, partition, offset, incarnation", (row["id"],))]
        rows.append(row)
    return rows
