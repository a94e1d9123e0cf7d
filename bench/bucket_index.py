"""Reader cold start over 100 tenants x 400 blocks on MinIO: from the bucket index, against a bucket scan, in the
same run (seed 001's motivation).

* Bucket index (Shale's reader): a new ``BucketIndexReader`` answers ``blocks(tenant)`` for every tenant: one GET
  of ``<tenant>/bucket-index.json.gz`` each, no LIST; 16 tenants at a time.
* Baseline (a reader without an index): a new ``BlockFetcher`` discovers the tenants (one LIST) and syncs each
  one: a LIST of its blocks, a LIST of its markers and a GET of every meta.json, 16 GETs at a time.

Both end with the same readable blocks for every tenant (checked). The blocks are tiny (one record each), since
only the number of objects matters here; the indexes were written by ``BucketIndexWriter`` from the metas
the writes returned (the metastore's view), before the clocks start.
"""

from __future__ import annotations

import gc
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tests.factories import write_backup_block

from bench.common import progress, timed, write_result
from bench.services import minio_bucket
from shale.block import BlockFetcher, BlockMeta, bucket_index_key
from shale.bucketindex import BucketIndexReader, BucketIndexWriter
from shale.config import BucketIndexConfig
from shale.index import TombstoneRow
from shale.objstore import open_bucket

TENANTS = 100
BLOCKS = 400
CONCURRENCY = 16


class _WrittenBlocks:
    """An index source holding what the benchmark wrote: every tenant at version 1, no tombstones."""

    def __init__(self, metas: list[BlockMeta]) -> None:
        self.blocks: dict[str, list[BlockMeta]] = {}
        for meta in metas:
            self.blocks.setdefault(meta.tenant, []).append(meta)

    def tenant_versions(self) -> dict[str, int]:
        return dict.fromkeys(self.blocks, 1)

    def tenant_blocks(self, tenant: str) -> list[BlockMeta]:
        return self.blocks[tenant]

    def tenant_tombstones(self, tenant: str) -> list[TombstoneRow]:
        return []

    def generation_rules(self, tenant: str) -> list[tuple[str, int, int, int]]:
        return []  # no generation switches: every group reads its default generation


def run() -> dict[str, Any]:
    tenants = [f"tenant-{i:03d}" for i in range(TENANTS)]
    with minio_bucket() as config:
        bucket = open_bucket(config)
        progress(f"writing {TENANTS} tenants x {BLOCKS} blocks to MinIO")
        jobs = [(tenant, n) for n in range(BLOCKS) for tenant in tenants]
        with ThreadPoolExecutor(CONCURRENCY) as pool:
            metas = list(pool.map(lambda job: write_backup_block(bucket, job[0], "app", 0, job[1], 1), jobs))
        writer = BucketIndexWriter(bucket, _WrittenBlocks(metas), BucketIndexConfig(debounce=0, deltas=False))
        assert sorted(writer.run_once()) == tenants
        index_bytes = sum(bucket.head(bucket_index_key(t)).size for t in tenants) / TENANTS
        progress(f"wrote {len(metas)} blocks and {TENANTS} indexes of {index_bytes / 1024:.0f} KiB on average")
        # A reader starting cold holds none of the writers' objects: drop them, so that neither phase pays
        # for garbage-collecting the other's heap.
        del metas, writer
        gc.collect()

        bucket.calls.reset()
        with timed() as scan_t:
            fetcher = BlockFetcher(bucket, sync_delay=0, concurrency=CONCURRENCY)
            scanned = {t: [v.id for v in sorted(fetcher.sync(t).blocks.values(), key=lambda v: v.id) if v.readable]
                       for t in fetcher.tenants()}
        scan_calls = bucket.calls.total()
        progress(f"cold start by bucket scan: {scan_calls} calls in {scan_t[0]:.2f}s")
        del fetcher
        gc.collect()

        bucket.calls.reset()
        with timed() as index_t:
            reader = BucketIndexReader(bucket, BucketIndexConfig()).start()
            with ThreadPoolExecutor(CONCURRENCY) as pool:
                indexed = dict(zip(tenants, pool.map(lambda t: [m.id for m in reader.blocks(t)], tenants),
                                   strict=True))
            reader.stop()
        index_calls = bucket.calls.total()
        progress(f"cold start by bucket index: {index_calls} calls in {index_t[0]:.2f}s")
        assert indexed == scanned, "the index and the scan disagree on the readable blocks"
        assert all(len(ids) == BLOCKS for ids in indexed.values())

    return write_result(
        "bucket_index",
        figures={"calls": index_calls, "seconds": round(index_t[0], 3), "tenants": TENANTS,
                 "blocks_per_tenant": BLOCKS, "index_kib_per_tenant": round(index_bytes / 1024, 1)},
        baseline={"calls": scan_calls, "seconds": round(scan_t[0], 3)},
        ratios={"calls": round(scan_calls / index_calls, 1), "seconds": round(scan_t[0] / index_t[0], 1)},
        notes=__doc__ or "",
    )
