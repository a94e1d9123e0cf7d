"""The bucket index on a real MinIO: conditional updates between racing writers (If-None-Match and If-Match
as S3 implements them), a reader's one-GET cold start, and stale-tolerant mode."""

from __future__ import annotations

import time

from tests.factories import write_backup_block
from tests.unit.bucketindex.helpers import Clock, FakeSource, HookBucket, block, config

from shale.bucketindex import (
    BucketIndexReader,
    BucketIndexWriter,
    DeltaLink,
    DeltaWriter,
    read_index,
    state_digest,
    write_scanned_index,
)
from shale.config import BucketConfig
from shale.objstore import ObstoreBucket, open_bucket

NO_CALLS = {"get": 0, "get_range": 0, "head": 0, "list": 0, "put": 0, "delete": 0}


def _ids(bucket: ObstoreBucket, tenant: str) -> set[str]:
    stored = read_index(bucket, tenant)
    assert stored is not None
    return stored.index.block_ids()


def test_racing_writers_conflict_and_merge_without_losing_either_change(minio_bucket: BucketConfig) -> None:
    bucket = open_bucket(minio_bucket)
    hooked = HookBucket(bucket)
    a_source, b_source = FakeSource(), FakeSource()
    a = BucketIndexWriter(hooked, a_source, config(debounce=0), Clock())
    b = BucketIndexWriter(bucket, b_source, config(debounce=0), Clock())

    # First write: A found no index, B creates one before A's put-if-absent reaches MinIO.
    a_source.set("acme", [block("acme", 1)])
    b_source.set("acme", [block("acme", 2)])
    hooked.hook = b.run_once
    assert a.run_once() == ["acme"]
    assert hooked.hook is None, "B wrote in between"
    assert a.last_writes[0].conflicts == 1
    assert _ids(bucket, "acme") == {block("acme", 1).id, block("acme", 2).id}

    # An update: A read the version it wrote; B writes first; A's put-if-match (If-Match) fails, A re-reads,
    # merges its change (adds 3, removes 1) into B's (adds 4) and wins on the second try.
    a_source.set("acme", [block("acme", 2), block("acme", 3)])
    b_source.set("acme", [block("acme", 1), block("acme", 2), block("acme", 4)])
    hooked.hook = b.run_once
    assert a.run_once() == ["acme"]
    assert a.last_writes[0].conflicts == 1
    assert _ids(bucket, "acme") == {block("acme", n).id for n in (2, 3, 4)}


def test_scan_writer_and_metastore_writer_race_on_minio(minio_bucket: BucketConfig) -> None:
    bucket = open_bucket(minio_bucket)
    scanned = write_backup_block(bucket, "acme", "app", 0, 0, 10)
    source = FakeSource()
    source.set("acme", [block("acme", 7)])
    metastore_writer = BucketIndexWriter(bucket, source, config(debounce=0), Clock())
    hooked = HookBucket(bucket)
    hooked.hook = metastore_writer.run_once
    result = write_scanned_index(hooked, "acme", 0, time.time)
    assert result.conflicts == 1
    assert _ids(bucket, "acme") == {scanned.id, block("acme", 7).id}


def test_a_reader_costs_one_get_and_catches_up_through_deltas(minio_bucket: BucketConfig) -> None:
    bucket = open_bucket(minio_bucket)
    clock = Clock()
    source = FakeSource()
    source.set("acme", [block("acme", 1)])
    BucketIndexWriter(bucket, source, config(debounce=0), clock).run_once()
    bucket.calls.reset()
    reader = BucketIndexReader(bucket, config(max_stale_period=3600), clock).start()
    try:
        assert [m.id for m in reader.blocks("acme")] == [block("acme", 1).id]
        assert bucket.calls.snapshot() == NO_CALLS | {"get": 1}

        producer = DeltaWriter(bucket, clock)
        clock.advance(3000)
        # The change after the one the index holds (the source's version 1), as its metastore commit names it.
        link = DeltaLink(previous=1, version=2, time=clock.now,
                         digest=state_digest([block("acme", 1).id, block("acme", 2).id], None))
        producer.write("acme", added=[block("acme", 2)], link=link)
        clock.advance(1000)  # the index is stale; the delta is not
        bucket.calls.reset()
        assert [m.id for m in reader.blocks("acme")] == sorted([block("acme", 1).id, block("acme", 2).id])
        assert bucket.calls.snapshot() == NO_CALLS | {"list": 1, "get": 2}
    finally:
        reader.stop()
