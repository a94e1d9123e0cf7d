"""Ingest leases (seed 003's leases, for ingest drivers): one driver process holds each shard of an ingest group's
generation, and every commit it sends carries the lease's fencing token.

A lease is timed by the replicated log: it expires ``duration_ms`` after the entry that acquired or last renewed it,
by the entries' leader timestamps, never by a replica's clock. Its fencing token is the log index of the entry that
granted it, so a later lease always has a larger token. A commit is accepted only with the current token of an
unexpired lease, and renews it; so a driver that paused (a long GC, SIGSTOP, a partitioned machine) past its lease
cannot commit once it resumes, even if no other driver took over. A shard that was never leased takes commits
without a token (writers that do not lease: reprocess jobs, tests, callers older than leases); once leased, never
again (a release ends the lease but keeps its row).

The state lives in the index's ``ingest_leases`` table, written only here, inside the apply transaction.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

from shale.errors import CommandRejectedError
from shale.index import IndexWriter
from shale.metastore.commands import (
    AcquireIngestLease,
    CommitIngestBatch,
    ReleaseIngestLease,
    RenewIngestLease,
    Result,
)

LEASE_REASONS = frozenset({"lease-required", "stale-lease", "lease-expired", "no-lease"})
"""The reasons a commit or a renewal is refused because its writer does not hold the shard's lease."""
_COLUMNS = "grp, generation, shard, holder, token, acquired_at, expires_at, duration_ms, takeovers"


@dataclass
class Lease:
    group: str
    generation: int
    shard: int
    holder: str
    token: int
    acquired_at: int
    expires_at: int
    duration_ms: int
    takeovers: int

    def row(self, now_ms: int) -> dict[str, Any]:
        """As the API, the metrics and the status page show it (``holder`` is empty once released or expired)."""
        live = self.expires_at > now_ms
        return {"group": self.group, "generation": self.generation, "shard": self.shard,
                "holder": self.holder if live else "", "last_holder": self.holder, "token": self.token,
                "acquired_at": self.acquired_at, "expires_at": self.expires_at, "takeovers": self.takeovers,
                "age_ms": max(0, now_ms - self.acquired_at) if live else 0}


def _lease(conn: sqlite3.Connection, group: str, generation: int, shard: int) -> Lease | None:
    row = conn.execute(f"SELECT {_COLUMNS} FROM ingest_leases WHERE grp = ? AND generation = ? AND shard = ?",
                       (group, generation, shard)).fetchone()
    return Lease(*row) if row else None


def _save(conn: sqlite3.Connection, lease: Lease) -> None:
    conn.execute(f"INSERT OR REPLACE INTO ingest_leases ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                 (lease.group, lease.generation, lease.shard, lease.holder, lease.token, lease.acquired_at,
                  lease.expires_at, lease.duration_ms, lease.takeovers))


def leases(conn: sqlite3.Connection) -> list[Lease]:
    """Every shard's lease (a read connection or the writer's)."""
    return [Lease(*r) for r in conn.execute(f"SELECT {_COLUMNS} FROM ingest_leases ORDER BY grp, generation, shard")]


def _answer(lease: Lease, granted: bool, now_ms: int) -> Result:
    return Result(ok=True, data={"granted": granted, **lease.row(now_ms)})


def apply_acquire(w: IndexWriter, cmd: AcquireIngestLease, index: int, time_ms: int) -> Result:
    lease = _lease(w.conn, cmd.group, cmd.generation, cmd.shard)
    if lease is not None and lease.expires_at > time_ms:
        if lease.holder != cmd.holder:
            return _answer(lease, False, time_ms)  # a standby: it asks again, and takes over once this expires
        lease.expires_at = time_ms + cmd.duration_ms  # the holder's retry: the same lease, extended
        lease.duration_ms = cmd.duration_ms
    else:
        takeovers = lease.takeovers if lease is not None else 0
        if lease is not None and lease.holder and lease.holder != cmd.holder:
            takeovers += 1  # the previous holder let it expire without releasing it: a takeover
        lease = Lease(cmd.group, cmd.generation, cmd.shard, cmd.holder, index, time_ms, time_ms + cmd.duration_ms,
                      cmd.duration_ms, takeovers)
    _save(w.conn, lease)
    return _answer(lease, True, time_ms)


def _held(w: IndexWriter, group: str, generation: int, shard: int, token: int | None, time_ms: int) -> Lease | None:
    """The shard's lease if ``token`` is its current, unexpired token (None: the shard was never leased and no
    token was sent); else refused."""
    lease = _lease(w.conn, group, generation, shard)
    where = f"ingest {group} generation {generation} shard {shard}"
    if lease is None:
        if token is None:
            return None
        raise CommandRejectedError(f"{where} has no lease, so token {token} fences nothing: acquire the lease",
                                   reason="no-lease")
    if token is None:
        raise CommandRejectedError(f"{where} is leased (token {lease.token}): a commit must carry the lease's "
                                   "fencing token", reason="lease-required")
    if token != lease.token:
        raise CommandRejectedError(
            f"{where}: token {token} is stale, the lease is token {lease.token} of {lease.holder or 'nobody'}: "
            "another driver took the shard over; this driver must stop writing", reason="stale-lease")
    if lease.expires_at <= time_ms:
        raise CommandRejectedError(
            f"{where}: lease token {token} expired at {lease.expires_at} (log time {time_ms}): a driver that did not "
            "renew its lease in time must stop writing and acquire it again", reason="lease-expired")
    return lease


def apply_renew(w: IndexWriter, cmd: RenewIngestLease, time_ms: int) -> Result:
    lease = _held(w, cmd.group, cmd.generation, cmd.shard, cmd.token, time_ms)
    assert lease is not None
    lease.expires_at = max(lease.expires_at, time_ms + cmd.duration_ms)
    lease.duration_ms = cmd.duration_ms
    _save(w.conn, lease)
    return _answer(lease, True, time_ms)


def apply_release(w: IndexWriter, cmd: ReleaseIngestLease, time_ms: int) -> Result:
    lease = _lease(w.conn, cmd.group, cmd.generation, cmd.shard)
    if lease is None or lease.token != cmd.token or lease.expires_at <= time_ms:
        return Result(ok=True, data={"released": False})  # not (or no longer) this holder's: nothing to give up
    lease.expires_at, lease.holder = time_ms, ""  # given up, not lost: the next holder is no takeover
    _save(w.conn, lease)
    return Result(ok=True, data={"released": True})


def check_commit_lease(w: IndexWriter, cmd: CommitIngestBatch, time_ms: int) -> None:
    """Refuse a commit whose writer does not hold the shard's lease now; a commit that does renews it."""
    lease = _held(w, cmd.group, cmd.generation, cmd.shard, cmd.lease, time_ms)
    if lease is not None:
        lease.expires_at = max(lease.expires_at, time_ms + lease.duration_ms)
        _save(w.conn, lease)
