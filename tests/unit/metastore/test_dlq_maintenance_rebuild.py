"""Dead letter queue, retention, tombstone collection and rebuilding the index from the bucket."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from tests.factories import BASE_MS, backup_table, write_backup_block
from tests.unit.metastore.helpers import meta

from shale.block import (
    BlockSpec,
    DatasetInput,
    KafkaRange,
    deterministic_block_id,
    meta_key,
    write_block,
    write_deletion_mark,
)
from shale.block.layout import LAYOUT, LEGACY_LAYOUT, block_prefix
from shale.config import RetentionConfig
from shale.errors import MetastoreUnavailableError
from shale.index import TombstoneRow
from shale.metastore import (
    AddBlocks,
    CommitIngestBatch,
    DeadLetterQueue,
    MetastoreService,
    OffsetRange,
    ReplaceBlocks,
    Result,
    SetActiveGeneration,
    SingleNodeLog,
    StateMachine,
    encode,
)
from shale.metastore.api.maintenance import Maintenance, expired_partitions, remove_block_objects
from shale.metastore.raft.rebuild import rebuild_from_bucket
from shale.objstore import ObstoreBucket, open_bucket_url

DAY = 86_400


@pytest.fixture
def bucket() -> ObstoreBucket:
    return open_bucket_url(f"memory://ms-{uuid.uuid4().hex}")


def _service(tmp_path: Path, name: str = "state.db", clock: object = time.time) -> MetastoreService:
    state = StateMachine(tmp_path / name)
    return MetastoreService(state, SingleNodeLog(state, clock=clock))  # type: ignore[arg-type]


def _commit(start: int, end: int) -> CommitIngestBatch:
    return CommitIngestBatch(group="backup", ranges=[OffsetRange(topic="app", partition=0, start=start, end=end)],
                             blocks=[meta(start=start, end=end)])


def test_dlq_replays_in_order_once_the_metastore_is_back(tmp_path: Path, bucket: ObstoreBucket) -> None:
    service = _service(tmp_path)
    dlq = DeadLetterQueue(bucket)
    keys = [dlq.enqueue("backup", _commit(i * 100, i * 100 + 100)) for i in range(5)]
    assert dlq.pending("backup") == sorted(keys) == keys

    def down(_: bytes) -> Result:
        raise MetastoreUnavailableError("down")

    report = dlq.replay(down)
    assert report.replayed == []
    assert report.pending == keys
    report = dlq.replay(service.submit_bytes)
    assert report.replayed == keys
    assert dlq.pending() == []
    assert service.offsets("backup")[0].committed_end == 500
    # A second replay of the same commands (by the writer itself) is harmless: exact replays are no-ops.
    for key in keys[:2]:
        bucket.put(key, b"")
    bucket.delete(keys[0])
    bucket.delete(keys[1])
    assert dlq.replay(service.submit_bytes).rejected == []


def test_dlq_moves_a_rejected_command_aside(tmp_path: Path, bucket: ObstoreBucket) -> None:
    service = _service(tmp_path)
    service.submit(_commit(0, 100)).raise_for_rejection()
    dlq = DeadLetterQueue(bucket)
    key = dlq.enqueue("backup", _commit(200, 300))  # a gap: can never apply
    report = dlq.replay(service.submit_bytes)
    assert report.rejected == [key]
    assert dlq.pending() == []
    moved = bucket.get(key.replace("_shale/dlq/", "_shale/dlq-rejected/"))
    assert b"offset-gap" in moved


def test_expired_partitions_respect_creation_and_data_time(tmp_path: Path) -> None:
    service = _service(tmp_path)
    old = meta(start=0, time_ms=BASE_MS, min_time=BASE_MS, max_time=BASE_MS + 1000)
    backfill = meta(start=100, end=200, time_ms=BASE_MS + 1, min_time=BASE_MS, max_time=BASE_MS + 40 * DAY * 1000,
                    key="backfill", tenant="beta")
    service.submit(AddBlocks(blocks=[old, backfill]))
    retention = RetentionConfig(default=30 * DAY)
    rows = service.state.reader.partitions()
    now = BASE_MS + 31 * DAY * 1000
    assert [p.tenant for p in expired_partitions(rows, retention, now)] == ["acme"]
    assert expired_partitions(rows, RetentionConfig(default=0), now) == []
    assert expired_partitions(rows, RetentionConfig(default=30 * DAY, tenants={"acme": 60 * DAY}), now) == []


def test_a_tombstone_without_a_prefix_is_of_before_and_one_naming_another_block_is_refused(
        bucket: ObstoreBucket) -> None:
    old = write_backup_block(bucket, "acme", "app", 0, 0, 10, layout=LEGACY_LAYOUT)
    other = write_backup_block(bucket, "acme", "app", 0, 10, 10)
    row = TombstoneRow(seq=1, block_id=old.id, tenant="acme", shard=0, created_at=0, reason="x",
                       files=[f.name for f in old.files])
    with pytest.raises(ValueError, match="not the folder of block"):
        remove_block_objects(bucket, row.model_copy(update={"prefix": block_prefix(other)}))
    assert bucket.head(meta_key(other))
    remove_block_objects(bucket, row)  # a metastore of before names no prefix: <tenant>/blocks/
    assert list(bucket.list(block_prefix(old))) == []
    assert bucket.head(meta_key(other))


@pytest.mark.parametrize("layout", [LAYOUT, LEGACY_LAYOUT])
def test_retention_marks_then_tombstones_then_removes_after_the_delay(tmp_path: Path, bucket: ObstoreBucket,
                                                                      layout: int) -> None:
    """In either layout: a block under its group's prefix, or under <tenant>/blocks/ as before."""
    now = [BASE_MS / 1000 + 31 * DAY]
    service = _service(tmp_path, clock=lambda: now[0])
    block = write_backup_block(bucket, "acme", "app", 0, 0, 10, layout=layout)
    service.submit(AddBlocks(blocks=[block]))
    m = Maintenance(service, bucket, RetentionConfig(default=30 * DAY), delete_delay=600, is_leader=lambda: True,
                    term=lambda: 1, clock=lambda: now[0])
    assert m.apply_retention() == 1
    assert service.state.reader.count_blocks() == 0
    assert [t.block_id for t in service.tombstones()] == [block.id]
    assert bucket.head(f"acme/markers/{block.id}-deletion-mark.json")
    assert m.collect_tombstones() == 0  # not before the delete delay
    assert bucket.head(meta_key(block))
    assert [t.prefix for t in service.tombstones()] == [block_prefix(block)]
    now[0] += 601
    assert m.collect_tombstones() == 1
    assert list(bucket.list("")) == []
    assert service.tombstones() == []


def test_compaction_tombstones_get_marks_once_the_output_is_past_the_sync_delay(tmp_path: Path,
                                                                              bucket: ObstoreBucket) -> None:
    """Issue 26 case 14: marking the sources at once, while the output is still Fresh, left bucket scanners with
    neither copy. The mark waits until the tombstone (as old as the output's commit) is ``sync_delay`` old."""
    now = [time.time()]
    service = _service(tmp_path, clock=lambda: now[0])
    a = write_backup_block(bucket, "acme", "app", 0, 0, 10)
    service.submit(AddBlocks(blocks=[a]))
    service.submit(ReplaceBlocks(tenant="acme", sources=[a.id], blocks=[], reason="deleted by test"))
    m = Maintenance(service, bucket, RetentionConfig(), delete_delay=3600, is_leader=lambda: True, term=lambda: 1,
                    clock=lambda: now[0], sync_delay=900)
    m.collect_tombstones()
    assert list(bucket.list("acme/markers/")) == []  # its replacement is still Fresh
    now[0] += 901
    m.collect_tombstones()
    assert b"deleted by test" in bucket.get(f"acme/markers/{a.id}-deletion-mark.json")
    assert bucket.head(meta_key(a))


def test_rebuilt_index_answers_like_the_live_one(tmp_path: Path, bucket: ObstoreBucket) -> None:
    service = _service(tmp_path)
    blocks = []
    for i in range(6):
        block = write_backup_block(bucket, "acme", "app", i % 2, (i // 2) * 10, 10)
        r = service.submit(CommitIngestBatch(group="backup", ranges=[
            OffsetRange(topic="app", partition=i % 2, start=(i // 2) * 10, end=(i // 2) * 10 + 10)], blocks=[block]))
        assert r.ok, r.message
        blocks.append(block)
    # Compact partition 0's first two blocks, as a compactor would: output block, then ReplaceBlocks, then marks.
    sources = [blocks[0], blocks[2]]
    merged = write_block(bucket, BlockSpec(
        id=deterministic_block_id(BASE_MS, "merged"), tenant="acme", group="backup", level=1,
        sources=[s.id for s in sources], parents=[s.id for s in sources], kafka=[
            blocks[0].kafka[0].model_copy(update={"end": 20})]),
        [DatasetInput("records", "app", backup_table("app", 0, 0, 20), "timestamp", labels=[{"topic": "app"}])])
    service.submit(ReplaceBlocks(tenant="acme", sources=[s.id for s in sources], blocks=[merged])).raise_for_rejection()
    write_deletion_mark(bucket, "acme", blocks[0].id, time.time(), "compacted")  # one marked, one only overlapped
    # An orphan past a gap: a complete block whose commit never happened and never could (offsets [30, 40)
    # are missing). A contiguous uncommitted tail, by contrast, is adopted: its records are nowhere else.
    orphan = write_backup_block(bucket, "acme", "app", 1, 40, 10)

    report = rebuild_from_bucket(bucket, tmp_path / "rebuilt.db")
    rebuilt = StateMachine(tmp_path / "rebuilt.db")
    assert report.excluded == [(orphan.id, report.excluded[0][1])]
    live_ids = sorted(m.id for m in service.state.reader.query_blocks(["acme"], 0, 2**62))
    assert sorted(m.id for m in rebuilt.reader.query_blocks(["acme"], 0, 2**62)) == live_ids
    assert [(o.topic, o.partition, o.committed_end) for o in rebuilt.reader.offsets()] == [
        (o.topic, o.partition, o.committed_end) for o in service.state.reader.offsets()]
    assert {t.block_id for t in rebuilt.reader.tombstones()} == {s.id for s in sources}
    with pytest.raises(Exception, match="exists"):
        rebuild_from_bucket(bucket, tmp_path / "rebuilt.db")


def test_rebuild_adopts_one_chain_where_a_garbage_block_overlaps_the_committed_ones(tmp_path: Path,
                                                                                   bucket: ObstoreBucket) -> None:
    service = _service(tmp_path)
    committed = [write_backup_block(bucket, "acme", "app", 0, start, 10) for start in (0, 10, 20, 30)]
    for block in committed:
        (r,) = block.kafka
        assert service.submit(CommitIngestBatch(group="backup", blocks=[block], ranges=[
            OffsetRange(topic="app", partition=0, start=r.start, end=r.end)])).ok
    # The first two are compacted (a committed level-1 output; its sources marked, as the metastore does).
    merged = write_block(bucket, BlockSpec(
        id=deterministic_block_id(BASE_MS, "merged"), tenant="acme", group="backup", level=1,
        sources=[b.id for b in committed[:2]], parents=[b.id for b in committed[:2]],
        kafka=[committed[0].kafka[0].model_copy(update={"end": 20})]),
        [DatasetInput("records", "app", backup_table("app", 0, 0, 20), "timestamp", labels=[{"topic": "app"}])])
    service.submit(ReplaceBlocks(tenant="acme", sources=[b.id for b in committed[:2]], blocks=[merged]))
    for block in committed[:2]:
        write_deletion_mark(bucket, "acme", block.id, time.time(), f"compacted into {merged.id}")
    # Garbage of crashed batches: one overlapping the compacted output and a committed block, one inside a
    # committed block; and one that the leader's scan already marked (never adopted, whatever it holds).
    crashed = write_backup_block(bucket, "acme", "app", 0, 10, 15, block_time_ms=BASE_MS + 1)
    inside = write_backup_block(bucket, "acme", "app", 0, 30, 5, block_time_ms=BASE_MS + 2)
    collected = write_backup_block(bucket, "acme", "app", 0, 0, 40, block_time_ms=BASE_MS + 3)
    write_deletion_mark(bucket, "acme", collected.id, time.time(), "uncommitted: offsets [0,40) of app[0] were ...")

    report = rebuild_from_bucket(bucket, tmp_path / "rebuilt.db")
    rebuilt = StateMachine(tmp_path / "rebuilt.db")
    adopted = {m.id for m in rebuilt.reader.tenant_blocks("acme")}
    assert adopted == {merged.id, committed[2].id, committed[3].id}
    assert dict(report.excluded).keys() == {crashed.id, inside.id}
    assert "are also in" in dict(report.excluded)[crashed.id]
    assert collected.id in {t.block_id for t in rebuilt.reader.tombstones()}
    assert [(o.topic, o.committed_end) for o in rebuilt.reader.offsets()] == [("app", 40)]
    # Every offset once: the adopted blocks tile [0, 40) exactly.
    spans = sorted((r.start, r.end) for m in rebuilt.reader.tenant_blocks("acme") for r in m.kafka)
    assert spans == [(0, 20), (20, 30), (30, 40)]


def test_rebuild_keeps_both_incarnations_of_a_recreated_topic(tmp_path: Path, bucket: ObstoreBucket) -> None:
    old, new = "AAAAAAAAAAAAAAAAAAAAAA", "BBBBBBBBBBBBBBBBBBBBBB"
    before, after = (write_block(bucket, BlockSpec(
        id=deterministic_block_id(at, incarnation), tenant="acme", group="backup",
        kafka=[KafkaRange(topic="app", partition=0, start=0, end=count, incarnation=incarnation)]),
        [DatasetInput("records", "app", backup_table("app", 0, 0, count), "timestamp")])
        for at, incarnation, count in ((BASE_MS, old, 100), (BASE_MS + 60_000, new, 30)))
    report = rebuild_from_bucket(bucket, tmp_path / "rebuilt.db")
    rebuilt = StateMachine(tmp_path / "rebuilt.db")
    assert report.excluded == []  # the same offsets of two incarnations are different records
    assert {m.id for m in rebuilt.reader.tenant_blocks("acme")} == {before.id, after.id}
    assert [(o.committed_end, o.incarnation) for o in rebuilt.reader.offsets()] == [(30, new)]
    assert [(i.committed_end, i.incarnation) for i in rebuilt.reader.incarnations()] == [(100, old)]


def test_the_dlq_replays_only_what_a_writer_leaves_there(tmp_path: Path, bucket: ObstoreBucket) -> None:
    """Issue 27, case 3: any bucket writer can put a file under _shale/dlq/; the leader replays only ingest commits,
    so a bucket writer cannot retire, replace or truncate through it."""
    service = _service(tmp_path)
    victim = meta(start=0, end=100)
    assert service.submit(AddBlocks(blocks=[victim])).ok
    dlq = DeadLetterQueue(bucket)
    forged = [ReplaceBlocks(tenant="acme", sources=[victim.id], blocks=[]),
              SetActiveGeneration(tenant="acme", topic="app", generation=9, start=0, end=2**62, retire=True)]
    keys = [f"_shale/dlq/backup/{i}-forged.json" for i in range(len(forged))]
    for key, command in zip(keys, forged, strict=True):
        bucket.put(key, encode(command))
    bucket.put("_shale/dlq/backup/9-junk.json", b"not a command")
    honest = dlq.enqueue("backup", _commit(100, 200))
    report = dlq.replay(service.submit_bytes)
    assert report.replayed == [honest]
    assert sorted(report.rejected) == sorted([*keys, "_shale/dlq/backup/9-junk.json"])
    assert service.get_block(victim.id) is not None
    assert service.tombstones() == []
    assert service.generation_rules("acme") == []
    aside = bucket.get("_shale/dlq-rejected/backup/0-forged.json")
    assert b'"reason":"not-replayable"' in aside
    with pytest.raises(ValueError, match="never replayed"):
        dlq.enqueue("backup", forged[0])
