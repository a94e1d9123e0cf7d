"""The driver's ingest lease (issue 30): one ``shale ingest --group G`` process holds each shard; the others wait
as standbys and take over when the lease expires.

``wait`` asks the metastore for the lease until it is granted (a standby asks every ``duration / 10``, so a takeover
comes at most that long after the expiry). Once held, a heartbeat thread renews it every ``duration / 3``, and every
commit renews it too (the state machine does, for a commit with the current token). When a renewal or a commit is
refused because the lease moved on (stale token, expiry), the lease is lost: the driver stops writing and says so
(``LeaseLostError``); its blocks not committed are orphans that the bucket cleaner removes.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid

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
    def __init__(self, metastore: CommitTarget, group: str, generation: int, duration: float, shard: int = 0,
                 holder: str | None = None) -> None:
        self.metastore = metastore
        self.group, self.generation, self.shard = group, generation, shard
        self.duration_ms = int(duration * 1000)
        self.holder = holder or holder_id()
        self.token: int | None = None
        self.lost: str | None = None
        """Why the lease was lost (the metastore's refusal), once it was."""
        self.acquired = 0.0
        self._labels = (group, str(shard))
        HELD.labels(*self._labels, self.holder).set(0)
        AGE.labels(*self._labels).set(0)
        TAKEOVERS.labels(*self._labels)

    def wait(self, stop: threading.Event) -> bool:
        """Acquire the lease, waiting as a standby while another process holds it; False if stopped first."""
        announced = False
        while not stop.is_set():
            try:
                result = self.metastore.submit(AcquireIngestLease(
                    group=self.group, generation=self.generation, shard=self.shard, holder=self.holder,
                    duration_ms=self.duration_ms)).raise_for_rejection()
            except MetastoreUnavailableError as exc:
                log.warning("waiting for the metastore to acquire the ingest lease",
                            extra={"group": self.group, "error": str(exc)})
                stop.wait(2.0)
                continue
            data = result.data
            if data["granted"]:
                self.token, self.lost, self.acquired = int(data["token"]), None, time.monotonic()
                HELD.labels(*self._labels, self.holder).set(1)
                if announced:
                    TAKEOVERS.labels(*self._labels).inc()
                log.info("ingest lease taken over from a standby wait: this process writes the shard" if announced
                         else "ingest lease acquired: this process writes the shard", extra={
                    "group": self.group, "shard": self.shard, "holder": self.holder, "token": self.token,
                    "takeover": announced})
                return True
            if not announced:
                log.info("standby: another process holds the ingest lease; taking over when it expires", extra={
                    "group": self.group, "shard": self.shard, "holder": data["holder"],
                    "expires_at": data["expires_at"]})
                announced = True
            stop.wait(max(0.2, self.duration_ms / 10_000))
        return False

    def renew(self) -> None:
        """Extend the lease now; ``LeaseLostError`` if the metastore refuses (the lease moved on)."""
        self.check()
        assert self.token is not None
        result = self.metastore.submit(RenewIngestLease(
            group=self.group, generation=self.generation, shard=self.shard, holder=self.holder, token=self.token,
            duration_ms=self.duration_ms))
        if not result.ok:
            self.lose(result.message)
        AGE.labels(*self._labels).set(time.monotonic() - self.acquired)

    def lose(self, why: str) -> None:
        self.lost = why
        HELD.labels(*self._labels, self.holder).set(0)
        AGE.labels(*self._labels).set(0)
        log.error("ingest lease lost: this process stops writing (its uncommitted blocks are orphans)", extra={
            "group": self.group, "shard": self.shard, "holder": self.holder, "token": self.token, "reason": why})
        self.check()

    def check(self) -> None:
        if self.lost is not None:
            raise LeaseLostError(f"ingest {self.group} shard {self.shard}: this process lost its lease (token "
                                 f"{self.token}) and stops writing: {self.lost}")

    def heartbeat(self, stop: threading.Event) -> threading.Thread:
        """Renew the lease every third of its duration until ``stop`` or the loss of the lease (the thread holds it
        while a batch runs too: a batch may take longer than the lease)."""
        def beat() -> None:
            while not stop.wait(self.duration_ms / 3000) and self.lost is None:
                try:
                    self.renew()
                except LeaseLostError:
                    return
                except Exception as exc:  # the metastore unreachable: try again; the lease may expire meanwhile
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
