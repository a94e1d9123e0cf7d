"""``BucketIndexReader``: a tenant's blocks with one GET and no LIST (seed 001's querier side).

Sequence::

    first query of a tenant     GET <tenant>/bucket-index.json.gz, parse, cache       1 GET, 0 LIST
    later queries               answered from memory                                  0 calls
    every refresh_interval      the background thread re-GETs every cached tenant     1 GET per tenant
                                (parsing it only if its bytes changed), and drops
                                tenants unused for idle_timeout
    index older than            StaleIndexError, unless stale-tolerant mode
    max_stale_period            (config.deltas) can bring the view up to date:

    stale-tolerant catch-up     LIST the deltas after the index's watermark           1 LIST
                                GET the index again                                   1 GET
                                GET each delta not seen before, apply in key order    1 GET per new delta

The index is GET *after* the LIST on purpose: a writer deletes deltas only after writing an index that holds
them, so the index read after the listing is at least as new as any deletion that happened before it, and the
listing holds every delta after that index's watermark. Reading the index first would let a writer write a newer
index and delete deltas in between, and the reader would apply a listing with a hole in it.

In stale-tolerant mode the view is fresh as of the later of the index's ``updated_at`` and the log time of the
newest change its deltas reach, following their links from the index's tenant version without a hole, whose
digest of the tenant the view matches (``deltas.follow_chain``): a producer that stopped between its commit and
its delta leaves a hole no later delta covers, and a delta that carries less than its change leaves a view that
matches no digest. If that is still older than ``max_stale_period`` (no delta newer than the index, a hole, a
change the deltas did not carry, or a delta that cannot be read before the newer ones), the reader refuses with
``StaleIndexError``. Deltas are applied only
while the index itself is stale: a fresh index is answered as it is, exactly as the metastore (or the scan) wrote it.

Live blocks are the index's blocks that are not marked for deletion and not HealthyOverlapped
(``model.live_blocks``). Thread-safe: queries on cached fresh tenants take no lock but the cache's.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from prometheus_client import Counter, Gauge

from shale.block import BlockMeta, bucket_index_key, meta_key, parse_meta
from shale.bucketindex.deltas import IndexDelta, follow_chain, list_deltas, read_delta
from shale.bucketindex.model import BucketIndex, live_blocks
from shale.config import BucketIndexConfig
from shale.errors import ConfigError, CorruptObjectError, NotFoundError, ShaleError
from shale.objstore import BucketReader

log = logging.getLogger(__name__)
LOADS = Counter("shale_bucket_index_loads_total",
                "Bucket index GETs by readers, by outcome: ok, unchanged (same bytes as cached), not_found, "
                "corrupt, error.", ["outcome"])
READER_AGE = Gauge("shale_bucket_index_reader_age_seconds",
                   "Seconds since the updated_at of the bucket index a reader holds, per cached tenant.", ["tenant"])
DELTA_LISTS = Counter("shale_bucket_index_delta_lists_total",
                      "LISTs of bucket index deltas by readers whose index was stale (stale-tolerant mode).")
DELTA_READS = Counter("shale_bucket_index_delta_reads_total",
                      "GETs of bucket index deltas by readers whose index was stale (stale-tolerant mode).")


META_READS = Counter("shale_bucket_index_meta_reads_total",
                     "GETs of a block's meta.json by bucket index readers, for the Kafka ranges and row groups that "
                     "index entries leave out (full_meta; cached).")
FULL_META_CACHE = 1_000_000
"""How much of the full metas a reader keeps, most recently used first, in Kafka ranges and row groups (plus one
per block): what their memory grows with. A block of 10,000 partitions weighs about 20,000 (a megabyte of
meta.json), so about 50 such blocks, or thousands of small ones."""


class StaleIndexError(ShaleError):
    """A tenant's bucket index (with any deltas) is older than ``bucket_index.max_stale_period``: an answer
    could miss blocks, so the reader refuses. The message names the tenant, the age, the limit and what to do."""


@dataclass
class _Entry:
    index: BucketIndex
    """The index as read from the bucket."""
    digest: bytes
    """A digest of the index's bytes: a refresh that reads the same bytes keeps the parsed index."""
    view: BucketIndex
    """What queries see: the index, with deltas applied while the index is stale."""
    fresh_at: float
    live: list[BlockMeta]
    last_used: float
    deltas: dict[str, IndexDelta] = field(default_factory=dict)
    """Deltas after the index's watermark read so far (immutable, so kept until an index folds them)."""
    gap: str = ""
    """A delta key that could not be read: coverage stops before it."""
    hole: int | None = None
    """The tenant version after which a change announced no delta (its producer stopped between commit and
    delta): freshness stops there."""
    unverified: int | None = None
    """The newest tenant version the deltas reached whose digest the view did not match: its change (or one
    before it) was not carried by the deltas."""


class BucketIndexReader:
    """Per-tenant bucket indexes, loaded on first use and kept fresh in the background (see the module
    docstring for the calls each step costs). ``refresh_interval`` overrides the configured one."""

    def __init__(self, bucket: BucketReader, config: BucketIndexConfig, clock: Callable[[], float] = time.time,
                 *, refresh_interval: float | None = None) -> None:
        self.bucket = bucket
        self.config = config
        self.clock = clock
        self.refresh_interval = config.refresh_interval if refresh_interval is None else refresh_interval
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()
        self._tenant_locks: dict[str, threading.Lock] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._full: OrderedDict[str, tuple[BlockMeta, int]] = OrderedDict()
        self._full_weight = 0

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> BucketIndexReader:
        """Start the background refresh. Costs no request: tenants are loaded on first use."""
        if self.refresh_interval <= 0:
            raise ConfigError(f"bucket_index.refresh_interval = {self.refresh_interval}: the background refresh "
                              "needs a positive interval, like '60s'")
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="shale-bucket-index-refresh", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def __enter__(self) -> BucketIndexReader:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.wait(self.refresh_interval):
            try:
                self.refresh_now()
            except Exception:
                log.exception("bucket index refresh failed; retrying next period")

    # -- queries --------------------------------------------------------------------------------

    def blocks(self, tenant: str) -> list[BlockMeta]:
        """The tenant's readable blocks in id order: not marked for deletion, not HealthyOverlapped."""
        return list(self._current(tenant).live)

    def full_meta(self, meta: BlockMeta) -> BlockMeta:
        """The block with its Kafka ranges and row groups: ``meta`` itself if it has them (an entry of a version 1
        index, or of a delta), else its meta.json (one GET, then cached: a meta.json never changes). A meta.json
        that is not this block's is a ``CorruptObjectError``; a missing one a ``NotFoundError`` (the block was
        deleted since the index was written: the caller's view is out of date)."""
        if not meta.summary:
            return meta
        with self._lock:
            cached = self._full.get(meta.id)
            if cached is not None:
                self._full.move_to_end(meta.id)
                return cached[0]
        key = meta_key(meta)
        META_READS.inc()
        full = parse_meta(self.bucket.get(key), where=key, block_id=meta.id)
        if (full.tenant, full.group, [d.name for d in full.datasets]) != (
                meta.tenant, meta.group, [d.name for d in meta.datasets]):
            raise CorruptObjectError(f"{key}: meta.json of block {meta.id} disagrees with its bucket index entry "
                                     f"(tenant, group or datasets); rebuild the index with `shale bucket index "
                                     f"--tenant {meta.tenant}`", key=key, block_id=meta.id)
        with self._lock:
            if meta.id not in self._full:
                weight = 1 + len(full.kafka) + sum(len(d.row_groups) for d in full.datasets)
                self._full[meta.id] = (full, weight)
                self._full_weight += weight
            while self._full_weight > FULL_META_CACHE and len(self._full) > 1:
                self._full_weight -= self._full.popitem(last=False)[1][1]
        return full

    def generations(self, tenant: str) -> list[tuple[str, int, int, int]] | None:
        """The tenant's generation switches as its index records them (None: the index could not know them)."""
        generations = self._current(tenant).view.generations
        return None if generations is None else [(topic, start, end, g) for topic, start, end, g in generations]

    def index(self, tenant: str) -> BucketIndex:
        """The tenant's index as queries see it (with deltas applied in stale-tolerant mode), under the same
        loading and staleness rules as ``blocks``."""
        return self._current(tenant).view

    def tenants(self) -> list[str]:
        """The tenants cached right now."""
        with self._lock:
            return sorted(self._entries)

    def _current(self, tenant: str) -> _Entry:
        now = self.clock()
        with self._lock:
            entry = self._entries.get(tenant)
            if entry is not None:
                entry.last_used = now
                if self._fresh(entry, now):
                    return entry
        with self._tenant_lock(tenant):
            entry = self._entries.get(tenant)
            if entry is None:
                index, digest = self._get(tenant)
                entry = self._store(tenant, self._build(index, digest, {}, "", now), now)
            if self._fresh(entry, now):
                return entry
            if self.config.deltas:
                entry = self._catch_up(tenant, entry, now)
                if self._fresh(entry, now):
                    return entry
            raise StaleIndexError(self._stale_message(tenant, entry, now))

    # -- refresh --------------------------------------------------------------------------------

    def refresh_now(self) -> None:
        """Re-GET every cached tenant's index (catching up on deltas if it is stale), and drop tenants unused
        for ``idle_timeout``. A failed refresh keeps the cached index and is retried next period."""
        now = self.clock()
        for tenant in self.tenants():
            with self._tenant_lock(tenant):
                with self._lock:
                    entry = self._entries.get(tenant)
                    if entry is None:
                        continue
                    if now - entry.last_used >= self.config.idle_timeout:
                        del self._entries[tenant]
                        READER_AGE.remove(tenant)
                        log.info("bucket index dropped: tenant unused", extra={"tenant": tenant})
                        continue
                try:
                    if self.config.deltas and not self._fresh(entry, now):
                        self._catch_up(tenant, entry, now)
                    else:
                        index, digest = self._get(tenant, entry)
                        if index is not entry.index:
                            kept = {k: d for k, d in entry.deltas.items() if k > index.watermark}
                            self._store(tenant, self._build(index, digest, kept, _gap_after(entry.gap, index), now),
                                        entry.last_used)
                except ShaleError as exc:
                    log.warning("bucket index refresh failed; keeping the cached one",
                                extra={"tenant": tenant, "error": str(exc)})

    # -- internals ------------------------------------------------------------------------------

    def _tenant_lock(self, tenant: str) -> threading.Lock:
        with self._lock:
            return self._tenant_locks.setdefault(tenant, threading.Lock())

    def _fresh(self, entry: _Entry, now: float) -> bool:
        return now - entry.fresh_at <= self.config.max_stale_period

    def _get(self, tenant: str, cached: _Entry | None = None) -> tuple[BucketIndex, bytes]:
        """GET and parse the tenant's index, with the digest of its bytes. If they equal the ``cached`` entry's,
        its parsed index is returned as it is: validating hundreds of block metas is most of a load's cost."""
        key = bucket_index_key(tenant)
        try:
            data = self.bucket.get(key)
        except NotFoundError:
            LOADS.labels("not_found").inc()
            raise NotFoundError(
                f"{self.bucket.url}: tenant {tenant} has no bucket index at {key}. Build it from the bucket with "
                f"`shale bucket index --tenant {tenant}`, or start the metastore, whose leader writes it.") from None
        except ShaleError:
            LOADS.labels("error").inc()
            raise
        digest = hashlib.blake2b(data, digest_size=16).digest()
        if cached is not None and cached.digest == digest:
            LOADS.labels("unchanged").inc()
            return cached.index, digest
        try:
            index = BucketIndex.parse(data, tenant=tenant, key=key)
        except CorruptObjectError:
            LOADS.labels("corrupt").inc()
            raise
        LOADS.labels("ok").inc()
        return index, digest

    def _build(self, index: BucketIndex, digest: bytes, deltas: dict[str, IndexDelta], gap: str,
               now: float) -> _Entry:
        if not (self.config.deltas and now - index.updated_at > self.config.max_stale_period):
            return _Entry(index, digest, index, index.updated_at, live_blocks(index), now, deltas, gap)
        # Only deltas before an unreadable one: what follows it may depend on it.
        chain = follow_chain(index, {k: d for k, d in deltas.items() if not gap or k < gap})
        fresh_at = index.updated_at
        if chain.time is not None:  # a clock ahead of ours must not make the view look fresher than now
            fresh_at = max(fresh_at, min(now, chain.time))
        return _Entry(index, digest, chain.view, fresh_at, live_blocks(chain.view), now, deltas, gap, chain.hole,
                      chain.unverified)

    def _store(self, tenant: str, entry: _Entry, last_used: float) -> _Entry:
        entry = replace(entry, last_used=last_used)
        with self._lock:
            self._entries[tenant] = entry
        READER_AGE.labels(tenant).set(max(0.0, self.clock() - entry.index.updated_at))
        return entry

    def _catch_up(self, tenant: str, entry: _Entry, now: float) -> _Entry:
        """One LIST of the deltas after the cached index's watermark, then the index again, then the new deltas
        (see the module docstring for why in this order). Caller holds the tenant's lock."""
        listed = list_deltas(self.bucket, tenant, entry.index.watermark)
        DELTA_LISTS.inc()
        index, digest = self._get(tenant, entry)
        deltas = {k: d for k, d in entry.deltas.items() if k > index.watermark}
        gap = _gap_after(entry.gap, index)
        for info in listed:
            if info.key <= index.watermark or info.key in deltas or (gap and info.key >= gap):
                continue
            try:
                deltas[info.key] = read_delta(self.bucket, tenant, info.key)
            except (NotFoundError, CorruptObjectError) as exc:
                log.warning("bucket index delta unreadable; the view stops before it",
                            extra={"tenant": tenant, "key": info.key, "error": str(exc)})
                gap = info.key
                break
            finally:
                DELTA_READS.inc()
        return self._store(tenant, self._build(index, digest, deltas, gap, now), entry.last_used)

    def _stale_message(self, tenant: str, entry: _Entry, now: float) -> str:
        age, limit = now - entry.index.updated_at, self.config.max_stale_period
        text = (f"the bucket index of tenant {tenant} ({bucket_index_key(tenant)}) was updated {age:.0f}s ago, more "
                f"than bucket_index.max_stale_period = {limit:.0f}s, so queries could miss blocks and this reader "
                "refuses to answer.")
        if not self.config.deltas:
            text += " Stale-tolerant mode (bucket_index.deltas) is off."
        elif entry.gap:
            text += f" Stale-tolerant mode stopped at an unreadable delta {entry.gap}."
        elif entry.hole is not None:
            text += (f" A change after version {entry.hole} of the tenant announced no delta (its producer stopped "
                     "between its commit and its delta), so later deltas cannot vouch for the view.")
        elif entry.unverified is not None:
            text += (f" The deltas up to version {entry.unverified} of the tenant do not carry every change the "
                     "metastore made (the view does not match its digest), so they cannot vouch for the view.")
        elif entry.fresh_at > entry.index.updated_at:
            text += f" Its newest delta is {now - entry.fresh_at:.0f}s old, which is not enough either."
        else:
            text += " No delta newer than the index covers the gap."
        return text + (" Check that the metastore leader is running and writing indexes (metric "
                       "shale_bucket_index_age_seconds), or rebuild the index from the bucket with "
                       f"`shale bucket index --tenant {tenant}`.")


def _gap_after(gap: str, index: BucketIndex) -> str:
    """An unreadable delta stops coverage only while the index has not folded it."""
    return gap if gap > index.watermark else ""
