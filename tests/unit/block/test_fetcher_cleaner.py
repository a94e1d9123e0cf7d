"""Block states (seed 000) and lazy deletion, with an injectable clock."""

from __future__ import annotations

import time
import uuid

import pytest
from tests.factories import BASE_MS, Clock, backup_table, write_backup_block

from shale.block import (
    BlockFetcher,
    BlockMeta,
    BlockSpec,
    BlockState,
    Cleaner,
    DatasetInput,
    MetastoreView,
    Place,
    block_file_key,
    block_prefix,
    blocks_prefixes,
    deterministic_block_id,
    meta_key,
    quarantine_mark_key,
    write_block,
    write_deletion_mark,
    write_quarantine_mark,
)
from shale.block.layout import parse_block_key
from shale.block.marks import parse_mark
from shale.errors import CorruptObjectError
from shale.objstore import ObjectInfo, ObstoreBucket, open_bucket_url
from shale.objstore.testing import DelayedVisibilityBucket

SYNC, DELETE = 60.0, 120.0


@pytest.fixture
def bucket() -> ObstoreBucket:
    return open_bucket_url(f"memory://fetch-{uuid.uuid4().hex}")


@pytest.fixture
def clock() -> Clock:
    return Clock()


def _fetcher(bucket: ObstoreBucket, clock: Clock) -> BlockFetcher:
    return BlockFetcher(bucket, SYNC, clock=clock)


def _states(fetcher: BlockFetcher) -> dict[str, BlockState]:
    return {b.id: b.state for b in fetcher.sync("acme").blocks.values()}


def _now_ms() -> int:
    return int(time.time() * 1000)


def test_fresh_then_healthy(bucket: ObstoreBucket, clock: Clock) -> None:
    meta = write_backup_block(bucket, "acme", "app", 0, 0, 10, block_time_ms=_now_ms())
    fetcher = _fetcher(bucket, clock)
    assert _states(fetcher) == {meta.id: BlockState.FRESH}
    clock.advance(SYNC)
    assert _states(fetcher) == {meta.id: BlockState.HEALTHY}
    assert fetcher.sync("acme").metas(BlockState.HEALTHY) == [meta]


def test_ignore_delay_makes_a_block_healthy_at_once(bucket: ObstoreBucket, clock: Clock) -> None:
    meta = write_backup_block(bucket, "acme", "app", 0, 0, 10, block_time_ms=_now_ms(), ignore_delay=True)
    assert _states(_fetcher(bucket, clock)) == {meta.id: BlockState.HEALTHY}


def test_missing_meta_is_fresh_then_partial(bucket: ObstoreBucket, clock: Clock) -> None:
    block = deterministic_block_id(_now_ms(), "partial")
    bucket.put(block_file_key(Place("acme", block), "records-0.parquet"), b"half an upload")
    fetcher = _fetcher(bucket, clock)
    assert _states(fetcher) == {block: BlockState.FRESH}
    clock.advance(SYNC)
    assert _states(fetcher) == {block: BlockState.PARTIAL}


def test_old_ulid_time_with_a_recent_upload_is_not_partial(bucket: ObstoreBucket, clock: Clock) -> None:
    # A deterministic id carrying last week's Kafka time, uploaded just now: still Fresh, not Partial.
    block = deterministic_block_id(BASE_MS, "old-time")
    bucket.put(block_file_key(Place("acme", block), "records-0.parquet"), b"uploading")
    assert _states(_fetcher(bucket, clock)) == {block: BlockState.FRESH}


def test_deletion_mark_wins_over_every_other_state(bucket: ObstoreBucket, clock: Clock) -> None:
    meta = write_backup_block(bucket, "acme", "app", 0, 0, 10)
    write_deletion_mark(bucket, "acme", meta.id, clock(), "test")
    view = _fetcher(bucket, clock).sync("acme").blocks[meta.id]
    assert view.state is BlockState.MARKED_FOR_DELETION
    assert view.mark is not None
    assert view.mark.reason == "test"
    assert not view.readable


def test_full_overlap_rule_from_the_seed(bucket: ObstoreBucket, clock: Clock) -> None:
    a = write_backup_block(bucket, "acme", "app", 0, 0, 10)
    b = write_backup_block(bucket, "acme", "app", 0, 10, 10)
    e = write_backup_block(bucket, "acme", "app", 0, 20, 10)
    table = backup_table("app", 0, 0, 20)
    merged = write_block(bucket, BlockSpec(id=deterministic_block_id(BASE_MS, "ab"), tenant="acme", group="backup",
                                           level=1, sources=[a.id, b.id], parents=[a.id, b.id]),
                         [DatasetInput("records", "app", table, "timestamp")])
    clock.advance(SYNC)
    states = _states(_fetcher(bucket, clock))
    assert states[a.id] is BlockState.HEALTHY_OVERLAPPED
    assert states[b.id] is BlockState.HEALTHY_OVERLAPPED
    assert states[merged.id] is BlockState.HEALTHY
    assert states[e.id] is BlockState.HEALTHY  # not in the merged block's sources: never overlapped


def test_partial_overlap_is_not_full_overlap(bucket: ObstoreBucket, clock: Clock) -> None:
    # The seed's second example: F holds A..D, but the older block holds A..E: F does not cover it.
    ids = [deterministic_block_id(BASE_MS, f"src-{c}") for c in "ABCDE"]
    table = backup_table("app", 0, 0, 5)
    older = write_block(bucket, BlockSpec(id=deterministic_block_id(BASE_MS, "ABCDE"), tenant="acme", group="backup",
                                          level=1, sources=ids), [DatasetInput("records", "app", table, "timestamp")])
    newer = write_block(bucket, BlockSpec(id=deterministic_block_id(BASE_MS + 1, "ABCD"), tenant="acme",
                                          group="backup", level=1, sources=ids[:4]),
                        [DatasetInput("records", "app", table, "timestamp")])
    clock.advance(SYNC)
    states = _states(_fetcher(bucket, clock))
    assert states[older.id] is BlockState.HEALTHY
    assert states[newer.id] is BlockState.HEALTHY_OVERLAPPED  # all of its sources are inside the older one


def test_corrupt_meta_is_reported_and_kept_until_the_delays(bucket: ObstoreBucket, clock: Clock) -> None:
    block = deterministic_block_id(_now_ms(), "corrupt")
    bucket.put(block_file_key(Place("acme", block), "records-0.parquet"), b"data")
    bucket.put(meta_key(Place("acme", block)), b"{not json")
    fetcher = _fetcher(bucket, clock)
    cleaner = Cleaner(bucket, fetcher, DELETE, clock=clock)
    view = fetcher.sync("acme").blocks[block]
    assert view.state is BlockState.FRESH
    assert view.error is not None
    assert f"meta.json of block {block} is not JSON" in view.error
    assert cleaner.run("acme").actions == []
    clock.advance(SYNC)
    assert fetcher.sync("acme").blocks[block].state is BlockState.PARTIAL
    report = cleaner.run("acme")
    assert [(a.kind, a.block_id) for a in report.actions] == [("mark", block)]
    assert "not JSON" in report.actions[0].reason
    clock.advance(DELETE - 1)
    assert cleaner.run("acme").actions == []  # nothing deleted before the delete delay
    assert bucket.get(block_file_key(Place("acme", block), "records-0.parquet")) == b"data"
    clock.advance(1)
    assert [a.kind for a in cleaner.run("acme").actions] == ["delete"]
    assert list(bucket.list("")) == []


def test_cleaner_removes_marked_blocks_only_after_the_delete_delay(bucket: ObstoreBucket, clock: Clock) -> None:
    keep = write_backup_block(bucket, "acme", "app", 0, 0, 10)
    drop = write_backup_block(bucket, "acme", "app", 0, 10, 10)
    write_deletion_mark(bucket, "acme", drop.id, clock(), "retention")
    cleaner = Cleaner(bucket, _fetcher(bucket, clock), DELETE, clock=clock)
    assert cleaner.run("acme").actions == []
    clock.advance(DELETE)
    dry = cleaner.run("acme", dry_run=True)
    assert [(a.kind, a.block_id) for a in dry.actions] == [("delete", drop.id)]
    assert bucket.head(meta_key(drop))  # dry run changed nothing
    cleaner.run("acme")
    assert {parsed.block_id for i in bucket.list("") if (parsed := parse_block_key(i.key))} == {keep.id}


def test_an_interrupted_delete_is_finished_later(bucket: ObstoreBucket, clock: Clock) -> None:
    meta = write_backup_block(bucket, "acme", "app", 0, 0, 10)
    write_deletion_mark(bucket, "acme", meta.id, clock(), "compacted")
    clock.advance(DELETE)
    bucket.delete(meta_key(meta))  # the delete stopped right after removing meta.json
    fetcher = _fetcher(bucket, clock)
    assert _states(fetcher) == {meta.id: BlockState.MARKED_FOR_DELETION}
    Cleaner(bucket, fetcher, DELETE, clock=clock).run("acme")
    assert list(bucket.list("")) == []


def test_a_delete_that_stopped_before_its_mark_leaves_an_orphan_mark_that_is_removed(
        bucket: ObstoreBucket, clock: Clock) -> None:
    meta = write_backup_block(bucket, "acme", "app", 0, 0, 10)
    write_deletion_mark(bucket, "acme", meta.id, clock(), "compacted")
    for info in list(bucket.list(block_prefix(meta))):
        bucket.delete(info.key)
    result = _fetcher(bucket, clock).sync("acme")
    assert list(result.orphan_marks) == [meta.id]
    report = Cleaner(bucket, _fetcher(bucket, clock), DELETE, clock=clock).run("acme")
    assert [(a.kind, a.block_id) for a in report.actions] == [("delete-orphan-mark", meta.id)]
    assert list(bucket.list("acme/markers/")) == []


def test_protected_blocks_are_never_marked_or_deleted(bucket: ObstoreBucket, clock: Clock) -> None:
    block = deterministic_block_id(_now_ms(), "protected")
    bucket.put(block_file_key(Place("acme", block), "records-0.parquet"), b"data")
    clock.advance(SYNC + DELETE)
    report = Cleaner(bucket, _fetcher(bucket, clock), DELETE, clock=clock).run(
        "acme", metastore=lambda: MetastoreView(frozenset({block})))
    assert report.actions == []
    assert report.protected == [block]
    assert bucket.get(block_file_key(Place("acme", block), "records-0.parquet")) == b"data"


def test_an_unindexed_copy_of_a_compaction_is_marked_whatever_its_id(bucket: ObstoreBucket, clock: Clock) -> None:
    # Two attempts of one compaction job wrote outputs with the same sources; the metastore committed one. The
    # other must go even when the id tie-break of the full-overlap rule would keep it.
    a = write_backup_block(bucket, "acme", "app", 0, 0, 10)
    b = write_backup_block(bucket, "acme", "app", 0, 10, 10)
    table = backup_table("app", 0, 0, 20)
    outputs = sorted(write_block(bucket, BlockSpec(id=deterministic_block_id(BASE_MS, f"ab/{token}"), tenant="acme",
                                                   group="backup", level=1, sources=[a.id, b.id],
                                                   parents=[a.id, b.id]),
                                 [DatasetInput("records", "app", table, "timestamp")]).id for token in (1, 2))
    clock.advance(SYNC)
    for committed, lost in (outputs, outputs[::-1]):
        report = Cleaner(bucket, _fetcher(bucket, clock), DELETE, clock=clock).plan(
            _fetcher(bucket, clock).sync("acme"), MetastoreView(frozenset({committed})))
        marked = {act.block_id for act in report.actions if act.kind == "mark"}
        assert lost in marked
        assert committed not in marked


def _uncommitted_compaction(bucket: ObstoreBucket) -> tuple[BlockMeta, BlockMeta, BlockMeta]:
    """Two committed level-0 blocks and a compaction output of both that was never committed."""
    a = write_backup_block(bucket, "acme", "app", 0, 0, 10)
    b = write_backup_block(bucket, "acme", "app", 0, 10, 10)
    out = write_block(bucket, BlockSpec(id=deterministic_block_id(BASE_MS, "ab/uncommitted"), tenant="acme",
                                        group="backup", level=1, sources=[a.id, b.id], parents=[a.id, b.id]),
                      [DatasetInput("records", "app", backup_table("app", 0, 0, 20), "timestamp")])
    return a, b, out


def test_without_the_metastore_overlap_marks_are_refused_unless_forced(bucket: ObstoreBucket, clock: Clock) -> None:
    # Nobody knows which copy is committed: here the superset is the uncommitted one, and marking its sources
    # would delete the only committed copy of their records.
    a, b, _ = _uncommitted_compaction(bucket)
    partial = deterministic_block_id(_now_ms(), "partial")
    bucket.put(block_file_key(Place("acme", partial), "records-0.parquet"), b"x")
    clock.advance(SYNC)
    cleaner = Cleaner(bucket, _fetcher(bucket, clock), DELETE, clock=clock)
    report = cleaner.run("acme")
    assert [(act.kind, act.block_id) for act in report.actions] == [("mark", partial)]
    assert {act.block_id for act in report.refused} == {a.id, b.id}
    assert all("without the metastore" in act.reason for act in report.refused)
    assert _states(_fetcher(bucket, clock))[a.id] is BlockState.HEALTHY_OVERLAPPED  # not marked
    forced = cleaner.plan(_fetcher(bucket, clock).sync("acme"), force=True)
    assert {act.block_id for act in forced.actions if act.kind == "mark"} == {a.id, b.id}


def test_with_the_metastore_indexed_blocks_are_never_marked(bucket: ObstoreBucket, clock: Clock) -> None:
    a, b, out = _uncommitted_compaction(bucket)
    clock.advance(SYNC)
    cleaner = Cleaner(bucket, _fetcher(bucket, clock), DELETE, clock=clock)
    report = cleaner.run("acme", metastore=lambda: MetastoreView(frozenset({a.id, b.id})))
    assert report.actions == []
    assert report.refused == []
    assert report.protected == sorted([a.id, b.id])
    judged = cleaner.run("acme", metastore=lambda: MetastoreView(frozenset({a.id, b.id}),
                                                                 unclaimed=lambda m: "no job" if m.level else None))
    assert [(act.block_id, act.reason) for act in judged.actions] == [(out.id, "no job")]


def test_delayed_visibility_never_makes_a_fresh_block_partial_or_missing_too_early(clock: Clock) -> None:
    # The store shows new objects 20s late; the sync delay is 60s. At no point before the sync delay may
    # the block be judged Partial, and once the sync delay has passed it is Healthy, not Partial.
    inner = open_bucket_url(f"memory://delayed-{uuid.uuid4().hex}")
    delayed = DelayedVisibilityBucket(inner, delay=20, clock=clock)
    fetcher = BlockFetcher(delayed, SYNC, clock=clock)
    meta = write_backup_block(delayed, "acme", "app", 0, 0, 10, block_time_ms=int(clock() * 1000))  # type: ignore[arg-type]
    seen = []
    clock.advance(1)
    for _ in range(8):
        states = {b.id: b.state for b in fetcher.sync("acme").blocks.values()}
        seen.append(states.get(meta.id))
        clock.advance(10)
    assert BlockState.PARTIAL not in seen
    assert seen[:2] == [None, None]  # invisible at first: not judged at all
    assert seen[2:6] == [BlockState.FRESH] * 4
    assert seen[6:] == [BlockState.HEALTHY] * 2


def test_a_steady_state_sync_costs_one_list_per_prefix(bucket: ObstoreBucket, clock: Clock) -> None:
    for i in range(30):
        write_backup_block(bucket, "acme", "app", 0, i * 10, 10)
    write_deletion_mark(bucket, "acme", deterministic_block_id(BASE_MS, "backup/1/app/0/0/10"), clock(), "x")
    fetcher = _fetcher(bucket, clock)
    bucket.calls.reset()
    fetcher.sync("acme")
    assert bucket.calls.snapshot()["get"] == 31  # 30 meta.json + 1 mark, once
    bucket.calls.reset()
    fetcher.sync("acme")
    lists = len(blocks_prefixes("acme")) + 1  # and the markers
    assert bucket.calls.snapshot() == {"get": 0, "get_range": 0, "head": 0, "list": lists, "put": 0, "delete": 0}


def test_a_quarantined_block_is_skipped_by_readers_and_never_deleted(bucket: ObstoreBucket, clock: Clock) -> None:
    damaged = write_backup_block(bucket, "acme", "app", 0, 0, 10)
    partial = write_backup_block(bucket, "acme", "app", 0, 10, 10)
    unreadable = write_backup_block(bucket, "acme", "app", 0, 20, 10)
    bucket.delete(meta_key(partial))
    write_quarantine_mark(bucket, "acme", damaged.id, clock(), ["checksum-mismatch: records-0.parquet"], "lost")
    write_quarantine_mark(bucket, "acme", partial.id, clock(), ["meta.json: missing"], "lost")
    bucket.put(quarantine_mark_key("acme", unreadable.id), b"{not json")
    write_deletion_mark(bucket, "acme", damaged.id, clock(), "someone marked it too")
    clock.advance(SYNC + DELETE + 1)
    fetcher = _fetcher(bucket, clock)
    result = fetcher.sync("acme")
    assert {v.id: v.state for v in result.blocks.values()} == {
        damaged.id: BlockState.QUARANTINED, partial.id: BlockState.QUARANTINED, unreadable.id: BlockState.QUARANTINED}
    assert not any(v.readable for v in result.blocks.values())
    view = result.blocks[damaged.id]
    assert view.quarantine is not None
    assert view.quarantine.damage == ["checksum-mismatch: records-0.parquet"]
    assert "not valid" in (result.blocks[unreadable.id].quarantine.reason or "")  # type: ignore[union-attr]
    cleaner = Cleaner(bucket, fetcher, DELETE, clock=clock)
    for view_ in (None, MetastoreView(frozenset(), unclaimed=lambda m: "uncommitted")):
        report = cleaner.run("acme", metastore=None if view_ is None else (lambda v=view_: v), force=True)
        assert report.actions == [], report
    assert len(list(bucket.list("group=backup/tenant=acme/"))) == 2 + 1 + 2  # every object is still there
    # A quarantine mark is not a deletion mark: the deletion-mark parser refuses it.
    with pytest.raises(CorruptObjectError, match="deletion mark is not valid"):
        parse_mark(bucket.get(quarantine_mark_key("acme", damaged.id)), "k")


# --- a narrowed sync: one group's blocks made since a time (what an ingest driver's lost-batch sweep lists) ---------

class _Listing:
    """The bucket, counting its LISTs and the keys they return."""

    def __init__(self, inner: ObstoreBucket) -> None:
        self.inner, self.lists, self.keys = inner, 0, 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def list(self, prefix: str = "", start_after: str | None = None) -> list[ObjectInfo]:
        self.lists += 1
        found = list(self.inner.list(prefix, start_after))
        self.keys += len(found)
        return found


def _block_at(bucket: ObstoreBucket, group: str, time_ms: int, day: str | None = None) -> BlockMeta:
    spec = BlockSpec(id=deterministic_block_id(time_ms, f"{group}{day}"), tenant="acme", group=group,
                     partition_values={"dt": day} if day else {})
    return write_block(bucket, spec, [DatasetInput("records", "app", backup_table("app", 0, 0, 2), "timestamp")])


@pytest.mark.parametrize("since", [0, 1, 2, 3])
def test_a_sync_of_one_group_since_a_time_lists_from_that_time_on_in_each_day(bucket: ObstoreBucket,
                                                                             since: int) -> None:
    times = [BASE_MS + i * 60_000 for i in range(3)]
    partition = [_block_at(bucket, "partition", t, day) for t in times for day in ("2026-11-17", "2026-11-18")]
    backup = [_block_at(bucket, "backup", t) for t in times]
    write_deletion_mark(bucket, "acme", partition[0].id, 0.0, "test")
    write_deletion_mark(bucket, "acme", backup[0].id, 0.0, "test")
    since_ms = [0, times[0], times[1] + 1, times[2] + 1][since]
    listing = _Listing(bucket)
    fetcher = BlockFetcher(listing, 0.0)  # type: ignore[arg-type]
    assert fetcher.tenants("partition") == ["acme"]
    for group, blocks in (("partition", partition), ("backup", backup)):
        result = fetcher.sync("acme", group=group, since_ms=since_ms)
        assert sorted(result.blocks) == sorted(b.id for b in blocks if b.time_ms >= since_ms)
        assert result.orphan_marks == {}  # a narrowed sync cannot tell: the other group's marks are not orphans
        marked = {b for b, v in result.blocks.items() if v.state is BlockState.MARKED_FOR_DELETION}
        assert marked == {b.id for b in blocks[:1] if b.time_ms >= since_ms}
    if since_ms > times[0]:  # each LIST began at the time: no key of an older block was returned
        objects_per_block = len(partition[0].files) + 1
        assert listing.keys == objects_per_block * sum(b.time_ms >= since_ms for b in partition + backup) + 2 * 2
    whole = BlockFetcher(bucket, 0.0).sync("acme")
    assert sorted(whole.blocks) == sorted(b.id for b in partition + backup)
