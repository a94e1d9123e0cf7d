"""The restore journal's store: the ``restores`` table, its reads and its writes. One row per run of ``shale
restore``; what a run's record changes (a replayed start, an end without its start, the ``KEPT`` newest runs) is
decided by ``shale.metastore.rules.restores``, inside the apply transaction."""

from __future__ import annotations

import sqlite3
from typing import Any

DDL = """
CREATE TABLE IF NOT EXISTS restores (
    run TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    job TEXT NOT NULL,
    state TEXT NOT NULL,
    by TEXT NOT NULL,
    tenant TEXT NOT NULL,
    topic TEXT NOT NULL,
    incarnation TEXT NOT NULL,
    target TEXT NOT NULL,
    range TEXT NOT NULL,
    records INTEGER NOT NULL,
    message TEXT NOT NULL,
    started_at INTEGER NOT NULL,
    ended_at INTEGER NOT NULL
) WITHOUT ROWID;
"""
COLUMNS = ("run", "seq", "job", "state", "by", "tenant", "topic", "incarnation", "target", "range", "records",
           "message", "started_at", "ended_at")
_SELECT = ", ".join(f'"{c}"' for c in COLUMNS)


def run_state(conn: sqlite3.Connection, run: str) -> tuple[str, int, int] | None:
    """A run's state, start time and sequence number, if it is recorded."""
    row = conn.execute("SELECT state, started_at, seq FROM restores WHERE run = ?", (run,)).fetchone()
    return None if row is None else (row[0], row[1], row[2])


def interrupt_running(conn: sqlite3.Connection, job: str, at: int) -> None:
    """End the job's runs left ``running`` as ``interrupted``."""
    conn.execute("UPDATE restores SET state = 'interrupted', ended_at = ? WHERE job = ? AND state = 'running'",
                 (at, job))


def save(conn: sqlite3.Connection, row: dict[str, Any]) -> None:
    """Write a run's row (every one of ``COLUMNS``), replacing the run's earlier one."""
    conn.execute(f"INSERT OR REPLACE INTO restores ({_SELECT}) VALUES ({', '.join('?' * len(COLUMNS))})",
                 tuple(row[c] for c in COLUMNS))


def keep_newest(conn: sqlite3.Connection, kept: int) -> None:
    """Drop every run but the ``kept`` newest."""
    conn.execute("DELETE FROM restores WHERE seq <= (SELECT seq FROM restores ORDER BY seq DESC "
                 "LIMIT 1 OFFSET ?)", (kept,))


def restore_rows(conn: sqlite3.Connection, limit: int = 100) -> list[dict[str, Any]]:
    """The newest runs first, as the API and the status page show them."""
    rows = conn.execute(f"SELECT {_SELECT} FROM restores ORDER BY seq DESC LIMIT ?", (limit,))
    return [dict(zip(COLUMNS, r, strict=True)) for r in rows]
