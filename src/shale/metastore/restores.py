"""The restore journal: every run of ``shale restore`` (issue 28), recorded in the replicated state so that who
wrote what into which Kafka cluster, and when, outlives the restore's own process and terminal.

A run is recorded twice: ``running`` before its first record is sent, and ``done`` or ``stopped`` at its end. A
run killed in between stays ``running`` until the next run of the same job starts, which ends it as
``interrupted`` (the job resumes from its committed progress; see DESIGN 17). Times are the log entries' leader
timestamps. The journal keeps the newest ``KEPT`` runs; older rows are dropped (the state is not an archive).

The rows live in the index's ``restores`` table, written only here, inside the apply transaction.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from shale.errors import CommandRejectedError
from shale.index import IndexWriter
from shale.metastore.commands import RecordRestore, Result

KEPT = 1000
_COLUMNS = ("run", "seq", "job", "state", "by", "tenant", "topic", "incarnation", "target", "range", "records",
            "message", "started_at", "ended_at")
_SELECT = ", ".join(f'"{c}"' for c in _COLUMNS)


def apply_record(w: IndexWriter, cmd: RecordRestore, index: int, time_ms: int) -> Result:
    conn = w.conn
    row = conn.execute("SELECT state, started_at, seq FROM restores WHERE run = ?", (cmd.run,)).fetchone()
    if cmd.state == "running":
        if row is not None:  # the same start again (a retried request): nothing changes
            if row[0] != "running":
                raise CommandRejectedError(f"restore run {cmd.run} has ended ({row[0]}); a new run needs a new id",
                                           reason="conflict")
            return Result(ok=True, data={"run": cmd.run, "replay": True})
        conn.execute("UPDATE restores SET state = 'interrupted', ended_at = ? WHERE job = ? AND state = 'running'",
                     (time_ms, cmd.job))
        _save(conn, cmd, index, started_at=time_ms, ended_at=0)
        conn.execute("DELETE FROM restores WHERE seq <= (SELECT seq FROM restores ORDER BY seq DESC "
                     "LIMIT 1 OFFSET ?)", (KEPT,))
        return Result(ok=True, data={"run": cmd.run, "replay": False})
    if row is not None and row[0] == cmd.state:
        return Result(ok=True, data={"run": cmd.run, "replay": True})
    # An end without its start (the start's row was dropped as old, or never written) is still recorded.
    started_at, seq = (row[1], row[2]) if row is not None else (time_ms, index)
    _save(conn, cmd, seq, started_at=started_at, ended_at=time_ms)
    return Result(ok=True, data={"run": cmd.run, "replay": False})


def _save(conn: sqlite3.Connection, cmd: RecordRestore, seq: int, *, started_at: int, ended_at: int) -> None:
    conn.execute(f"INSERT OR REPLACE INTO restores ({_SELECT}) VALUES ({', '.join('?' * len(_COLUMNS))})",
                 (cmd.run, seq, cmd.job, cmd.state, cmd.by, cmd.tenant, cmd.topic, cmd.incarnation, cmd.target,
                  cmd.range, cmd.records, cmd.message, started_at, ended_at))


def restore_rows(conn: sqlite3.Connection, limit: int = 100) -> list[dict[str, Any]]:
    """The newest runs first, as the API and the status page show them."""
    rows = conn.execute(f"SELECT {_SELECT} FROM restores ORDER BY seq DESC LIMIT ?", (limit,))
    return [dict(zip(_COLUMNS, r, strict=True)) for r in rows]
