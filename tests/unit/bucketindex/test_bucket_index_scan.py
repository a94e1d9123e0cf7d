"""The coordination-free writer: an index from a bucket scan agrees with the block fetcher, and folds deltas."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from tests.factories import write_backup_block
from tests.unit.bucketindex.helpers import config

from shale.block import BlockFetcher, BlockState, write_deletion_mark
from shale.bucketindex import BucketIndexReader, DeltaWriter, live_blocks, read_index, scan_index, write_scanned_index
from shale.bucketindex.deltas import list_deltas
from shale.objstore import ObstoreBucket, open_bucket_url

SYNC = 60.0


class RealClock:
    """Real time plus an offset: block ages count from the objects' real upload times."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds


@pytest.fixture(params=["memory", "file"])
def bucket(request: pytest.FixtureRequest, tmp_path: Path) -> ObstoreBucket:
    if request.param == "memory":
        return open_bucket_url(f"memory://scan-{uuid.uuid4().hex}")
    return open_bucket_url(f"file://{tmp_path / 'bucket'}")


def test_the_scanned_index_agrees_with_the_fetcher(bucket: ObstoreBucket) -> None:
    clock = RealClock()
    a = write_backup_block(bucket, "acme", "app", 0, 0, 10)
    b = write_backup_block(bucket, "acme", "app", 0, 10, 10)
    c = write_backup_block(bucket, "acme", "app", 0, 20, 10)
    d = write_backup_block(bucket, "acme", "app", 0, 30, 10)
    ab = write_backup_block(bucket, "acme", "app", 0, 0, 20, sources=[a.id, b.id], level=1)
    write_deletion_mark(bucket, "acme", d.id, clock(), "retention")
    clock.advance(SYNC)
    # A block id's time counts too: this one is younger than the sync delay by the (advanced) clock.
    fresh = write_backup_block(bucket, "acme", "app", 0, 40, 10, block_time_ms=int(clock() * 1000))

    index = scan_index(bucket, "acme", SYNC, clock)
    assert index.block_ids() == {a.id, b.id, c.id, d.id, ab.id}, "Healthy, overlapped and marked; not Fresh"
    assert fresh.id not in index.block_ids()
    assert [m.id for m in index.deletion_marks] == [d.id]
    assert index.deletion_marks[0].reason == "retention"
    assert set(index.uploaded) == index.block_ids()

    fetched = BlockFetcher(bucket, SYNC, clock).sync("acme")
    readable = sorted(v.id for v in fetched.blocks.values() if v.readable)
    assert [m.id for m in live_blocks(index)] == readable == sorted([c.id, ab.id])
    assert {v.id for v in fetched.in_state(BlockState.FRESH)} == {fresh.id}

    assert fresh.id in scan_index(bucket, "acme", 0, clock).block_ids(), "sync_delay=0 indexes every complete block"


def test_write_scanned_index_writes_conditionally_and_readers_read_it(bucket: ObstoreBucket) -> None:
    clock = RealClock()
    a = write_backup_block(bucket, "acme", "app", 0, 0, 10)
    first = write_scanned_index(bucket, "acme", 0, clock)
    assert first.conflicts == 0
    b = write_backup_block(bucket, "acme", "app", 0, 10, 10)
    second = write_scanned_index(bucket, "acme", 0, clock)
    assert second.stored.etag != first.stored.etag
    stored = read_index(bucket, "acme")
    assert stored is not None
    assert stored.index.block_ids() == {a.id, b.id}
    reader = BucketIndexReader(bucket, config(), clock)
    assert [m.id for m in reader.blocks("acme")] == sorted([a.id, b.id])


def test_a_delta_of_a_fresh_block_is_folded_only_once_the_block_is_indexed(bucket: ObstoreBucket) -> None:
    clock = RealClock()
    producer = DeltaWriter(bucket, clock)
    old = write_backup_block(bucket, "acme", "app", 0, 0, 10)
    old_delta = producer.write("acme", added=[old])
    clock.advance(2 * SYNC)
    young = write_backup_block(bucket, "acme", "app", 0, 10, 10, block_time_ms=int(clock() * 1000))
    young_delta = producer.write("acme", added=[young])

    clock.advance(SYNC / 2)  # the young block is still Fresh; its delta is older than a 10 s margin
    result = write_scanned_index(bucket, "acme", SYNC, clock, margin=10)
    assert young.id not in result.stored.index.block_ids()
    assert result.stored.index.watermark == old_delta
    assert result.deleted_deltas == 1
    assert [i.key for i in list_deltas(bucket, "acme")] == [young_delta]

    clock.advance(SYNC)
    result = write_scanned_index(bucket, "acme", SYNC, clock, margin=10)
    assert result.stored.index.block_ids() == {old.id, young.id}
    assert result.stored.index.watermark == young_delta
    assert list_deltas(bucket, "acme") == []
