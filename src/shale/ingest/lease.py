"""The driver's ingest lease (issue 30): one ``shale ingest --group G`` process holds each shard; the others wait
as standbys and take over when the lease expires.

``wait`` watches the group's lease rows with a read that writes nothing to the log, and asks for a shard's lease (an
entry in the log) only when the shard is free (never leased, expired, released, or of an older shard map) or its
holder has stopped renewing; it then asks every ``duration / 10`` until granted, so a takeover comes at most that
long after the expiry. While a holder renews, its standbys write nothing. Once held, a heartbeat thread renews it
every ``duration / 3``, and every commit renews it too (the state machine does, for a commit with the current
token). When a renewal or a commit is refused because the lease moved on (another driver took the shard: a stale
token; the shard map changed), the lease is lost: the driver stops writing and says so (``LeaseLostError``); its
blocks not committed are orphans that the bucket cleaner removes. Expiry alone loses nothing: a metastore outage
longer than the lease leaves the token the shard's, so the heartbeat retries until the metastore is back, and the
commits dead-lettered meanwhile apply.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from typing import Any, Protocol

from prometheus_client import Counter, Gauge

from shale.errors import MetastoreUnavailableError
from shale.ingest.committer import CommitTarget, LeaseLostError
from shale.metastore import BRIDGED_SILENCE, AcquireIngestLease, ReleaseIngestLease, RenewIngestLease, shard_of

log = logging.getLogger(__name__)
HELD = Gauge("shale_ingest_lease_held", "1 while this process holds the shard's ingest lease, 0 while it waits as "
             "a standby.", ["group", "shard", "holder"])
AGE = Gauge("shale_ingest_lease_age_seconds", "Seconds since this process acquired the shard's ingest lease "
            "(0 while a standby).", ["group", "shard"])
TAKEOVERS = Counter("shale_ingest_lease_takeovers_total", "Leases this process took over after their previous "
                    "holder let them expire (a driver lost, paused or cut off).", ["group", "shard"])

SUSPECT = 0.4
"""A standby starts asking for a held shard once its lease has not changed for this share of a lease: a holder renews
every third of it. Below ``BRIDGED_SILENCE`` with room for a read period and the renewal's latency, so that the first
ask after a holder's last renewal does not find the log silent long enough to bridge (and extend) the lease."""
assert SUSPECT + 2 / 30 < BRIDGED_SILENCE


class LeaseTarget(CommitTarget, Protocol):
    """What a driver's lease needs from the metastore (the embedded service and the HTTP client both fit)."""

    def ingest_leases(self, group: str | None = None) -> list[dict[str, Any]]: ...


def holder_id() -> str:
    """This process, uniquely: host, process id and a random part (a restarted process is a new holder)."""
    return f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}"


class IngestLease:
    """One driver's lease on one shard of its group: ``shard`` fixes which (``--shard N``); None takes any free one
    (a standby of every shard). ``shards`` is the driver's ``ingest.shards``: it seeds the group's shard map; once
    the map exists, its count rules (``self.shards``). ``"auto"``: the count follows the group's live drivers (a
    driver that finds every shard held grows the map and takes the new shard; vacant shards shrink it)."""

    def __init__(self, metastore: LeaseTarget, group: str, generation: int, duration: float,
                 shard: int | None = None, holder: str | None = None, shards: int | str = 1) -> None:
        if shards == "auto" and shard is not None:
            raise ValueError("a driver of a fixed --shard cannot follow an automatic shard count")
        self.metastore = metastore
        self.group, self.generation = group, generation
        self.want = shard
        self.shard = shard if shard is not None else 0
        self.auto = shards == "auto"
        self.configured = self.shards = 1 if self.auto else int(shards)
        self.full = False
        """An automatic group at its largest count refused to grow: this driver waits as a standby."""
        self.duration_ms = int(duration * 1000)
        self.holder = holder or holder_id()
        self.token: int | None = None
        self.lost: str | None = None
        """Why the lease was lost (the metastore's refusal), once it was."""
        self.reason = ""
        """The refusal's reason code ("resharded": the shard map changed, acquire a shard again)."""
        self.acquired = 0.0
        self.previous_ms: int | None = None
        """When the lease this process was granted last had been acquired by its previous holder (the log's ms;
        None: the shard was never leased before): that holder's batches were all planned after it."""
        self.placement: dict[tuple[str, int], int] = {}
        """The partitions the group's map placed by load, with their shards (from the grant; the rest hash)."""
        self.ask_period = max(0.2, self.duration_ms / 10_000)
        """A standby asks for one shard at most this often (a tenth of a lease, as a takeover may lag its expiry)."""
        self.poll_period = max(0.1, self.duration_ms / 30_000)
        """A standby reads the lease rows this often (``SUSPECT`` and two of these stay under ``BRIDGED_SILENCE`` for
        leases of 3 s and more)."""
        self._warned_count = False
        self._announced = False
        self._seen: dict[int, int] = {}  # each shard's takeover count as last seen while waiting
        self._watched: dict[int, tuple[tuple[int, int, str], float]] = {}  # each shard's lease, and when it changed
        self._asked: dict[int, float] = {}  # when this process last asked for each shard
        if shard is not None:
            self._gauges(0)

    @property
    def _labels(self) -> tuple[str, str]:
        return self.group, str(self.shard)

    def _gauges(self, held: int) -> None:
        HELD.labels(*self._labels, self.holder).set(held)
        AGE.labels(*self._labels).set(0)
        TAKEOVERS.labels(*self._labels)

    def _ask(self, shard: int) -> dict[str, Any]:
        result = self.metastore.submit(AcquireIngestLease(
            group=self.group, generation=self.generation, shard=shard, holder=self.holder,
            duration_ms=self.duration_ms, shards=self.configured, auto=self.auto)).raise_for_rejection()
        data = result.data
        self.shards = int(data.get("shards", 1))
        self.full = self.auto and not data["granted"]
        if self.shards != self.configured and not self._warned_count and not self.auto:
            log.warning("the group's shard map has another shard count than ingest.shards; the map rules (change it "
                        "with shale shards set)", extra={"group": self.group, "shards": self.shards,
                                                         "configured": self.configured})
            self._warned_count = True
        return data

    def wait(self, stop: threading.Event) -> bool:
        """Acquire a shard's lease (the wanted one, else the first free one), waiting as a standby while others
        hold them; False if stopped first. A standby watches the lease rows with a read (``step``) and writes to
        the log only when a shard it may take is free or its holder stopped renewing."""
        while not stop.is_set():
            try:
                data = self.step(time.monotonic())
            except MetastoreUnavailableError as exc:
                log.warning("waiting for the metastore to acquire the ingest lease",
                            extra={"group": self.group, "error": str(exc)})
                stop.wait(2.0)
                continue
            if data is not None:
                return True
            stop.wait(self.poll_period)
        return False

    def step(self, now: float) -> dict[str, Any] | None:
        """One look at the group's lease rows (a read: nothing is written to the log) and an acquire for each shard
        this process may take that is free (never leased, expired, released, or of an older shard map) or whose
        holder has not renewed for ``SUSPECT`` of a lease (the asks then keep the log's time running, so the lease
        expires by it: a silent log would bridge it, see ``shale.metastore.rules.leases``). Asks for one shard at most
        every ``ask_period``; the shard this process held last comes first. ``now`` is a monotonic clock. Returns
        the granting answer (the lease is then this process's), else None."""
        rows = {int(r["shard"]): r for r in self.metastore.ingest_leases(self.group)
                if int(r["generation"]) == self.generation}
        if rows:
            self.shards = int(next(iter(rows.values()))["shards"])
        wanted = [self.want] if self.want is not None else sorted(range(self.shards), key=lambda s: s != self.shard)
        for shard in wanted:
            row = rows.get(shard)
            if row is not None:
                self._seen.setdefault(shard, int(row["takeovers"]))
                key = (int(row["token"]), int(row["expires_at"]), str(row["holder"]))
                if self._watched.get(shard, (None, 0.0))[0] != key:
                    self._watched[shard] = (key, now)  # the holder renewed (or the lease changed): it is alive
            if not self._may_ask(shard, row, rows, now) and not self._join(shard, now):
                continue
            self._asked[shard] = now
            data = self._ask(shard)
            if data["granted"]:
                before = row if row is not None and int(row["token"]) else None
                self.previous_ms = int(before["acquired_at"]) if before is not None else None
                return self._granted(data)
            self._seen[shard] = int(data.get("takeovers", 0))
        if not self._announced and rows:
            row = rows.get(self.want if self.want is not None else 0) or next(iter(rows.values()))
            log.info("standby: another process holds the ingest lease; taking over when it expires", extra={
                "group": self.group, "shard": self.want if self.want is not None else "any",
                "shards": self.shards, "holder": row["holder"], "expires_at": row["expires_at"],
                "no_such_shard": self.want is not None and self.want >= self.shards})
            self._announced = True
        return None

    def _may_ask(self, shard: int, row: dict[str, Any] | None, rows: dict[int, Any], now: float) -> bool:
        if now - self._asked.get(shard, -1e18) < self.ask_period:
            return False
        if row is None:  # no shard map yet (the ask seeds it), or a --shard beyond the map (wait for it to grow)
            return not rows
        if not row["holder"]:  # free: never leased, expired, released, or granted under an older map
            return True
        return now - self._watched[shard][1] >= SUSPECT * self.duration_ms / 1000

    def _join(self, shard: int, now: float) -> bool:
        """An automatic driver asks once for its preferred shard although every shard is held: the metastore grows
        the map and grants the new shard (unless the count is at its largest)."""
        return (self.auto and not self.full and shard == (self.shard if self.shard < self.shards else 0)
                and now - max(self._asked.values(), default=-1e18) >= self.ask_period)

    def _granted(self, data: dict[str, Any]) -> dict[str, Any]:
        self.shard = int(data["shard"])
        self.placement = {(str(t), int(p)): int(s) for t, p, s in data.get("placement", [])}
        self.token, self.lost, self.reason, self.acquired = int(data["token"]), None, "", time.monotonic()
        self._gauges(1)
        # A takeover: its holder let it expire while this process waited (not a release, not a reshard).
        takeover = self._announced and int(data["takeovers"]) > self._seen.get(self.shard, int(data["takeovers"]))
        if takeover:
            TAKEOVERS.labels(*self._labels).inc()
        log.info("ingest lease taken over from a standby wait: this process writes the shard" if takeover
                 else "ingest lease acquired: this process writes the shard", extra={
            "group": self.group, "shard": self.shard, "shards": self.shards, "holder": self.holder,
            "token": self.token, "takeover": takeover})
        self._announced, self._seen, self._watched, self._asked = False, {}, {}, {}
        return data

    def owner(self, topic: str, partition: int) -> int:
        """The shard that reads ``topic[partition]`` under the map this lease was granted in."""
        return self.placement.get((topic, partition), shard_of(topic, partition, self.shards))

    def reset(self) -> None:
        """Forget a lost lease (before acquiring a shard again after the shard map changed)."""
        self.token, self.lost, self.reason = None, None, ""

    def renew(self) -> None:
        """Extend the lease now; ``LeaseLostError`` if the metastore refuses (the lease moved on)."""
        self.check()
        assert self.token is not None
        result = self.metastore.submit(RenewIngestLease(
            group=self.group, generation=self.generation, shard=self.shard, holder=self.holder, token=self.token,
            duration_ms=self.duration_ms, auto=self.auto))
        if not result.ok:
            self.lose(result.message, result.reason)
            self.check()
        if int(result.data.get("version", 0)) > self.token:  # this renewal shrank the automatic group's map
            self.lose(f"the group's shard count changed to {result.data['shards']} (members left)", "resharded")
            self.check()
        AGE.labels(*self._labels).set(time.monotonic() - self.acquired)

    def lose(self, why: str, reason: str = "") -> None:
        """Record and log the loss (``check`` raises it from then on)."""
        self.lost, self.reason = why, reason or self.reason
        HELD.labels(*self._labels, self.holder).set(0)
        AGE.labels(*self._labels).set(0)
        if self.reason == "resharded":
            log.warning("ingest shard map changed: this process stops writing its shard and acquires one again "
                        "(its uncommitted blocks are orphans)", extra={
                            "group": self.group, "shard": self.shard, "holder": self.holder, "token": self.token})
        else:
            log.error("ingest lease lost: this process stops writing (its uncommitted blocks are orphans)", extra={
                "group": self.group, "shard": self.shard, "holder": self.holder, "token": self.token, "reason": why})

    def check(self) -> None:
        if self.lost is not None:
            raise LeaseLostError(f"ingest {self.group} shard {self.shard}: this process lost its lease (token "
                                 f"{self.token}) and stops writing: {self.lost}", reason=self.reason)

    def heartbeat(self, stop: threading.Event) -> threading.Thread:
        """Renew the lease every third of its duration until ``stop`` or the loss of the lease (the thread holds it
        while a batch runs too: a batch may take longer than the lease)."""
        def beat() -> None:
            while not stop.wait(self.duration_ms / 3000) and self.lost is None:
                try:
                    self.renew()
                except LeaseLostError:
                    return
                except Exception as exc:  # the metastore unreachable: try again (the outage does not end the lease)
                    log.warning("ingest lease renewal failed; retrying", extra={
                        "group": self.group, "error": f"{type(exc).__name__}: {str(exc)[:500]}"})
        thread = threading.Thread(target=beat, name=f"lease-{self.group}-{self.shard}", daemon=True)
        thread.start()
        return thread

    def release(self) -> None:
        """Give the lease up (a clean stop): a standby takes over at once. Best effort."""
        if self.token is None or self.lost is not None:
            return
        try:
            self.metastore.submit(ReleaseIngestLease(group=self.group, generation=self.generation, shard=self.shard,
                                                     holder=self.holder, token=self.token))
        except Exception as exc:
            log.warning("could not release the ingest lease; it expires by itself",
                        extra={"group": self.group, "error": str(exc)[:500]})
        HELD.labels(*self._labels, self.holder).set(0)
