"""The driver's ingest lease (issue 30): one ``shale ingest --group G`` process holds each shard; the others wait
as standbys and take over when the lease expires.

``wait`` asks the metastore for the lease until it is granted (a standby asks every ``duration / 10``, so a takeover
comes at most that long after the expiry). Once held, a heartbeat thread renews it every ``duration / 3``, and every
commit renews it too (the state machine does, for a commit with the current token). When a renewal or a commit is
refused because the lease moved on (another driver took the shard: a stale token; the shard map changed), the lease
is lost: the driver stops writing and says so (``LeaseLostError``); its blocks not committed are orphans that the
bucket cleaner removes. Expiry alone loses nothing: a metastore outage longer than the lease leaves the token the
shard's, so the heartbeat retries until the metastore is back, and the commits dead-lettered meanwhile apply.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from typing import Any

from prometheus_client import Counter, Gauge

from shale.errors import MetastoreUnavailableError
from shale.ingest.committer import CommitTarget, LeaseLostError
from shale.metastore import AcquireIngestLease, ReleaseIngestLease, RenewIngestLease

log = logging.getLogger(__name__)
HELD = Gauge("shale_ingest_lease_held", "1 while this process holds the shard's ingest lease, 0 while it waits as "
             "a standby.", ["group", "shard", "holder"])
AGE = Gauge("shale_ingest_lease_age_seconds", "Seconds since this process acquired the shard's ingest lease "
            "(0 while a standby).", ["group", "shard"])
TAKEOVERS = Counter("shale_ingest_lease_takeovers_total", "Leases this process took over after their previous "
                    "holder let them expire (a driver lost, paused or cut off).", ["group", "shard"])


def holder_id() -> str:
    """This process, uniquely: host, process id and a random part (a restarted process is a new holder)."""
    return f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}"


class IngestLease:
    """One driver's lease on one shard of its group: ``shard`` fixes which (``--shard N``); None takes any free one
    (a standby of every shard). ``shards`` is the driver's ``ingest.shards``: it seeds the group's shard map; once
    the map exists, its count rules (``self.shards``)."""

    def __init__(self, metastore: CommitTarget, group: str, generation: int, duration: float,
                 shard: int | None = None, holder: str | None = None, shards: int = 1) -> None:
        self.metastore = metastore
        self.group, self.generation = group, generation
        self.want = shard
        self.shard = shard if shard is not None else 0
        self.configured = self.shards = shards
        self.duration_ms = int(duration * 1000)
        self.holder = holder or holder_id()
        self.token: int | None = None
        self.lost: str | None = None
        """Why the lease was lost (the metastore's refusal), once it was."""
        self.reason = ""
        """The refusal's reason code ("resharded": the shard map changed, acquire a shard again)."""
        self.acquired = 0.0
        self._warned_count = False
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
            duration_ms=self.duration_ms, shards=self.configured)).raise_for_rejection()
        data = result.data
        self.shards = int(data.get("shards", 1))
        if self.shards != self.configured and not self._warned_count:
            log.warning("the group's shard map has another shard count than ingest.shards; the map rules (change it "
                        "with shale shards set)", extra={"group": self.group, "shards": self.shards,
                                                         "configured": self.configured})
            self._warned_count = True
        return data

    def wait(self, stop: threading.Event) -> bool:
        """Acquire a shard's lease (the wanted one, else the first free one), waiting as a standby while others
        hold them; False if stopped first."""
        announced = False
        seen: dict[int, int] = {}  # each shard's takeover count as last answered while waiting
        while not stop.is_set():
            shard, data = 0, None
            try:
                while shard < (1 if self.want is not None else self.shards):
                    data = self._ask(self.want if self.want is not None else shard)
                    if data["granted"]:
                        break
                    seen[int(data["shard"])] = int(data.get("takeovers", 0))
                    shard += 1
            except MetastoreUnavailableError as exc:
                log.warning("waiting for the metastore to acquire the ingest lease",
                            extra={"group": self.group, "error": str(exc)})
                stop.wait(2.0)
                continue
            if data is not None and data["granted"]:
                self.shard = int(data["shard"])
                self.token, self.lost, self.reason, self.acquired = int(data["token"]), None, "", time.monotonic()
                self._gauges(1)
                # A takeover: its holder let it expire while this process waited (not a release, not a reshard).
                takeover = announced and int(data["takeovers"]) > seen.get(self.shard, int(data["takeovers"]))
                if takeover:
                    TAKEOVERS.labels(*self._labels).inc()
                log.info("ingest lease taken over from a standby wait: this process writes the shard" if takeover
                         else "ingest lease acquired: this process writes the shard", extra={
                    "group": self.group, "shard": self.shard, "shards": self.shards, "holder": self.holder,
                    "token": self.token, "takeover": takeover})
                return True
            if not announced and data is not None:
                log.info("standby: another process holds the ingest lease; taking over when it expires", extra={
                    "group": self.group, "shard": self.want if self.want is not None else "any",
                    "shards": self.shards, "holder": data["holder"], "expires_at": data["expires_at"],
                    "no_such_shard": data.get("reason") == "no-such-shard"})
                announced = True
            stop.wait(max(0.2, self.duration_ms / 10_000))
        return False

    def reset(self) -> None:
        """Forget a lost lease (before acquiring a shard again after the shard map changed)."""
        self.token, self.lost, self.reason = None, None, ""

    def renew(self) -> None:
        """Extend the lease now; ``LeaseLostError`` if the metastore refuses (the lease moved on)."""
        self.check()
        assert self.token is not None
        result = self.metastore.submit(RenewIngestLease(
            group=self.group, generation=self.generation, shard=self.shard, holder=self.holder, token=self.token,
            duration_ms=self.duration_ms))
        if not result.ok:
            self.lose(result.message, result.reason)
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
