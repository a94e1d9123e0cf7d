"""Ingest leases (seed 003's leases, for ingest drivers): one driver process holds each shard of an ingest group's
generation, and every commit it sends carries the lease's fencing token.

A lease is timed by the replicated log: it expires ``duration_ms`` after the entry that acquired or last renewed it,
by the entries' leader timestamps, never by a replica's clock. Its fencing token is the log index of the entry that
granted it, so a later lease always has a larger token.

The token, not the clock, says who may write: a commit is accepted with the shard's current token and refused with
any other. Expiry only decides when another driver may take the shard over (a new grant, a new token). So a lease
that expired with nobody taking it over is still its holder's: its commits (a batch dead-lettered during a metastore
outage longer than the lease, replayed afterwards) and its renewals are accepted and renew it, by the log's time.
A driver that paused past its lease is fenced exactly when another driver took the shard meanwhile. A released
lease takes its holder's commits (nobody else wrote since) but no renewal: it stays released. A shard that was
never leased takes commits without a token (writers that do not lease: reprocess jobs, tests, callers older than
leases); once leased, never again (a release ends the lease but keeps its row).

The log's time runs only while the log does. A silence in the log longer than half a lease (``BRIDGED_SILENCE``; a
live holder renews every third of a lease) means nobody could reach the metastore: it was stopped, or had no quorum.
Standbys write nothing while the holder renews (they watch the lease rows with reads); once its renewals stop for
``shale.ingest.lease.SUSPECT`` of a lease they ask for it every tenth of a lease, before the log has been silent
long enough to bridge, so its time runs on to the expiry. ``bridge_silence``, run before every entry, adds such a
silence to every lease that was live when it began, so an outage neither expires a lease nor hands the shard to the
first standby to get through once it ends; the holder's dead-lettered commits and heartbeats come in as before the
outage. This only delays takeovers (by at most one lease, for a holder that died during the silence); fencing never
depends on it, since the token decides.

The state lives in the index's lease store (``shale.index.leases``: the ``ingest_leases`` table, and the log's last
entry time), written only from here, inside the apply transaction.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

from shale.errors import CommandRejectedError
from shale.index import IndexWriter, ShardMap, placement, shard_map, shard_maps
from shale.index import leases as store
from shale.metastore.rules.commands import (
    AcquireIngestLease,
    CommitIngestBatch,
    ReleaseIngestLease,
    RenewIngestLease,
    Result,
)
from shale.metastore.rules.shards import MAX_SHARDS, resize, seed

LEASE_REASONS = frozenset({"lease-required", "stale-lease", "lease-expired", "no-lease", "resharded"})
"""The reasons a commit or a renewal is refused because its writer does not hold the shard's lease."""


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

    def live(self, now_ms: int, version: int) -> bool:
        """Unexpired, and granted under the group's current shard map (a lease older than the map's version, whose
        token is a smaller log index, no longer holds its shard)."""
        return self.expires_at > now_ms and self.token >= version

    def row(self, now_ms: int, version: int = 0, shards: int = 1) -> dict[str, Any]:
        """As the API, the metrics and the status page show it (``holder`` is empty once released, expired or
        resharded)."""
        live = self.live(now_ms, version)
        return {"group": self.group, "generation": self.generation, "shard": self.shard, "shards": shards,
                "holder": self.holder if live else "", "last_holder": self.holder, "token": self.token,
                "acquired_at": self.acquired_at, "expires_at": self.expires_at, "takeovers": self.takeovers,
                "age_ms": max(0, now_ms - self.acquired_at) if live else 0}


def _lease(conn: sqlite3.Connection, group: str, generation: int, shard: int) -> Lease | None:
    row = store.lease(conn, group, generation, shard)
    return Lease(*row) if row else None


def _save(conn: sqlite3.Connection, lease: Lease) -> None:
    store.save_lease(conn, (lease.group, lease.generation, lease.shard, lease.holder, lease.token, lease.acquired_at,
                            lease.expires_at, lease.duration_ms, lease.takeovers))


def leases(conn: sqlite3.Connection) -> list[Lease]:
    """Every shard's lease (a read connection or the writer's)."""
    return [Lease(*r) for r in store.leases(conn)]


def lease_rows(conn: sqlite3.Connection, now_ms: int, group: str | None = None) -> list[dict[str, Any]]:
    """Every shard of every leased group as the API, the metrics and the status page show it: one row per shard of
    the group's shard map, a shard never leased yet with no holder (so the no-holder alert sees it), and none for
    shards beyond the map's count (left from a larger count)."""
    maps = shard_maps(conn)
    found = {(x.group, x.generation, x.shard): x for x in leases(conn)}
    keys = set(found) | {(g, n, s) for (g, n), m in maps.items() for s in range(m.shards)}
    rows = []
    for key in sorted(keys):
        if group is not None and key[0] != group:
            continue
        current = maps.get(key[:2])
        version, shards = (current.version, current.shards) if current else (0, 1)
        if current is not None and key[2] >= shards:
            continue
        lease = found.get(key) or Lease(*key, holder="", token=0, acquired_at=0, expires_at=0, duration_ms=0,
                                        takeovers=0)
        rows.append(lease.row(now_ms, version, shards))
    return rows


BRIDGED_SILENCE = 0.5
"""A silence in the log longer than this share of a lease was an outage (module docstring): above a holder's
heartbeat period (a third) with room for its latency; below what a lease renewed on time has left (two thirds)."""


def bridge_silence(w: IndexWriter, time_ms: int) -> None:
    """Before an entry at ``time_ms``: add the silence since the previous entry to every lease that was live when it
    began, if it was longer than ``BRIDGED_SILENCE`` of that lease (module docstring). Deterministic: log times only."""
    last = store.log_time(w.conn)
    if time_ms <= last:
        return
    store.set_log_time(w.conn, time_ms)
    if last:
        store.extend_leases(w.conn, time_ms - last, last, BRIDGED_SILENCE)


def _answer(lease: Lease, granted: bool, now_ms: int, version: int, shards: int) -> Result:
    return Result(ok=True, data={"granted": granted, **lease.row(now_ms, version, shards)})


def _vacant(lease: Lease | None, now_ms: int, version: int) -> bool:
    """A shard of an automatic group that nobody holds and nobody is coming back to: never leased, or its lease of
    the current map released or expired, or its lease of an older map (released or not) not replaced within a lease
    of its expiry (its holder learns of the change at its next heartbeat and acquires again once its batch ends; a
    map that shrank after a release gives the drivers left that long to fill the shard)."""
    if lease is None:
        return True
    if lease.token >= version:
        return not lease.holder or lease.expires_at <= now_ms
    return lease.expires_at + lease.duration_ms <= now_ms


def _shrink(w: IndexWriter, group: str, generation: int, current: ShardMap, index: int, time_ms: int,
            keep: int | None = None) -> ShardMap:
    """An automatic group's map without its vacant shards (``keep``: the asker's own, never vacant): the count
    becomes the number of shards held or about to be held again, at a new version (every lease is resharded)."""
    rows = {x.shard: x for x in leases(w.conn) if (x.group, x.generation) == (group, generation)}
    vacant = [s for s in range(current.shards) if s != keep and _vacant(rows.get(s), time_ms, current.version)]
    if not vacant:
        return current
    return resize(w, group, generation, max(1, current.shards - len(vacant)), index, time_ms, removed=vacant)


def _free(w: IndexWriter, cmd: AcquireIngestLease, current: ShardMap, time_ms: int) -> int | None:
    """The shard an automatic driver gets: the one it holds under this map (a retry); else, of the shards nobody
    holds, the one it asked for or the lowest, first those nobody is coming back to (released, never leased,
    vacant), then those whose holder under the older map may still come back for (the driver left out grows the
    map)."""
    rows = {x.shard: x for x in leases(w.conn) if (x.group, x.generation) == (cmd.group, cmd.generation)}
    own = [s for s, x in rows.items() if s < current.shards and x.holder == cmd.holder and x.token >= current.version]
    order = [*own, cmd.shard, *range(current.shards)]
    free = [s for s in order if s < current.shards and (rows.get(s) is None or rows[s].holder == cmd.holder
                                                        or not rows[s].live(time_ms, current.version))]
    for shard in free:
        lease = rows.get(shard)
        if lease is None or lease.holder in ("", cmd.holder) or _vacant(lease, time_ms, current.version):
            return int(shard)
    return int(free[0]) if free else None


def apply_acquire(w: IndexWriter, cmd: AcquireIngestLease, index: int, time_ms: int) -> Result:
    current = seed(w, cmd.group, cmd.generation, 1 if cmd.auto else cmd.shards)
    if cmd.auto:  # the count follows the live drivers: drop vacant shards, then grow if every shard is held
        current = _shrink(w, cmd.group, cmd.generation, current, index, time_ms)
        shard = _free(w, cmd, current, time_ms)
        if shard is None and current.shards < MAX_SHARDS:
            current, shard = resize(w, cmd.group, cmd.generation, current.shards + 1, index, time_ms), current.shards
        cmd = cmd.model_copy(update={"shard": shard if shard is not None else cmd.shard})
    lease = _lease(w.conn, cmd.group, cmd.generation, cmd.shard)
    if cmd.shard >= current.shards:  # left from a larger count, or a driver's --shard beyond the map
        return Result(ok=True, data={"granted": False, "group": cmd.group, "generation": cmd.generation,
                                     "shard": cmd.shard, "shards": current.shards, "holder": "", "expires_at": 0,
                                     "reason": "no-such-shard"})
    if lease is not None and lease.live(time_ms, current.version) and lease.holder != cmd.holder:
        # a standby: it asks again, and takes over once this expires
        return _answer(lease, False, time_ms, current.version, current.shards)
    if lease is not None and lease.holder == cmd.holder and lease.token >= current.version:
        # The holder's retry, live or expired with nobody taking over: the same lease (token), extended.
        lease.expires_at = time_ms + cmd.duration_ms
        lease.duration_ms = cmd.duration_ms
    else:
        takeovers = lease.takeovers if lease is not None else 0
        if (lease is not None and lease.holder and lease.holder != cmd.holder
                and lease.token >= current.version):
            takeovers += 1  # the previous holder let it expire without releasing it: a takeover (not a reshard)
        lease = Lease(cmd.group, cmd.generation, cmd.shard, cmd.holder, index, time_ms, time_ms + cmd.duration_ms,
                      cmd.duration_ms, takeovers)
    _save(w.conn, lease)
    answer = _answer(lease, True, time_ms, current.version, current.shards)
    # The partitions the map placed (shale.metastore.rules.shards), as [topic, partition, shard]: the driver reads those
    # of its shard, and the others that hash to it. They change only with the map's version, which ends this lease.
    placed = placement(w.conn, cmd.group, cmd.generation)
    answer.data["placement"] = [[t, p, s] for (t, p), s in sorted(placed.items())]
    return answer


def _held(w: IndexWriter, group: str, generation: int, shard: int, token: int | None) -> Lease | None:
    """The shard's lease if ``token`` is its current token, expired or not (None: the shard was never leased and no
    token was sent); else refused. Nobody took the shard since ``token`` was granted: its writer is still the only
    one."""
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
    current = shard_map(w.conn, group, generation)
    resharded = current is not None and (token < current.version or shard >= current.shards)
    if token != lease.token and not resharded:
        raise CommandRejectedError(
            f"{where}: token {token} is stale, the lease is token {lease.token} of {lease.holder or 'nobody'}: "
            "another driver took the shard over; this driver must stop writing", reason="stale-lease")
    if resharded:  # granted before the map changed (the shard may have a new holder already under the new map)
        assert current is not None
        raise CommandRejectedError(
            f"{where}: lease token {token} was granted before the group's shard count changed to {current.shards} "
            f"(map version {current.version}): the driver must acquire a shard again under the new map",
            reason="resharded")
    return lease


def apply_renew(w: IndexWriter, cmd: RenewIngestLease, index: int, time_ms: int) -> Result:
    lease = _held(w, cmd.group, cmd.generation, cmd.shard, cmd.token)
    assert lease is not None
    if not lease.holder:
        raise CommandRejectedError(
            f"ingest {cmd.group} generation {cmd.generation} shard {cmd.shard}: lease token {cmd.token} was released "
            f"at {lease.expires_at}: a driver that gave its lease up must acquire it again", reason="lease-expired")
    lease.expires_at = max(lease.expires_at, time_ms + cmd.duration_ms)
    lease.duration_ms = cmd.duration_ms
    _save(w.conn, lease)
    current = shard_map(w.conn, cmd.group, cmd.generation)
    if cmd.auto and current is not None:  # a member that left (released, or silent for a lease): shrink
        current = _shrink(w, cmd.group, cmd.generation, current, index, time_ms, keep=cmd.shard)
    version, shards = (current.version, current.shards) if current else (0, 1)
    answer = _answer(lease, True, time_ms, version, shards)
    answer.data["version"] = version  # above the token: the map changed, the driver acquires a shard again
    return answer


def apply_release(w: IndexWriter, cmd: ReleaseIngestLease, time_ms: int) -> Result:
    lease = _lease(w.conn, cmd.group, cmd.generation, cmd.shard)
    current = shard_map(w.conn, cmd.group, cmd.generation)
    version = current.version if current else 0
    if lease is None or lease.token != cmd.token or not lease.holder or lease.token < version:
        return Result(ok=True, data={"released": False})  # not (or no longer) this holder's: nothing to give up
    lease.expires_at, lease.holder = time_ms, ""  # given up, not lost: the next holder is no takeover
    _save(w.conn, lease)
    return Result(ok=True, data={"released": True})


def check_commit_lease(w: IndexWriter, cmd: CommitIngestBatch, time_ms: int) -> None:
    """Refuse a commit whose writer's lease was taken over (or resharded); a commit that holds it renews it (an
    expired one too: nobody took it), unless it was released (it stays released)."""
    lease = _held(w, cmd.group, cmd.generation, cmd.shard, cmd.lease)
    if lease is not None and lease.holder:
        lease.expires_at = max(lease.expires_at, time_ms + lease.duration_ms)
        _save(w.conn, lease)
