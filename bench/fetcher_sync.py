"""Fetcher sync over 10,000 blocks on MinIO, against the naive "LIST, then GET every meta.json" in the same run.

Shale's fetcher lists every object of the tenant's blocks (1,000 keys per LIST page: each group's prefix and
``<tenant>/blocks/`` of before) and the markers prefix, and GETs only meta.json files and marks it has not seen: both
are immutable, so a steady-state sync (every sync after the first) costs the LISTs alone. The baseline lists the block
folders and GETs every meta.json on every sync, as Thanos's fetcher did before caching. Both use 16 concurrent GETs.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tests.factories import write_backup_block

from bench.common import progress, timed, write_result
from bench.services import minio_bucket
from shale.block import BlockFetcher, parse_meta, tenant_group_prefix
from shale.objstore import ObstoreBucket, open_bucket

BLOCKS = 10_000
TENANT = "bench"


def _naive_sync(bucket: ObstoreBucket) -> int:
    folders = bucket.list_dirs(tenant_group_prefix(TENANT, "backup"))

    def load(folder: str) -> str:
        return parse_meta(bucket.get(folder + "meta.json"), where=folder).id

    with ThreadPoolExecutor(16) as pool:
        return len(list(pool.map(load, folders)))


def run() -> dict[str, Any]:
    with minio_bucket() as config:
        bucket = open_bucket(config)
        progress(f"writing {BLOCKS} blocks to MinIO")
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda i: write_backup_block(bucket, TENANT, "app", 0, i * 10, 10), range(BLOCKS)))

        fetcher = BlockFetcher(bucket, sync_delay=0)
        bucket.calls.reset()
        with timed() as cold_t:
            cold = fetcher.sync(TENANT)
        cold_calls = bucket.calls.total()
        assert len(cold.blocks) == BLOCKS
        progress(f"cold sync: {cold_calls} calls in {cold_t[0]:.2f}s")

        bucket.calls.reset()
        with timed() as warm_t:
            warm = fetcher.sync(TENANT)
        warm_calls = bucket.calls.total()
        assert len(warm.blocks) == BLOCKS
        progress(f"steady-state sync: {warm_calls} calls in {warm_t[0]:.2f}s")

        bucket.calls.reset()
        with timed() as naive_t:
            assert _naive_sync(bucket) == BLOCKS
        naive_calls = bucket.calls.total()
        progress(f"naive sync: {naive_calls} calls in {naive_t[0]:.2f}s")

    return write_result(
        "fetcher_sync",
        figures={"calls": warm_calls, "seconds": round(warm_t[0], 3), "blocks": BLOCKS,
                 "cold_calls": cold_calls, "cold_seconds": round(cold_t[0], 3)},
        baseline={"calls": naive_calls, "seconds": round(naive_t[0], 3)},
        ratios={"calls": round(naive_calls / warm_calls, 1), "seconds": round(naive_t[0] / warm_t[0], 1),
                "cold_calls": round(naive_calls / cold_calls, 2), "cold_seconds": round(naive_t[0] / cold_t[0], 2)},
        notes=__doc__ or "",
    )
