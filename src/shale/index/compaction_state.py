"""The compaction service's store: the planner's queues, the scheduler's jobs, each worker's last poll answer, and
settings. The tables are declared here (``DDL`` and the queue's ``QUEUE_INDEX``, created by the index schema)
beside the only code that reads and writes them; what a plan changes is decided by ``shale.compaction`` (pure)
and ``shale.metastore.rules.compaction_service``.

Blocks join the queue when they are added to the index and leave it when a job takes them or when they leave
the index; a job dropped before it completed (its sources changed) gives its surviving sources back to the queue.
The queue is a flag on the index's ``blocks`` rows (``queued``, with a partial index in arrival order: added time,
then id), so adding a block writes one row, not two. Everything here runs inside the metastore's apply transaction
(writes) or on a read connection.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from shale.compaction import DAY_MS, Job, JobStatus, QueuedBlock, QueueKey

DDL = """
CREATE TABLE IF NOT EXISTS compaction_jobs (
    name TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    shard INTEGER NOT NULL,
    level INTEGER NOT NULL,
    grp TEXT NOT NULL,
    generation INTEGER NOT NULL,
    sources TEXT NOT NULL,
    raw_bytes INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    status INTEGER NOT NULL,
    token INTEGER NOT NULL,
    lease_expires_at INTEGER NOT NULL,
    failures INTEGER NOT NULL,
    worker TEXT NOT NULL
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS compaction_polls (
    worker TEXT PRIMARY KEY,
    request TEXT NOT NULL,
    applied_at INTEGER NOT NULL,
    answer TEXT NOT NULL
) WITHOUT ROWID;
"""

# The compaction queue: the blocks whose ``queued`` is 1, in arrival order. Created after the index's migrations,
# which run on tables without the column.
QUEUE_INDEX = "CREATE INDEX IF NOT EXISTS blocks_queued ON blocks (added_at, id) WHERE queued = 1;"

_JOB_COLUMNS = ("name, tenant, shard, level, grp, generation, sources, raw_bytes, created_at, status, token, "
                "lease_expires_at, failures, worker")


def _job(row: tuple[object, ...]) -> Job:
    (name, tenant, shard, level, grp, generation, sources, raw_bytes, created_at, status, token, lease,
     failures, worker) = row
    return Job(str(name), QueueKey(str(tenant), int(shard), int(level), str(grp), int(generation)),  # type: ignore[call-overload]
               json.loads(str(sources)), int(raw_bytes), int(created_at), JobStatus(int(status)), int(token),  # type: ignore[call-overload]
               int(lease), int(failures), str(worker))  # type: ignore[call-overload]


class CompactionState:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    # -- queue ---------------------------------------------------------------------------------------

    def requeue(self, block_ids: list[str]) -> None:
        """Put blocks back in the queue (those still in the index)."""
        self.conn.executemany("UPDATE blocks SET queued = 1 WHERE id = ?", [(b,) for b in block_ids])

    def dequeue(self, block_ids: list[str]) -> None:
        self.conn.executemany("UPDATE blocks SET queued = 0 WHERE id = ?", [(b,) for b in block_ids])

    def queued(self) -> list[QueuedBlock]:
        return [QueuedBlock(r[0], QueueKey(r[1], r[2], r[3], r[4], r[5]), r[6], r[7],
                            r[8] // DAY_MS if r[4] == "partition" else 0) for r in self.conn.execute(
            "SELECT b.id, t.value, b.shard, b.level, g.value, b.generation, b.raw_bytes, b.added_at, b.min_time "
            "FROM blocks b INDEXED BY blocks_queued JOIN strings t ON t.id = b.tenant JOIN strings g ON g.id = b.grp "
            "WHERE b.queued = 1 ORDER BY b.added_at, b.id")]

    def queued_ids(self, block_ids: list[str]) -> set[str]:
        found: set[str] = set()
        for i in range(0, len(block_ids), 500):
            chunk = block_ids[i:i + 500]
            found.update(r[0] for r in self.conn.execute(
                f"SELECT id FROM blocks WHERE queued = 1 AND id IN ({','.join('?' * len(chunk))})", chunk))
        return found

    # -- jobs ----------------------------------------------------------------------------------------

    def jobs(self) -> list[Job]:
        return [_job(r) for r in self.conn.execute(f"SELECT {_JOB_COLUMNS} FROM compaction_jobs ORDER BY name")]

    def job(self, name: str) -> Job | None:
        row = self.conn.execute(f"SELECT {_JOB_COLUMNS} FROM compaction_jobs WHERE name = ?", (name,)).fetchone()
        return _job(row) if row else None

    def job_names(self, low: str, high: str, limit: int = -1) -> list[str]:
        """The names of the jobs from ``low`` up to ``high`` (excluded), in order; at most ``limit`` (-1: all)."""
        return [r[0] for r in self.conn.execute(
            "SELECT name FROM compaction_jobs WHERE name >= ? AND name < ? ORDER BY name LIMIT ?", (low, high, limit))]

    def save_job(self, job: Job) -> None:
        k = job.key
        self.conn.execute(
            f"INSERT OR REPLACE INTO compaction_jobs ({_JOB_COLUMNS}) VALUES ({', '.join('?' * 14)})",
            (job.name, k.tenant, k.shard, k.level, k.group, k.generation, json.dumps(job.sources), job.raw_bytes,
             job.created_at, int(job.status), job.token, job.lease_expires_at, job.failures, job.worker))

    def delete_job(self, name: str) -> None:
        self.conn.execute("DELETE FROM compaction_jobs WHERE name = ?", (name,))

    # -- poll answers ----------------------------------------------------------------------------------

    def poll_answer(self, worker: str, request: str) -> dict[str, Any] | None:
        """The answer given to ``worker``'s poll ``request``, if that poll was applied and is still remembered."""
        row = self.conn.execute("SELECT answer FROM compaction_polls WHERE worker = ? AND request = ?",
                                (worker, request)).fetchone()
        answer: dict[str, Any] | None = json.loads(row[0]) if row else None
        return answer

    def save_poll_answer(self, worker: str, request: str, applied_at: int, answer: dict[str, Any]) -> None:
        """Remember a worker's last poll answer (one per worker: a worker retries only its last poll)."""
        self.conn.execute("INSERT OR REPLACE INTO compaction_polls (worker, request, applied_at, answer) "
                          "VALUES (?, ?, ?, ?)", (worker, request, applied_at, json.dumps(answer, sort_keys=True)))

    def forget_poll_answers(self, before: int) -> None:
        self.conn.execute("DELETE FROM compaction_polls WHERE applied_at < ?", (before,))

    # -- settings ------------------------------------------------------------------------------------

    def failure_limit(self) -> int:
        row = self.conn.execute("SELECT value FROM settings WHERE key = 'compaction_failure_limit'").fetchone()
        return int(row[0]) if row else 3

    def set_failure_limit(self, limit: int) -> None:
        self.conn.execute("INSERT OR REPLACE INTO settings (key, value) VALUES ('compaction_failure_limit', ?)",
                          (limit,))
