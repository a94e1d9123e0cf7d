"""The metastore's index writer: when it writes, what it writes, its metrics, delta folding, and conditional
writes that merge instead of overwriting (on memory and local filesystem buckets)."""

from __future__ import annotations

import gzip
import uuid
from pathlib import Path

import pytest
from tests.unit.bucketindex.helpers import T0, Clock, FakeSource, HookBucket, block, config, sample, tombstone

from shale.block import bucket_index_key
from shale.bucketindex import BucketIndex, BucketIndexWriter, DeltaWriter, publish, read_index
from shale.bucketindex.deltas import list_deltas
from shale.bucketindex.model import SUMMARY_EXCLUDE
from shale.errors import ConflictError, CorruptObjectError
from shale.metastore import AddBlocks, MetastoreService, ReplaceBlocks, SingleNodeLog, StateMachine
from shale.objstore import ObstoreBucket, open_bucket_url
from shale.objstore.testing import Fault, FaultyBucket


@pytest.fixture(params=["memory", "file"])
def bucket(request: pytest.FixtureRequest, tmp_path: Path) -> ObstoreBucket:
    if request.param == "memory":
        return open_bucket_url(f"memory://writer-{uuid.uuid4().hex}")
    return open_bucket_url(f"file://{tmp_path / 'bucket'}")


@pytest.fixture
def tenant() -> str:
    """A tenant name of its own, so per-tenant metrics start from zero in every test."""
    return f"t{uuid.uuid4().hex[:10]}"


def _stored(bucket: ObstoreBucket, tenant: str) -> BucketIndex:
    found = read_index(bucket, tenant)
    assert found is not None
    return found.index


def test_writes_after_the_debounce_counted_from_the_first_change(bucket: ObstoreBucket, tenant: str) -> None:
    clock, source = Clock(), FakeSource()
    writer = BucketIndexWriter(bucket, source, config(debounce=5), clock)
    source.set(tenant, [block(tenant, 1)])
    assert writer.run_once() == []
    assert read_index(bucket, tenant) is None
    clock.advance(3)
    source.set(tenant, [block(tenant, 1), block(tenant, 2)])  # a second change does not restart the debounce
    assert writer.run_once() == []
    clock.advance(2)
    assert writer.run_once() == [tenant]
    index = _stored(bucket, tenant)
    assert index.block_ids() == {block(tenant, 1).id, block(tenant, 2).id}
    assert index.updated_at == T0 + 5
    assert index.uploaded == {block(tenant, 1).id: T0 + 5, block(tenant, 2).id: T0 + 5}
    clock.advance(100)
    assert writer.run_once() == [], "nothing changed and the rewrite interval has not passed"
    assert sample("shale_bucket_index_writes_total", tenant=tenant, outcome="written") == 1


def test_rewrites_an_unchanged_index_every_rewrite_interval(bucket: ObstoreBucket, tenant: str) -> None:
    clock, source = Clock(), FakeSource()
    writer = BucketIndexWriter(bucket, source, config(debounce=0, rewrite_interval=300), clock)
    source.set(tenant, [block(tenant, 1)])
    assert writer.run_once() == [tenant]
    clock.advance(299)
    assert writer.run_once() == []
    assert sample("shale_bucket_index_age_seconds", tenant=tenant) == 299
    clock.advance(1)
    assert writer.run_once() == [tenant]
    assert _stored(bucket, tenant).updated_at == T0 + 300
    assert _stored(bucket, tenant).uploaded == {block(tenant, 1).id: T0}, "upload times survive rewrites"
    assert sample("shale_bucket_index_age_seconds", tenant=tenant) == 0
    assert sample("shale_bucket_index_writes_total", tenant=tenant, outcome="written") == 2


def test_tombstones_become_deletion_marks(bucket: ObstoreBucket, tenant: str) -> None:
    a, b = block(tenant, 1), block(tenant, 2)
    source = FakeSource()
    source.set(tenant, [b], [tombstone(a, int(T0 * 1000) - 1500, "retention")])
    BucketIndexWriter(bucket, source, config(debounce=0), Clock()).run_once()
    index = _stored(bucket, tenant)
    assert index.block_ids() == {b.id}
    assert [(m.id, m.deletion_time, m.reason) for m in index.deletion_marks] == [(a.id, T0 - 1.5, "retention")]


def test_a_failed_tenant_is_counted_and_retried_and_others_still_written(tmp_path: Path, tenant: str) -> None:
    inner = open_bucket_url(f"memory://writer-{uuid.uuid4().hex}")
    other = tenant + "-ok"
    faulty = FaultyBucket(inner, [Fault("put", key=f"^{tenant}/bucket-index")])
    source = FakeSource()
    source.set(tenant, [block(tenant, 1)])
    source.set(other, [block(other, 1)])
    writer = BucketIndexWriter(faulty, source, config(debounce=0), Clock())
    assert writer.run_once() == [other]
    assert sample("shale_bucket_index_writes_total", tenant=tenant, outcome="failed") == 1
    assert writer.run_once() == [tenant]
    assert _stored(inner, tenant).block_ids() == {block(tenant, 1).id}


def test_writes_from_a_real_metastore_state(tmp_path: Path, bucket: ObstoreBucket, tenant: str) -> None:
    state = StateMachine(tmp_path / "state.db")
    service = MetastoreService(state, SingleNodeLog(state))
    clock = Clock()
    writer = BucketIndexWriter(bucket, state.reader, config(debounce=0), clock)
    a, b, c = block(tenant, 1), block(tenant, 2), block(tenant, 3)
    service.submit(AddBlocks(blocks=[a, b, c])).raise_for_rejection()
    assert writer.run_once() == [tenant]
    assert [m.model_dump(exclude=SUMMARY_EXCLUDE) for m in _stored(bucket, tenant).blocks] == \
        [m.model_dump(exclude=SUMMARY_EXCLUDE) for m in sorted([a, b, c], key=lambda m: m.id)], "in id order"
    clock.advance(1)
    assert writer.run_once() == [], "the tenant's version has not changed"

    ab = block(tenant, 10, sources=[a.id, b.id], level=1)
    service.submit(ReplaceBlocks(tenant=tenant, sources=[a.id, b.id], blocks=[ab])).raise_for_rejection()
    assert writer.run_once() == [tenant]
    index = _stored(bucket, tenant)
    assert index.block_ids() == {c.id, ab.id}
    assert {m.id: m.reason for m in index.deletion_marks} == {a.id: f"compacted into {ab.id}",
                                                              b.id: f"compacted into {ab.id}"}
    state.close()


def test_folds_deltas_the_source_holds_and_deletes_them(bucket: ObstoreBucket, tenant: str) -> None:
    clock, source = Clock(), FakeSource()
    a, b, late = block(tenant, 1), block(tenant, 2), block(tenant, 3)
    producer = DeltaWriter(bucket, clock)
    clock.advance(-120)
    first = producer.write(tenant, added=[a])
    clock.advance(30)
    second = producer.write(tenant, added=[b])
    clock.advance(80)
    young = producer.write(tenant, added=[late])  # 10 s old when the writer runs: inside the margin
    clock.advance(10)
    source.set(tenant, [a, b, late])
    writer = BucketIndexWriter(bucket, source, config(debounce=0), clock, delta_margin=60)
    assert writer.run_once() == [tenant]
    assert _stored(bucket, tenant).watermark == second
    assert writer.last_writes[0].deleted_deltas == 2
    assert [i.key for i in list_deltas(bucket, tenant)] == [young]
    assert first < second < young


def test_an_unreflected_delta_holds_the_watermark_until_the_limit(bucket: ObstoreBucket, tenant: str) -> None:
    clock, source = Clock(), FakeSource()
    a, pending = block(tenant, 1), block(tenant, 2)
    producer = DeltaWriter(bucket, clock)
    clock.advance(-300)
    waiting = producer.write(tenant, added=[pending])  # e.g. a commit still in the dead letter queue
    clock.advance(100)
    after = producer.write(tenant, added=[a])
    clock.advance(200)
    source.set(tenant, [a])
    writer = BucketIndexWriter(bucket, source, config(debounce=0), clock, delta_margin=60,
                                  unreflected_delta_limit=600)
    writer.run_once()
    assert _stored(bucket, tenant).watermark == ""
    assert [i.key for i in list_deltas(bucket, tenant)] == [waiting, after]
    clock.advance(300)  # the pending delta is now 600 s old
    source.set(tenant, [a])
    writer.run_once()
    assert _stored(bucket, tenant).watermark == after
    assert list_deltas(bucket, tenant) == []


def test_deltas_off_lists_nothing(tenant: str) -> None:
    bucket = open_bucket_url(f"memory://writer-{uuid.uuid4().hex}")
    DeltaWriter(bucket, Clock(T0 - 1000)).write(tenant, added=[block(tenant, 1)])
    source = FakeSource()
    source.set(tenant, [block(tenant, 1)])
    bucket.calls.reset()
    BucketIndexWriter(bucket, source, config(debounce=0, deltas=False), Clock()).run_once()
    assert bucket.calls.snapshot()["list"] == 0
    assert len(list_deltas(bucket, tenant)) == 1


def _race(bucket: ObstoreBucket, tenant: str, first: list[int], second: list[int], a_view: list[int],
          b_view: list[int]) -> tuple[BucketIndexWriter, BucketIndex]:
    """Writers A and B over different sources; B writes just before A's conditional write reaches the store."""
    hooked = HookBucket(bucket)
    a_source, b_source = FakeSource(), FakeSource()
    a_source.set(tenant, [block(tenant, n) for n in first])
    b_source.set(tenant, [block(tenant, n) for n in second])
    a = BucketIndexWriter(hooked, a_source, config(debounce=0), Clock())
    b = BucketIndexWriter(bucket, b_source, config(debounce=0), Clock())
    b.run_once()
    a.run_once()  # both have written once; A now trusts the version it wrote as its base
    a_source.set(tenant, [block(tenant, n) for n in a_view])
    b_source.set(tenant, [block(tenant, n) for n in b_view])
    hooked.hook = b.run_once
    assert a.run_once() == [tenant]
    return a, _stored(bucket, tenant)


def test_a_conflict_is_merged_keeping_both_writers_changes(bucket: ObstoreBucket, tenant: str) -> None:
    # A adds 3 and removes 1; B concurrently adds 4. The result has A's and B's changes.
    a, final = _race(bucket, tenant, first=[1, 2], second=[1, 2], a_view=[2, 3], b_view=[1, 2, 4])
    assert a.last_writes[0].conflicts == 1
    assert final.block_ids() == {block(tenant, n).id for n in (2, 3, 4)}
    # B merged too: its base was its own first write, and A had written after it.
    assert sample("shale_bucket_index_writes_total", tenant=tenant, outcome="merged") == 2


def test_a_conflict_on_the_first_write_is_merged(bucket: ObstoreBucket, tenant: str) -> None:
    hooked = HookBucket(bucket)
    a_source, b_source = FakeSource(), FakeSource()
    a_source.set(tenant, [block(tenant, 1)])
    b_source.set(tenant, [block(tenant, 2)])
    a = BucketIndexWriter(hooked, a_source, config(debounce=0), Clock())
    b = BucketIndexWriter(bucket, b_source, config(debounce=0), Clock())
    hooked.hook = b.run_once  # A found no index; B creates one before A's put-if-absent
    assert a.run_once() == [tenant]
    assert a.last_writes[0].conflicts == 1
    assert _stored(bucket, tenant).block_ids() == {block(tenant, 1).id, block(tenant, 2).id}


def test_conflicts_on_every_attempt_give_up_with_a_clear_error(bucket: ObstoreBucket, tenant: str) -> None:
    hooked = HookBucket(bucket)
    rival = FakeSource()
    rival_writer = BucketIndexWriter(bucket, rival, config(debounce=0), Clock())

    def interfere() -> None:
        rival.set(tenant, [block(tenant, rival.versions.get(tenant, 0) + 10)])
        rival_writer.write_tenant(tenant)
        hooked.hook = interfere  # again before the next attempt

    hooked.hook = interfere
    with pytest.raises(ConflictError, match=r"lost 3 conditional writes in a row.*only the metastore leader"):
        publish(hooked, BucketIndex.build(tenant, T0, [block(tenant, 1)]), None, attempts=3)


def test_a_malformed_index_is_replaced_but_a_newer_version_is_left_alone(bucket: ObstoreBucket, tenant: str) -> None:
    source = FakeSource()
    source.set(tenant, [block(tenant, 1)])
    bucket.put(bucket_index_key(tenant), b"garbage")
    assert BucketIndexWriter(bucket, source, config(debounce=0), Clock()).run_once() == [tenant]
    assert _stored(bucket, tenant).block_ids() == {block(tenant, 1).id}

    newer = gzip.compress(b'{"version": 3, "tenant": "%s", "updated_at": 1}' % tenant.encode())
    bucket.put(bucket_index_key(tenant), newer)
    writer = BucketIndexWriter(bucket, source, config(debounce=0), Clock())
    assert writer.run_once() == []
    assert sample("shale_bucket_index_writes_total", tenant=tenant, outcome="failed") == 1
    assert bucket.get(bucket_index_key(tenant)) == newer
    with pytest.raises(CorruptObjectError, match="Upgrade Shale"):
        read_index(bucket, tenant, replace_corrupt=True)



def test_the_age_keeps_growing_while_writes_fail(tenant: str) -> None:
    inner = open_bucket_url(f"memory://writer-{uuid.uuid4().hex}")
    faulty = FaultyBucket(inner)
    clock, source = Clock(), FakeSource()
    source.set(tenant, [block(tenant, 1)])
    writer = BucketIndexWriter(faulty, source, config(debounce=0, rewrite_interval=300), clock)
    assert writer.run_once() == [tenant]
    faulty.faults.append(Fault("put", key=f"^{tenant}/bucket-index", times=100))
    clock.advance(400)
    assert writer.run_once() == []
    assert sample("shale_bucket_index_age_seconds", tenant=tenant) == 400
    clock.advance(100)
    assert writer.run_once() == []
    assert sample("shale_bucket_index_age_seconds", tenant=tenant) == 500
    assert sample("shale_bucket_index_writes_total", tenant=tenant, outcome="failed") == 2
    faulty.faults.clear()
    assert writer.run_once() == [tenant]
    assert sample("shale_bucket_index_age_seconds", tenant=tenant) == 0


def test_a_failed_delta_delete_is_retried_by_the_next_write(tenant: str) -> None:
    inner = open_bucket_url(f"memory://writer-{uuid.uuid4().hex}")
    faulty = FaultyBucket(inner, [Fault("delete", key="bucket-index-deltas/")])
    clock, source = Clock(), FakeSource()
    folded = DeltaWriter(inner, Clock(T0 - 120)).write(tenant, added=[block(tenant, 1)])
    source.set(tenant, [block(tenant, 1)])
    writer = BucketIndexWriter(faulty, source, config(debounce=0), clock)
    assert writer.run_once() == [tenant], "a failed cleanup does not fail the write"
    assert _stored(inner, tenant).watermark == folded
    assert [i.key for i in list_deltas(inner, tenant)] == [folded]
    clock.advance(1)
    source.set(tenant, [block(tenant, 1), block(tenant, 2)])
    assert writer.run_once() == [tenant]
    assert writer.last_writes[0].deleted_deltas == 1
    assert list_deltas(inner, tenant) == []
