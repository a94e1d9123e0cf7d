"""``BucketIndexWriter``: the metastore leader writes every tenant's bucket index from its own state.

Seed 001 has the compactor write the index because it scans the bucket anyway; in Shale the metastore already
holds every tenant's blocks and tombstones, so the leader writes the index without a single bucket scan.

When a tenant is written (``run_once``): its version (the log index of its last change) differs from the one
last written and ``debounce`` seconds have passed since that change was first seen — a burst of ingest commits
makes one write, and a steady stream one write per two of the server's looks (it looks every ``debounce``: a
change is first seen at one look and written at the next) — or ``rewrite_interval`` has passed since its last
write, so an index's ``updated_at`` stays fresh while nothing changes.

One write, in this order:

1. The base: the version this writer wrote last (kept in memory), or HEAD + GET of the current index.
2. Stale-tolerant mode: one LIST of the deltas, and a GET of each one after the base's watermark not seen before.
   Listing *before* reading the source is what makes folding safe: a producer writes its delta only after its
   change is in the metastore, so every listed delta's change is in the source read next.
3. The source: the tenant's blocks (``tenant_blocks``) and tombstones (``tenant_tombstones``, as deletion marks).
4. The watermark (``deltas.fold_watermark``): the newest listed delta the source reflects, older than the margin.
5. A conditional write (``store.publish``), merging on conflict; then the deltas up to the watermark are deleted.

The writer must run on the leader only (call ``run_once`` where the maintenance loop checks leadership): a
deposed leader's frozen state would otherwise keep rewriting an old view every ``rewrite_interval``.
Not thread-safe: one loop calls ``run_once``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import Counter, Gauge

from shale.block import BlockMeta
from shale.bucketindex.deltas import (
    DELTA_MARGIN,
    UNREFLECTED_DELTA_LIMIT,
    IndexDelta,
    delete_folded,
    fold_watermark,
    list_deltas,
    read_listed,
)
from shale.bucketindex.model import BucketIndex, IndexedMark
from shale.bucketindex.store import DEFAULT_ATTEMPTS, StoredIndex, publish, read_index
from shale.config import BucketIndexConfig
from shale.errors import ShaleError
from shale.objstore import Bucket

log = logging.getLogger(__name__)
INDEX_AGE = Gauge("shale_bucket_index_age_seconds",
                  "Seconds since the updated_at of the last bucket index this writer wrote, per tenant.", ["tenant"])
INDEX_WRITES = Counter("shale_bucket_index_writes_total",
                       "Bucket index writes per tenant, by outcome: written, merged (after a conflict), failed.",
                       ["tenant", "outcome"])


class Tombstone(Protocol):
    """A block removed from the source whose objects are still in the bucket (``shale.index.TombstoneRow``)."""

    @property
    def block_id(self) -> str: ...

    @property
    def created_at(self) -> int:
        """Milliseconds since the epoch."""
        ...

    @property
    def reason(self) -> str: ...


class IndexSource(Protocol):
    """What the writer reads. The metastore's ``shale.index.IndexReader`` satisfies it structurally; it is
    declared here because ``shale.bucketindex`` sits below ``shale.index`` in the layering (docs/DESIGN.md 1)."""

    def tenant_versions(self) -> dict[str, int]:
        """Per tenant, a number that changes whenever its blocks or tombstones change."""
        ...

    def tenant_blocks(self, tenant: str) -> list[BlockMeta]: ...

    def tenant_tombstones(self, tenant: str) -> Sequence[Tombstone]: ...

    def generation_rules(self, tenant: str) -> list[tuple[str, int, int, int]]:
        """The tenant's generation switches, oldest first: (topic, start ms, end ms, generation)."""
        ...


@dataclass
class _Tenant:
    written_version: int | None = None
    written_at: float | None = None
    dirty_since: float | None = None
    stored: StoredIndex | None = None
    """The version this writer wrote last: the base of its next write (None: read the bucket's)."""
    updated_at: float | None = None
    """The updated_at of the last index written, kept after a failure so that the age metric keeps growing."""


@dataclass(frozen=True)
class TenantWrite:
    """One index written: the stored version, the conflicts merged on the way, and the deltas deleted."""

    tenant: str
    stored: StoredIndex
    conflicts: int
    deleted_deltas: int


class BucketIndexWriter:
    """Writes the bucket index of every tenant ``source`` knows. ``last_writes`` holds what the latest
    ``run_once`` wrote (stored versions, conflicts merged, deltas deleted), for logs and tests."""

    def __init__(self, bucket: Bucket, source: IndexSource, config: BucketIndexConfig,
                 clock: Callable[[], float] = time.time, *, attempts: int = DEFAULT_ATTEMPTS,
                 delta_margin: float = DELTA_MARGIN,
                 unreflected_delta_limit: float = UNREFLECTED_DELTA_LIMIT) -> None:
        self.bucket = bucket
        self.source = source
        self.config = config
        self.clock = clock
        self.attempts = attempts
        self.delta_margin = delta_margin
        self.unreflected_delta_limit = unreflected_delta_limit
        self._tenants: dict[str, _Tenant] = {}
        self._deltas: dict[str, IndexDelta] = {}
        self.last_writes: list[TenantWrite] = []

    def run_once(self) -> list[str]:
        """Write the tenants that are due (see the module docstring); return their names. A tenant whose write
        fails is logged, counted and retried on the next call; the others are still written."""
        now = self.clock()
        written: list[str] = []
        self.last_writes = []
        for tenant, version in sorted(self.source.tenant_versions().items()):
            state = self._tenants.setdefault(tenant, _Tenant())
            if version != state.written_version and state.dirty_since is None:
                state.dirty_since = now
            changed = state.dirty_since is not None and now - state.dirty_since >= self.config.debounce
            due = state.written_at is not None and now - state.written_at >= self.config.rewrite_interval
            if not (changed or due):
                continue
            try:
                result = self.write_tenant(tenant)
            except ShaleError as exc:
                INDEX_WRITES.labels(tenant, "failed").inc()
                log.error("bucket index write failed; retrying next run",
                          extra={"tenant": tenant, "error": str(exc)})
                continue
            state.written_version, state.written_at = version, now
            state.updated_at = result.stored.index.updated_at
            state.dirty_since = None
            written.append(tenant)
            self.last_writes.append(result)
        for tenant, state in self._tenants.items():
            if state.updated_at is not None:
                INDEX_AGE.labels(tenant).set(max(0.0, now - state.updated_at))
        return written

    def write_tenant(self, tenant: str) -> TenantWrite:
        """Write one tenant's index now, whatever its version (``run_once`` decides when)."""
        state = self._tenants.setdefault(tenant, _Tenant())
        base = state.stored if state.stored is not None else read_index(self.bucket, tenant, replace_corrupt=True)
        after = base.index.watermark if base else ""
        # The whole prefix, so that deltas a failed cleanup left at or before the watermark are deleted now.
        present = list_deltas(self.bucket, tenant) if self.config.deltas else []
        deltas = read_listed(self.bucket, tenant, [i for i in present if i.key > after], self._deltas)
        now = self.clock()
        # The version before the blocks: a change between the two reads is then held but not claimed, so a
        # reader follows one delta link too many, never one too few.
        version = self.source.tenant_versions().get(tenant, 0)
        blocks = self.source.tenant_blocks(tenant)
        tombstones = self.source.tenant_tombstones(tenant)
        live = {b.id for b in blocks}
        gone = {t.block_id for t in tombstones}

        def reflected(delta: IndexDelta) -> bool:
            return (all(b.id in live or b.id in gone for b in delta.added)
                    and not any(block_id in live for block_id in delta.removed)
                    and not any(m.id in live for m in delta.marks))

        watermark = fold_watermark(deltas, reflected, now, after, self.delta_margin, self.unreflected_delta_limit)
        before = base.index.uploaded if base else {}
        desired = BucketIndex.build(
            tenant, now, blocks,
            [IndexedMark(id=t.block_id, deletion_time=t.created_at / 1000, reason=t.reason) for t in tombstones],
            {b.id: before.get(b.id, now) for b in blocks}, watermark=watermark,
            generations=self.source.generation_rules(tenant), tenant_version=version)
        try:
            published = publish(self.bucket, desired, base, self.attempts)
        except ShaleError:
            state.stored = None  # read the bucket's version next time instead of trusting ours
            raise
        INDEX_WRITES.labels(tenant, "merged" if published.conflicts else "written").inc()
        state.stored = published.stored
        deleted = delete_folded(self.bucket, [i.key for i in present], published.stored.index.watermark)
        for item in deltas:
            if item.key <= published.stored.index.watermark:
                self._deltas.pop(item.key, None)
        log.info("bucket index written", extra={"tenant": tenant, "blocks": len(blocks),
                                                "conflicts": published.conflicts, "deltas_deleted": deleted})
        return TenantWrite(tenant, published.stored, published.conflicts, deleted)

    def loop(self, stop: threading.Event, interval: float, is_leader: Callable[[], bool] = lambda: True) -> None:
        """Call ``run_once`` every ``interval`` seconds while ``is_leader()``, until ``stop`` is set."""
        while not stop.is_set():
            try:
                if is_leader():
                    self.run_once()
            except Exception:
                log.exception("bucket index writer pass failed; retrying next period")
            stop.wait(interval)
