"""The reader: one GET and no LIST per tenant, caching, refresh, idle drop, staleness, and stale-tolerant mode."""

from __future__ import annotations

import gzip
import threading
import uuid

import pytest
from tests.unit.bucketindex.helpers import T0, Clock, FakeSource, HookBucket, block, config, sample

from shale.block import BlockMeta, bucket_index_key, meta_key, shared_scopes
from shale.bucketindex import (
    BucketIndex,
    BucketIndexReader,
    BucketIndexWriter,
    DeltaLink,
    DeltaWriter,
    IndexedMark,
    StaleIndexError,
    publish,
    read_index,
    state_digest,
)
from shale.errors import ConfigError, CorruptObjectError, NotFoundError
from shale.objstore import ObstoreBucket, open_bucket_url
from shale.query.sources import BucketIndexSource

STALE = 3600.0
NO_CALLS = {"get": 0, "get_range": 0, "head": 0, "list": 0, "put": 0, "delete": 0}


@pytest.fixture
def bucket() -> ObstoreBucket:
    return open_bucket_url(f"memory://reader-{uuid.uuid4().hex}")


@pytest.fixture
def tenant() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


def _write(bucket: ObstoreBucket, tenant: str, blocks: list[BlockMeta], at: float = T0,
           marks: list[IndexedMark] | None = None, version: int | None = 1) -> BucketIndex:
    current = read_index(bucket, tenant)
    index = BucketIndex.build(tenant, at, blocks, marks or [],
                              watermark=current.index.watermark if current else "", tenant_version=version)
    return publish(bucket, index, current).stored.index


def _link(previous: int, version: int, clock: Clock, live: list[BlockMeta]) -> DeltaLink:
    """The link a metastore commit would give a change of the tenant from ``previous`` to ``version``, now,
    after which the tenant's blocks are ``live`` (and it has no generation switches)."""
    return DeltaLink(previous=previous, version=version, time=clock.now, digest=state_digest(_ids(live), None))


def _ids(blocks: list[BlockMeta]) -> list[str]:
    return [b.id for b in blocks]


def test_start_and_a_query_cost_one_get_and_no_list(bucket: ObstoreBucket, tenant: str) -> None:
    blocks = [block(tenant, n) for n in range(5)]
    _write(bucket, tenant, blocks)
    clock = Clock()
    bucket.calls.reset()
    with BucketIndexReader(bucket, config(), clock) as reader:
        assert bucket.calls.snapshot() == NO_CALLS, "starting costs nothing: tenants load on first use"
        assert _ids(reader.blocks(tenant)) == sorted(_ids(blocks))
        assert bucket.calls.snapshot() == NO_CALLS | {"get": 1}
        clock.advance(30)
        assert _ids(reader.blocks(tenant)) == sorted(_ids(blocks))
        assert reader.index(tenant).block_ids() == set(_ids(blocks))
        assert bucket.calls.snapshot() == NO_CALLS | {"get": 1}, "later queries are answered from memory"


def test_refresh_regets_cached_tenants_and_drops_idle_ones(bucket: ObstoreBucket, tenant: str) -> None:
    clock = Clock()
    _write(bucket, tenant, [block(tenant, 1)])
    reader = BucketIndexReader(bucket, config(idle_timeout=1000), clock)
    assert _ids(reader.blocks(tenant)) == [block(tenant, 1).id]
    _write(bucket, tenant, [block(tenant, 1), block(tenant, 2)], at=T0 + 50)
    clock.advance(60)
    bucket.calls.reset()
    reader.refresh_now()
    assert bucket.calls.snapshot() == NO_CALLS | {"get": 1}
    assert sample("shale_bucket_index_reader_age_seconds", tenant=tenant) == 10
    assert _ids(reader.blocks(tenant)) == sorted([block(tenant, 1).id, block(tenant, 2).id])
    assert bucket.calls.snapshot() == NO_CALLS | {"get": 1}

    clock.advance(1000)
    reader.refresh_now()
    assert reader.tenants() == []
    assert bucket.calls.snapshot() == NO_CALLS | {"get": 1}, "an idle tenant is dropped without a GET"
    _write(bucket, tenant, [block(tenant, 1)], at=clock.now)
    bucket.calls.reset()
    assert _ids(reader.blocks(tenant)) == [block(tenant, 1).id]
    assert bucket.calls.snapshot() == NO_CALLS | {"get": 1}, "a dropped tenant loads again on its next use"


def test_a_failed_refresh_keeps_the_cached_index(bucket: ObstoreBucket, tenant: str) -> None:
    _write(bucket, tenant, [block(tenant, 1)])
    reader = BucketIndexReader(bucket, config(), Clock())
    reader.blocks(tenant)
    bucket.put(bucket_index_key(tenant), b"garbage")
    before = sample("shale_bucket_index_loads_total", outcome="corrupt")
    reader.refresh_now()
    assert sample("shale_bucket_index_loads_total", outcome="corrupt") == before + 1
    assert _ids(reader.blocks(tenant)) == [block(tenant, 1).id]


def test_a_missing_index_says_how_to_build_one(bucket: ObstoreBucket, tenant: str) -> None:
    reader = BucketIndexReader(bucket, config(), Clock())
    before = sample("shale_bucket_index_loads_total", outcome="not_found")
    with pytest.raises(NotFoundError, match=rf"no bucket index.*`shale bucket index --tenant {tenant}`.*metastore"):
        reader.blocks(tenant)
    assert sample("shale_bucket_index_loads_total", outcome="not_found") == before + 1


def test_a_corrupt_index_is_a_corrupt_object_error(bucket: ObstoreBucket, tenant: str) -> None:
    bucket.put(bucket_index_key(tenant), b"\x1f\x8b not really gzip")
    with pytest.raises(CorruptObjectError, match=rf"{tenant}/bucket-index.json.gz: the bucket index of tenant"):
        BucketIndexReader(bucket, config(), Clock()).blocks(tenant)


def test_marked_and_overlapped_blocks_are_not_readable(bucket: ObstoreBucket, tenant: str) -> None:
    a, b, c, d = (block(tenant, n) for n in range(4))
    ab = block(tenant, 10, sources=[a.id, b.id], level=1)
    _write(bucket, tenant, [a, b, c, d, ab], marks=[IndexedMark(id=d.id, deletion_time=T0, reason="retention")])
    reader = BucketIndexReader(bucket, config(), Clock())
    assert _ids(reader.blocks(tenant)) == sorted([c.id, ab.id])
    assert len(reader.index(tenant).blocks) == 5, "the index itself still lists them"


def test_a_stale_index_is_refused_with_what_to_do(bucket: ObstoreBucket, tenant: str) -> None:
    _write(bucket, tenant, [block(tenant, 1)])
    clock = Clock()
    reader = BucketIndexReader(bucket, config(max_stale_period=STALE, deltas=False), clock)
    assert reader.blocks(tenant)
    clock.advance(STALE + 1)
    bucket.calls.reset()
    with pytest.raises(StaleIndexError) as info:
        reader.blocks(tenant)
    message = str(info.value)
    assert f"tenant {tenant}" in message
    assert "updated 3601s ago" in message
    assert "max_stale_period = 3600s" in message
    assert "bucket_index.deltas) is off" in message
    assert f"`shale bucket index --tenant {tenant}`" in message
    assert "metastore leader" in message
    assert bucket.calls.snapshot() == NO_CALLS, "without stale-tolerant mode a stale index costs no call"


def test_stale_tolerant_mode_catches_up_through_deltas(bucket: ObstoreBucket, tenant: str) -> None:
    """The metastore writer wrote the index, then stopped; producers kept writing deltas."""
    clock = Clock()
    old, marked, gone = block(tenant, 1), block(tenant, 2), block(tenant, 3)
    source = FakeSource()
    source.set(tenant, [old, marked, gone])
    writer = BucketIndexWriter(bucket, source, config(debounce=0), clock)
    assert writer.run_once() == [tenant]
    reader = BucketIndexReader(bucket, config(max_stale_period=STALE), clock)
    assert _ids(reader.blocks(tenant)) == sorted([old.id, marked.id, gone.id])

    producer = DeltaWriter(bucket, clock)
    new1, new2 = block(tenant, 4), block(tenant, 5)
    clock.advance(1000)
    producer.write(tenant, added=[new1], link=_link(1, 2, clock, [old, marked, gone, new1]))
    clock.advance(1000)
    producer.write(tenant, added=[new2], marks=[(marked.id, clock.now, "retention")],
                   link=_link(2, 3, clock, [old, gone, new1, new2]))
    clock.advance(1000)
    last = producer.write(tenant, removed=[gone.id], link=_link(3, 4, clock, [old, new1, new2]))
    clock.advance(1000)  # the index is 4000 s old; the newest delta 1000 s
    lists_before = sample("shale_bucket_index_delta_lists_total")
    bucket.calls.reset()
    assert _ids(reader.blocks(tenant)) == sorted([old.id, new1.id, new2.id])
    # One LIST, the index again (after the LIST, see reader.py), and one GET per delta.
    assert bucket.calls.snapshot() == NO_CALLS | {"list": 1, "get": 1 + 3}
    assert sample("shale_bucket_index_delta_lists_total") == lists_before + 1
    assert reader.index(tenant).watermark == last
    clock.advance(60)
    assert _ids(reader.blocks(tenant)) == sorted([old.id, new1.id, new2.id])
    assert bucket.calls.snapshot() == NO_CALLS | {"list": 1, "get": 4}, "the caught-up view is cached"

    clock.advance(STALE)  # no delta for an hour: nothing vouches for the view any more
    with pytest.raises(StaleIndexError, match="newest delta is 4660s old"):
        reader.blocks(tenant)


def test_a_stale_index_without_newer_deltas_is_refused(bucket: ObstoreBucket, tenant: str) -> None:
    _write(bucket, tenant, [block(tenant, 1)])
    clock = Clock()
    DeltaWriter(bucket, Clock(T0 - 10)).write(tenant, added=[block(tenant, 2)])  # older than the index
    reader = BucketIndexReader(bucket, config(max_stale_period=STALE), clock)
    reader.blocks(tenant)
    clock.advance(STALE + 5)
    bucket.calls.reset()
    with pytest.raises(StaleIndexError, match="No delta newer than the index covers the gap"):
        reader.blocks(tenant)
    assert bucket.calls.snapshot() == NO_CALLS | {"list": 1, "get": 2}


def test_a_fresh_index_ignores_deltas(bucket: ObstoreBucket, tenant: str) -> None:
    _write(bucket, tenant, [block(tenant, 1)])
    DeltaWriter(bucket, Clock(T0 + 5)).write(tenant, added=[block(tenant, 2)])
    bucket.calls.reset()
    reader = BucketIndexReader(bucket, config(max_stale_period=STALE), Clock(T0 + 10))
    assert _ids(reader.blocks(tenant)) == [block(tenant, 1).id]
    assert bucket.calls.snapshot() == NO_CALLS | {"get": 1}


def test_catch_up_reads_the_index_after_listing_so_folded_deltas_are_not_lost(bucket: ObstoreBucket,
                                                                               tenant: str) -> None:
    """A writer folds and deletes a delta between the reader's load and its catch-up: the reader must use the
    newer index that holds it, not its cached one plus a listing with a hole."""
    clock = Clock()
    a, b, c = block(tenant, 1), block(tenant, 2), block(tenant, 3)
    _write(bucket, tenant, [a])
    reader = BucketIndexReader(bucket, config(max_stale_period=STALE), clock)
    reader.blocks(tenant)
    producer = DeltaWriter(bucket, clock)
    clock.advance(100)
    first = producer.write(tenant, added=[b], link=_link(1, 2, clock, [a, b]))
    clock.advance(3000)
    producer.write(tenant, added=[c], link=_link(2, 3, clock, [a, b, c]))
    # A scan writer folds the first delta into an index that is itself stale by the time the reader looks.
    folded = BucketIndex.build(tenant, T0 + 150, [a, b], watermark=first, tenant_version=2)
    current = read_index(bucket, tenant)
    publish(bucket, folded, current)
    bucket.delete(first)
    clock.advance(1000)
    assert _ids(reader.blocks(tenant)) == sorted([a.id, b.id, c.id])


def test_an_unreadable_delta_stops_the_view_before_it(bucket: ObstoreBucket, tenant: str) -> None:
    clock = Clock()
    _write(bucket, tenant, [block(tenant, 1)])
    reader = BucketIndexReader(bucket, config(max_stale_period=STALE), clock)
    reader.blocks(tenant)
    producer = DeltaWriter(bucket, clock)
    clock.advance(STALE)
    broken = producer.write(tenant, added=[block(tenant, 2)])
    bucket.put(broken, b"{not json")
    clock.advance(10)
    producer.write(tenant, added=[block(tenant, 3)])
    with pytest.raises(StaleIndexError, match=f"unreadable delta {broken}"):
        reader.blocks(tenant)


def test_the_background_thread_refreshes_and_stops(bucket: ObstoreBucket, tenant: str) -> None:
    _write(bucket, tenant, [block(tenant, 1)])
    refreshed = threading.Event()
    reader = BucketIndexReader(bucket, config(), Clock(), refresh_interval=0.01)
    reader.blocks(tenant)
    loads = sample("shale_bucket_index_loads_total", outcome="ok")
    _write(bucket, tenant, [block(tenant, 1), block(tenant, 2)], at=T0 + 1)
    original = reader.refresh_now

    def refresh() -> None:
        original()
        refreshed.set()

    reader.refresh_now = refresh  # type: ignore[method-assign]
    reader.start()
    try:
        assert refreshed.wait(10), "the background thread never refreshed"
    finally:
        reader.stop()
    assert reader._thread is None
    assert sample("shale_bucket_index_loads_total", outcome="ok") > loads
    assert len(reader.blocks(tenant)) == 2


class _FoldAfterIndexGet(HookBucket):
    """Runs ``hook`` right after the next GET of the index has been answered."""

    def __init__(self, inner: ObstoreBucket, tenant: str) -> None:
        super().__init__(inner)
        self.key = bucket_index_key(tenant)

    def get(self, key: str) -> bytes:
        data = self.inner.get(key)
        if key == self.key:
            self._fire()
        return data


def test_a_fold_racing_with_a_catch_up_never_gives_a_wrong_answer(bucket: ObstoreBucket, tenant: str) -> None:
    """A writer folds and deletes a delta right after the reader's catch-up read the index. Reading the index
    before listing would miss that delta's block silently; listing first means the reader saw the delta."""
    clock = Clock()
    a, b, c = block(tenant, 1), block(tenant, 2), block(tenant, 3)
    _write(bucket, tenant, [a])
    racing = _FoldAfterIndexGet(bucket, tenant)
    reader = BucketIndexReader(racing, config(max_stale_period=STALE), clock)
    reader.blocks(tenant)
    producer = DeltaWriter(bucket, clock)
    clock.advance(100)
    first = producer.write(tenant, added=[b], link=_link(1, 2, clock, [a, b]))
    clock.advance(3000)
    producer.write(tenant, added=[c], link=_link(2, 3, clock, [a, b, c]))
    clock.advance(1000)

    def fold() -> None:
        publish(bucket, BucketIndex.build(tenant, T0 + 150, [a, b], watermark=first, tenant_version=2),
                read_index(bucket, tenant))
        bucket.delete(first)

    racing.hook = fold
    # The listed delta is gone when the reader GETs it: its view stops there, which is still stale, so it
    # refuses rather than answer without block b.
    with pytest.raises(StaleIndexError, match=f"unreadable delta {first}"):
        reader.blocks(tenant)
    assert racing.hook is None, "the fold ran during the catch-up"
    reader.refresh_now()  # the next catch-up reads the folded index and answers
    assert _ids(reader.blocks(tenant)) == sorted([a.id, b.id, c.id])


def test_concurrent_first_queries_share_one_get(bucket: ObstoreBucket, tenant: str) -> None:
    _write(bucket, tenant, [block(tenant, 1)])
    reader = BucketIndexReader(bucket, config(), Clock())
    start = threading.Barrier(8)
    results: list[list[str]] = []

    def query() -> None:
        start.wait()
        results.append(_ids(reader.blocks(tenant)))

    bucket.calls.reset()
    threads = [threading.Thread(target=query) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [[block(tenant, 1).id]] * 8
    assert bucket.calls.snapshot() == NO_CALLS | {"get": 1}


def test_a_background_refresh_needs_a_positive_interval(bucket: ObstoreBucket) -> None:
    with pytest.raises(ConfigError, match=r"refresh_interval = 0\.0: .* positive interval"):
        BucketIndexReader(bucket, config(refresh_interval=0), Clock()).start()


def test_a_refresh_of_unchanged_bytes_keeps_the_parsed_index(bucket: ObstoreBucket, tenant: str) -> None:
    _write(bucket, tenant, [block(tenant, n) for n in range(3)])
    reader = BucketIndexReader(bucket, config(), Clock())
    first = reader.index(tenant)
    unchanged = sample("shale_bucket_index_loads_total", outcome="unchanged")
    reader.refresh_now()
    assert sample("shale_bucket_index_loads_total", outcome="unchanged") == unchanged + 1
    assert reader.index(tenant) is first
    _write(bucket, tenant, [block(tenant, n) for n in range(4)], at=T0 + 1)
    reader.refresh_now()
    assert reader.index(tenant) is not first
    assert len(reader.blocks(tenant)) == 4


def test_a_query_reads_the_kafka_ranges_the_index_leaves_out_from_meta_json_once(bucket: ObstoreBucket,
                                                                                 tenant: str) -> None:
    # Two blocks whose ranges intersect: deduplication needs their ranges, which version 2 entries leave out.
    a, b = block(tenant, 1), block(tenant, 2)
    b = b.model_copy(update={"kafka": a.kafka})
    for m in (a, b):
        bucket.put(meta_key(m), m.to_json())
    _write(bucket, tenant, [a, b])
    with BucketIndexReader(bucket, config(), Clock()) as reader:
        assert all(m.summary and not m.kafka for m in reader.blocks(tenant))
        source = BucketIndexSource(reader)
        bucket.calls.reset()
        found = source.query_blocks([tenant], 0, 2**62)
        assert [(m.id, m.kafka, m.summary) for m in found] == [(m.id, m.kafka, False) for m in sorted(
            [a, b], key=lambda m: m.id)]
        assert shared_scopes(found) == {(r.topic, r.partition, r.incarnation) for r in a.kafka}
        assert bucket.calls.snapshot() == NO_CALLS | {"get": 2}, "one GET per selected block"
        source.query_blocks([tenant], 0, 2**62)
        assert bucket.calls.snapshot() == NO_CALLS | {"get": 2}, "then from memory: a meta.json never changes"


def test_entries_of_an_index_of_the_previous_release_are_used_as_they_are(bucket: ObstoreBucket,
                                                                          tenant: str) -> None:
    a = block(tenant, 1)
    previous = BucketIndex.build(tenant, T0, [a]).model_copy(update={"version": 1})
    bucket.put(bucket_index_key(tenant), gzip.compress(previous.model_dump_json(exclude_none=True).encode()))
    with BucketIndexReader(bucket, config(), Clock()) as reader:
        bucket.calls.reset()
        assert [m.kafka for m in BucketIndexSource(reader).query_blocks([tenant], 0, 2**62)] == [a.kafka]
        assert bucket.calls.snapshot() == NO_CALLS | {"get": 1}, "the index only: its entries are full metas"


def test_a_meta_json_that_disagrees_with_its_entry_is_corrupt(bucket: ObstoreBucket, tenant: str) -> None:
    a = block(tenant, 1)
    bucket.put(meta_key(a), a.model_copy(update={"group": "partition"}).to_json())
    _write(bucket, tenant, [a])
    with BucketIndexReader(bucket, config(), Clock()) as reader, \
            pytest.raises(CorruptObjectError, match="disagrees with its bucket index entry"):
        BucketIndexSource(reader).query_blocks([tenant], 0, 2**62)


def test_the_full_meta_cache_keeps_the_most_recently_used_within_its_weight(
        bucket: ObstoreBucket, tenant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = [block(tenant, n) for n in range(3)]  # each weighs 1 + one range + its row groups
    for m in blocks:
        bucket.put(meta_key(m), m.to_json())
    _write(bucket, tenant, blocks)
    weight = 1 + len(blocks[0].kafka) + sum(len(d.row_groups) for d in blocks[0].datasets)
    monkeypatch.setattr("shale.bucketindex.reader.FULL_META_CACHE", 2 * weight)
    with BucketIndexReader(bucket, config(), Clock()) as reader:
        a, b, c = reader.blocks(tenant)
        for m in (a, b, a, c):  # a is used again before c comes: b is the least recently used
            assert reader.full_meta(m).kafka == next(x for x in blocks if x.id == m.id).kafka
        bucket.calls.reset()
        reader.full_meta(a)
        reader.full_meta(c)
        assert bucket.calls.snapshot() == NO_CALLS
        reader.full_meta(b)
        assert bucket.calls.snapshot() == NO_CALLS | {"get": 1}
