"""The restore journal: every run of ``shale restore`` (issue 28), recorded in the replicated state so that who
wrote what into which Kafka cluster, and when, outlives the restore's own process and terminal.

A run is recorded twice: ``running`` before its first record is sent, and ``done`` or ``stopped`` at its end. A
run killed in between stays ``running`` until the next run of the same job starts, which ends it as
``interrupted`` (the job resumes from its committed progress; see DESIGN 17). Times are the log entries' leader
timestamps. The journal keeps the newest ``KEPT`` runs; older rows are dropped (the state is not an archive).

The rows live in the index's restore store (``shale.index.restores``), written only from here, inside the apply
transaction.
"""

from __future__ import annotations

from shale.errors import CommandRejectedError
from shale.index import IndexWriter, restore_rows
from shale.index import restores as store
from shale.metastore.rules.commands import RecordRestore, Result

KEPT = 1000
__all__ = ["KEPT", "apply_record", "restore_rows"]


def apply_record(w: IndexWriter, cmd: RecordRestore, index: int, time_ms: int) -> Result:
    conn = w.conn
    row = store.run_state(conn, cmd.run)
    if cmd.state == "running":
        if row is not None:  # the same start again (a retried request): nothing changes
            if row[0] != "running":
                raise CommandRejectedError(f"restore run {cmd.run} has ended ({row[0]}); a new run needs a new id",
                                           reason="conflict")
            return Result(ok=True, data={"run": cmd.run, "replay": True})
        store.interrupt_running(conn, cmd.job, time_ms)
        store.save(conn, {**cmd.model_dump(), "seq": index, "started_at": time_ms, "ended_at": 0})
        store.keep_newest(conn, KEPT)
        return Result(ok=True, data={"run": cmd.run, "replay": False})
    if row is not None and row[0] == cmd.state:
        return Result(ok=True, data={"run": cmd.run, "replay": True})
    # An end without its start (the start's row was dropped as old, or never written) is still recorded.
    started_at, seq = (row[1], row[2]) if row is not None else (time_ms, index)
    store.save(conn, {**cmd.model_dump(), "seq": seq, "started_at": started_at, "ended_at": time_ms})
    return Result(ok=True, data={"run": cmd.run, "replay": False})
