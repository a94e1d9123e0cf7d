"""The coordination-free way to build a tenant's bucket index: from a bucket scan (``shale.block.BlockFetcher``),
for deployments without a metastore and for `shale bucket index --tenant T`.

What the scan puts in the index, and why:

* **Healthy** blocks (complete and older than ``sync_delay``): seed 001 indexes complete blocks only.
* **HealthyOverlapped** blocks too: they are complete, and readers apply the same full-overlap rule to the
  index's entries (``model.live_blocks``), so they skip them exactly as a bucket scanner does, while tools that
  read the index still see what is in the bucket until the cleaner marks them.
* **Marked** blocks that still have a meta.json, with their marks (seed 001 lists marked blocks and marks);
  readers skip them.
* Not **Fresh** blocks: seed 000 trusts no block younger than the sync delay, and an index must not make a
  reader trust what a bucket scanner would not. Pass ``sync_delay=0`` to index every complete block at once.
* Not **Partial** blocks: they have no loadable meta.json.

Deltas (stale-tolerant mode) are listed *before* the scan, so every listed delta's block is in the scan's
LIST; a delta counts as held by the index unless one of its added blocks is still Fresh (``fold_watermark``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from shale.block import BlockFetcher, BlockState
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
from shale.bucketindex.store import DEFAULT_ATTEMPTS, publish, read_index
from shale.bucketindex.writer import TenantWrite
from shale.objstore import Bucket, BucketReader

INDEXED_STATES = (BlockState.HEALTHY, BlockState.HEALTHY_OVERLAPPED, BlockState.MARKED_FOR_DELETION)


def _scan(bucket: BucketReader, tenant: str, sync_delay: float, clock: Callable[[], float], deltas: bool,
          after: str, margin: float,
          generations: list[tuple[str, int, int, int]] | None = None) -> tuple[BucketIndex, list[str]]:
    """The index, and every delta key present (for the cleanup after a write)."""
    now = clock()
    present = list_deltas(bucket, tenant) if deltas else []
    listed = read_listed(bucket, tenant, [i for i in present if i.key > after])
    result = BlockFetcher(bucket, sync_delay, clock).sync(tenant)
    views = [v for v in result.blocks.values() if v.state in INDEXED_STATES and v.meta is not None]
    fresh = {v.id for v in result.blocks.values() if v.state is BlockState.FRESH}

    def reflected(delta: IndexDelta) -> bool:
        return not any(b.id in fresh for b in delta.added)

    # A Fresh block becomes Healthy after the sync delay, so only a block whose id lies in the future can stay
    # Fresh longer; its delta is folded once the sync delay and the margin have passed.
    give_up = max(UNREFLECTED_DELTA_LIMIT, sync_delay + margin)
    watermark = fold_watermark(listed, reflected, now, after, margin, give_up)
    marks = [IndexedMark(id=v.id, deletion_time=v.mark.deletion_time, reason=v.mark.reason)
             for v in result.blocks.values() if v.mark is not None]
    uploaded = {v.id: max(o.last_modified for o in v.objects) for v in views if v.objects}
    index = BucketIndex.build(tenant, now, [v.meta for v in views if v.meta is not None], marks, uploaded,
                              watermark=watermark, generations=generations)
    return index, [i.key for i in present]


def scan_index(bucket: BucketReader, tenant: str, sync_delay: float, clock: Callable[[], float] = time.time, *,
               deltas: bool = True, after: str = "", margin: float = DELTA_MARGIN) -> BucketIndex:
    """The tenant's index from one bucket scan: two LISTs and a GET per meta.json and mark (seed 000's sync),
    plus, with ``deltas``, one LIST of the deltas and a GET of each one after ``after``. Writes nothing."""
    return _scan(bucket, tenant, sync_delay, clock, deltas, after, margin)[0]


def write_scanned_index(bucket: Bucket, tenant: str, sync_delay: float, clock: Callable[[], float] = time.time, *,
                        deltas: bool = True, attempts: int = DEFAULT_ATTEMPTS,
                        margin: float = DELTA_MARGIN) -> TenantWrite:
    """Scan the tenant and write its index conditionally (merging with a concurrent writer's change), then
    delete the deltas the new index folded. What `shale bucket index --tenant T` runs."""
    base = read_index(bucket, tenant, replace_corrupt=True)
    # A scan cannot see generation switches (they live in the metastore): the current index's are kept.
    index, present = _scan(bucket, tenant, sync_delay, clock, deltas, base.index.watermark if base else "", margin,
                           base.index.generations if base else None)
    published = publish(bucket, index, base, attempts)
    deleted = delete_folded(bucket, present, published.stored.index.watermark)
    return TenantWrite(tenant, published.stored, published.conflicts, deleted)
