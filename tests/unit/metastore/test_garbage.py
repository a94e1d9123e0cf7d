"""Collection of uncommitted blocks: the claimability rule as a table, then the leader's bucket scan on a real
in-memory bucket and metastore (list first, read after; marks; removal after the delete delay; rebuild)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from tests.factories import BASE_MS, Clock, backup_table, write_backup_block
from tests.unit.metastore.helpers import meta, output_of

from shale.block import BlockFetcher, BlockMeta, BlockState, KafkaRange, write_block
from shale.block.writer import BlockSpec, DatasetInput
from shale.config import RetentionConfig
from shale.index import IncarnationRow, OffsetRow
from shale.metastore import (
    CommitIngestBatch,
    DeadLetterQueue,
    MetastoreService,
    OffsetRange,
    ReplaceBlocks,
    SingleNodeLog,
)
from shale.metastore.api.maintenance import Maintenance
from shale.metastore.raft.rebuild import rebuild_from_bucket
from shale.metastore.rules.fsm import StateMachine
from shale.metastore.rules.garbage import Claims, unclaimed
from shale.objstore import ObstoreBucket, open_bucket_url

OLD, NOW, NEW = "AAAAAAAAAAAAAAAAAAAAAA", "BBBBBBBBBBBBBBBBBBBBBB", "CCCCCCCCCCCCCCCCCCCCCC"


def _offset(end: int, incarnation: str = "", generation: int = 1, partition: int = 0) -> OffsetRow:
    return OffsetRow(group="backup", generation=generation, topic="app", partition=partition, committed_end=end,
                     max_event_time=0, updated_at=0, incarnation=incarnation)


def _ended(incarnation: str) -> IncarnationRow:
    return IncarnationRow(group="backup", generation=1, topic="app", partition=0, incarnation=incarnation,
                          committed_end=500, max_event_time=0, skipped=0, ended_at=0)


def _block(*ranges: tuple[int, int, str], partition: int = 0) -> BlockMeta:
    return meta(key=f"b{ranges}").model_copy(update={"kafka": [
        KafkaRange(topic="app", partition=partition, start=s, end=e, incarnation=i) for s, e, i in ranges]})


SOURCES = [meta(start=0, end=10), meta(start=10, end=20)]


@pytest.mark.parametrize(("block", "offsets", "ended", "jobs", "garbage"), [
    # level 0: a commit can still take a range ...
    (_block((0, 10, "")), [], [], [], None),  # no committed offsets for its key yet
    (_block((0, 10, "")), [_offset(100, generation=2)], [], [], None),  # only another generation has offsets
    (_block((100, 150, "")), [_offset(100)], [], [], None),  # starts at the committed end: the next commit
    (_block((150, 200, "")), [_offset(100)], [], [], None),  # beyond it: commits waiting in the DLQ come first
    (_block((0, 50, NEW)), [_offset(100, NOW)], [_ended(OLD)], [], None),  # an incarnation never seen: a first commit
    (_block((0, 10, ""), (100, 110, "")), [_offset(100)], [], [], None),  # one claimable range is enough
    (meta(key="no-ranges").model_copy(update={"kafka": []}), [_offset(100)], [], [], None),  # cannot judge: keep
    # ... or none can
    (_block((50, 150, "")), [_offset(100)], [], [], "offsets [50,100) of app[0] were committed by other blocks"),
    (_block((0, 10, "")), [_offset(100, NOW)], [], [], "offsets [0,10) of app[0]"),  # '' is the current one
    (_block((0, 10, NOW)), [_offset(100, "")], [], [], "offsets [0,10) of app[0]"),  # current not recorded
    (_block((0, 10, NOW)), [_offset(100, NOW)], [], [], "offsets [0,10) of app[0]"),
    (_block((600, 700, OLD)), [_offset(100, NOW)], [_ended(OLD)], [], f"incarnation {OLD} has ended"),
    (_block((0, 10, ""), (20, 30, "")), [_offset(100)], [], [], "offsets [20,30) of app[0]"),
    # compaction outputs: only a job of exactly their parents can commit them
    (output_of(SOURCES), [], [], [[s.id for s in SOURCES]], None),
    (output_of(SOURCES), [], [], [[SOURCES[0].id]], "no compaction job of its parents exists"),
    (output_of(SOURCES), [], [], [], "no compaction job of its parents exists"),
])
def test_claimability(block: BlockMeta, offsets: list[OffsetRow], ended: list[IncarnationRow],
                      jobs: list[list[str]], garbage: str | None) -> None:
    why = unclaimed(block, Claims.of(offsets, ended, jobs))
    if garbage is None:
        assert why is None
    else:
        assert why is not None
        assert garbage in why


# -- the leader's bucket scan ---------------------------------------------------------------------------

SYNC, DELETE = 60.0, 120.0


@pytest.fixture
def bucket() -> ObstoreBucket:
    return open_bucket_url(f"memory://garbage-{uuid.uuid4().hex}")


def _commit(block: BlockMeta) -> CommitIngestBatch:
    (r,) = block.kafka
    return CommitIngestBatch(group="backup", ranges=[OffsetRange(topic="app", partition=0, start=r.start, end=r.end)],
                             blocks=[block])


def _states(bucket: ObstoreBucket) -> dict[str, BlockState]:
    return {v.id: v.state for v in BlockFetcher(bucket, 0).sync("acme").blocks.values()}


def test_the_bucket_scan_collects_uncommitted_blocks_and_keeps_claimable_ones(tmp_path: Path,
                                                                                bucket: ObstoreBucket) -> None:
    clock = Clock()
    state = StateMachine(tmp_path / "s.db")
    service = MetastoreService(state, SingleNodeLog(state, clock=clock), clock=clock)
    committed = write_backup_block(bucket, "acme", "app", 0, 0, 10)
    assert service.submit(_commit(committed)).ok
    # A second ingest process wrote the same offsets under another id and lost the commit.
    lost = write_backup_block(bucket, "acme", "app", 0, 0, 12, block_time_ms=BASE_MS + 5)
    # The next batch's commit waits in the dead letter queue (the metastore was down when it was made).
    pending = write_backup_block(bucket, "acme", "app", 0, 10, 10)
    dlq = DeadLetterQueue(bucket)
    dlq.enqueue("backup", _commit(pending))
    # A block of a partition with no committed offsets yet, and a compaction output whose job is gone.
    other = write_backup_block(bucket, "acme", "app", 1, 0, 5)
    rows = pa.concat_tables([backup_table("app", 0, 0, 10), backup_table("app", 1, 0, 5)])
    stale = write_block(bucket, BlockSpec(id=output_of([committed, other], key="stale").id, tenant="acme",
                                          group="backup", level=1, sources=[committed.id, other.id],
                                          parents=[committed.id, other.id]),
                        [DatasetInput("records", "app", rows, "timestamp")])
    # A tombstoned block is the tombstone pass's to mark and delete, not the scan's.
    deleted = write_backup_block(bucket, "acme", "app", 2, 0, 10)
    assert service.submit(CommitIngestBatch(group="backup", blocks=[deleted], ranges=[
        OffsetRange(topic="app", partition=2, start=0, end=10)])).ok
    assert service.submit(ReplaceBlocks(tenant="acme", sources=[deleted.id], blocks=[], reason="deleted")).ok
    # A block still uploading (younger than the sync delay) is never judged, whatever it holds.
    young = write_backup_block(bucket, "acme", "app", 0, 0, 8, block_time_ms=int((clock() + 10 * SYNC) * 1000))
    clock.advance(SYNC + 1)
    maintenance = Maintenance(service, bucket, RetentionConfig(), DELETE, is_leader=lambda: True, term=lambda: 1,
                              clock=clock, sync_delay=SYNC)

    maintenance.scan_bucket()
    states = _states(bucket)
    assert states[lost.id] is BlockState.MARKED_FOR_DELETION
    assert states[stale.id] is BlockState.MARKED_FOR_DELETION
    assert states[committed.id] is BlockState.HEALTHY
    assert states[pending.id] is BlockState.HEALTHY  # claimable: it starts at the committed end
    assert states[other.id] is BlockState.HEALTHY  # another partition, no offsets committed yet
    assert states[young.id] is BlockState.FRESH  # not marked
    assert states[deleted.id] is BlockState.HEALTHY
    assert b"committed by other blocks" in bucket.get(f"acme/markers/{lost.id}-deletion-mark.json")
    # Rebuilding the index now never adopts what the scan collected.
    report = rebuild_from_bucket(bucket, tmp_path / "rebuilt.db", clock=clock)
    rebuilt = StateMachine(tmp_path / "rebuilt.db")
    assert {lost.id, stale.id} <= {t.block_id for t in rebuilt.reader.tombstones()}
    assert not {lost.id, stale.id} & {m.id for m in rebuilt.reader.tenant_blocks("acme")}
    assert report.blocks >= 3

    maintenance.replay_dlq()  # the pending commit arrives: its block is indexed, so never judged again
    assert service.get_block(pending.id) is not None
    clock.advance(DELETE + 1)
    maintenance.scan_bucket()
    states = _states(bucket)
    assert lost.id not in states
    assert stale.id not in states
    assert {committed.id, pending.id, other.id, young.id} <= set(states)


def test_a_block_committed_after_the_listing_is_never_collected(tmp_path: Path, bucket: ObstoreBucket) -> None:
    # The scan lists the bucket, then a commit lands, then the scan reads the index (one snapshot): the block is
    # indexed in that read, and the offsets past it are read with it.
    clock = Clock()
    state = StateMachine(tmp_path / "s.db")
    service = MetastoreService(state, SingleNodeLog(state, clock=clock), clock=clock)
    first = write_backup_block(bucket, "acme", "app", 0, 0, 10)
    assert service.submit(_commit(first)).ok
    late = write_backup_block(bucket, "acme", "app", 0, 10, 10)
    clock.advance(SYNC + 1)
    maintenance = Maintenance(service, bucket, RetentionConfig(), DELETE, is_leader=lambda: True, term=lambda: 1,
                              clock=clock, sync_delay=SYNC)
    linearize = service.linearize

    def commit_then_linearize() -> None:  # runs between the listing and the read
        assert service.submit(_commit(late)).ok
        linearize()

    service.linearize = commit_then_linearize  # type: ignore[method-assign]
    maintenance.scan_bucket()
    assert _states(bucket)[late.id] is BlockState.HEALTHY
