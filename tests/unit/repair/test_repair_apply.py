"""A repair end to end on an in-memory bucket and an embedded metastore, with blocks written by the ingest path:
the scan, the plan, the apply (builds in this process with the same function a Spark task runs), a step that fails
half-way and a second run that finishes it, and the state after: every record once, verify clean, the index and
the bucket agreeing, nothing deleted that is not held elsewhere."""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

from shale.block import BlockFetcher, BlockMeta, BlockState, block_file_key, meta_key, read_dataset
from shale.block.schemas import BACKUP_SCHEMA
from shale.block.verify import verify_tenant
from shale.config import ShaleConfig
from shale.encoder.chunks import Chunk, GroupSpec, write_chunk
from shale.errors import ShaleError
from shale.ingest.committer import batch_commit
from shale.ingest.plan import PartitionRange
from shale.metastore import AddBlocks, MetastoreService, open_metastore
from shale.metastore.rules.commands import QuarantineBlocks, ReplaceBlocks, Result
from shale.objstore import ObstoreBucket, open_bucket
from shale.repair.apply import apply_plan
from shale.repair.build import LocalBuilder
from shale.repair.model import KafkaPartition, Plan
from shale.repair.plan import plan_repair
from shale.repair.scan import Scan, current_parsers, scan_tenant

BASE_S = 1_795_000_000
INC = "AAAAAAAAAAAAAAAAAAAAAA"
PARSER = {"topic_pattern": "app", "parser": "json",
          "options": {"time_field": "ts", "time_format": "epoch_s", "label_fields": ["level"], "fields": ["msg"]}}


def records(partition: int, start: int, end: int) -> pa.Table:
    offsets = list(range(start, end))
    return pa.table({
        "topic": ["app"] * len(offsets), "partition": pa.array([partition] * len(offsets), pa.int32()),
        "offset": pa.array(offsets, pa.int64()),
        "timestamp": pa.array([(BASE_S + o) * 1_000_000 for o in offsets], pa.timestamp("us", tz="UTC")),
        "timestamp_type": pa.array([0] * len(offsets), pa.int8()),
        "key": [f"k{o}".encode() for o in offsets],
        # Every 10th record is not JSON: the partition group quarantines it.
        "value": [b"not json" if o % 10 == 9 else json.dumps({"ts": BASE_S + o, "level": "INFO",
                                                              "msg": f"event {o}"}).encode() for o in offsets],
        "headers": pa.nulls(len(offsets), BACKUP_SCHEMA.field("headers").type),
    }, schema=BACKUP_SCHEMA)


class World:
    def __init__(self, tmp_path: Path) -> None:
        self.config = ShaleConfig.model_validate({
            "bucket": {"url": f"memory://repair-{uuid.uuid4().hex}"}, "metastore": {"data_dir": str(tmp_path / "ms")},
            "ingest": {"default_tenant": "acme", "parsers": [PARSER]}, "block": {"sync_delay": 0}})
        self.bucket: ObstoreBucket = open_bucket(self.config.bucket)
        service = open_metastore(self.config)
        assert isinstance(service, MetastoreService)
        self.service = service
        self.read_time = int(time.time() * 1000) - 3_600_000

    def ingest(self, group: str, partition: int, start: int, end: int, *, commit: bool = True,
               read_time: int | None = None) -> list[BlockMeta]:
        spec = GroupSpec(group, 1, self.config.bucket, self.config.ingest)
        written = write_chunk(spec, self.bucket, records(partition, start, end),
                              Chunk("app", partition, INC, start, end, read_time or self.read_time))
        if commit:
            command = batch_commit([written], [PartitionRange("app", partition, INC, start, end)], group=group,
                                   generation=1, writer="ingest", batch="test")
            self.service.submit(command).raise_for_rejection()
        return written.blocks

    def scan(self, kafka: dict[tuple[str, int], KafkaPartition]) -> Scan:
        return scan_tenant(self.bucket, "acme", sync_delay=0, index=self.service, kafka=lambda parts: kafka,
                           parsers=current_parsers(self.config.bucket, self.config.ingest))

    def plan(self, kafka: dict[tuple[str, int], KafkaPartition]) -> tuple[Scan, Plan]:
        scan = self.scan(kafka)
        return scan, plan_repair("acme", scan.facts, metastore=True, sources=scan.sources)

    def live_records(self, group: str) -> Counter[tuple[str, int, int]]:
        """(kind, partition, offset) of every record the group's readable blocks hold, read from the bucket."""
        result = BlockFetcher(self.bucket, 0).sync("acme")
        counts: Counter[tuple[str, int, int]] = Counter()
        for view in result.in_state(BlockState.HEALTHY):
            assert view.meta is not None
            if view.meta.group != group:
                continue
            for dataset in view.meta.datasets:
                table = read_dataset(self.bucket, view.meta, dataset, columns=["partition", "offset"])
                counts.update((dataset.kind, p, o) for p, o in zip(table.column("partition").to_pylist(),
                                                                    table.column("offset").to_pylist(), strict=True))
        return counts

    def listing(self) -> list[tuple[str, int, str | None]]:
        return [(o.key, o.size, o.etag) for o in self.bucket.list("")]


class FailingMerge:
    """The metastore, except that the first merge's swap fails (as if the process stopped right after building)."""

    def __init__(self, service: MetastoreService) -> None:
        self.service = service
        self.failed = False

    def submit(self, command: ReplaceBlocks | QuarantineBlocks) -> Result:
        if isinstance(command, ReplaceBlocks) and command.blocks and not self.failed:
            self.failed = True
            raise ShaleError("the metastore went away")
        return self.service.submit(command)


def test_a_bucket_with_every_kind_of_damage_is_planned_applied_and_converges(tmp_path: Path) -> None:
    w = World(tmp_path)
    # Committed data: partition 0 in both groups; partition 1 in the backup group; partition 2 in the backup group.
    backup0 = w.ingest("backup", 0, 0, 50) + w.ingest("backup", 0, 50, 100)
    parsed0 = w.ingest("partition", 0, 0, 50) + w.ingest("partition", 0, 50, 100)
    lost = w.ingest("backup", 2, 0, 40)
    # 1. A fully held duplicate, indexed (an old bug): offsets [10, 20) of partition 0 again.
    (duplicate,) = w.ingest("backup", 0, 10, 20, commit=False, read_time=w.read_time + 1)
    w.service.submit(AddBlocks(blocks=[duplicate])).raise_for_rejection()
    # 2. A partial overlap on partition 1: [0, 60) committed, [40, 100) added by an old bug.
    (left,) = w.ingest("backup", 1, 0, 60)
    (right,) = w.ingest("backup", 1, 40, 100, commit=False)
    w.service.submit(AddBlocks(blocks=[right])).raise_for_rejection()
    # 3. A truncated data object of a partition-group block: its records are in the backup group.
    damaged = next(m for m in parsed0 if m.datasets and m.datasets[0].kind == "records" and m.kafka[0].start == 50)
    key = block_file_key(damaged, damaged.datasets[0].file)
    w.bucket.put(key, w.bucket.get(key)[:100])
    # 4. A block copied in from another bucket under a new id (not indexed): a copy of backup0[0].
    source = backup0[0]
    copy_id = "01" + source.id[2:-4] + "ZZZZ"
    copy_meta = source.model_copy(update={"id": copy_id, "compaction": source.compaction.model_copy(
        update={"sources": [copy_id]})})
    for name in [d.file for d in source.datasets]:
        w.bucket.put(block_file_key(copy_meta, name), w.bucket.get(block_file_key(source, name)))
    w.bucket.put_if_absent(meta_key(copy_meta), copy_meta.to_json())
    # 5. A damaged backup block whose records Kafka no longer holds: unrecoverable.
    lost_key = block_file_key(lost[0], lost[0].datasets[0].file)
    w.bucket.put(lost_key, b"garbage")
    kafka = {("app", 0): KafkaPartition(INC, 0, 100), ("app", 2): KafkaPartition(INC, 1000, 1000)}

    before = w.listing()
    scan, plan = w.plan(kafka)
    assert w.listing() == before  # planning changes nothing
    steps = [(s.action, s.blocks) for s in plan.steps]
    assert steps == sorted([
        ("drop", [duplicate.id]),
        ("drop", [copy_id]),
        ("merge", sorted([left.id, right.id])),
        ("rebuild", [damaged.id]),
        ("quarantine", [lost[0].id]),
    ], key=lambda s: (["mark", "drop", "merge", "rebuild", "quarantine"].index(s[0]), s[1])), plan.model_dump_json()
    by_action = {s.action + s.blocks[0]: s for s in plan.steps}
    assert by_action["drop" + copy_id].indexed == []  # not indexed: a mark only
    assert by_action["drop" + copy_id].evidence["held_by"] == [source.id]
    assert by_action["drop" + duplicate.id].evidence["held_by"] == [backup0[0].id]
    rebuild = by_action["rebuild" + damaged.id]
    assert rebuild.source == "backup"
    assert set(rebuild.source_blocks) == {b.id for b in backup0 if b.kafka[0].start == 50}  # [50, 100) only
    assert [u["block"] for u in plan.unrecoverable] == [lost[0].id]

    # First run: the merge's swap fails after its block was built; every other step is done.
    index = FailingMerge(w.service)
    metas = {f.id: f.meta for f in scan.facts if f.meta is not None}
    report = apply_plan(plan, metas, w.bucket, index, LocalBuilder(w.config.bucket, w.config.ingest, w.config.kafka))
    assert [s.action for s, _ in report.failed] == ["merge"]
    assert len(report.done) == len(plan.steps) - 1

    # Second run: the merge reuses the block the first one built, then nothing is left.
    scan, plan = w.plan(kafka)
    assert [(s.action, s.written) for s in plan.steps] == [("merge", True)], plan.model_dump_json()
    metas = {f.id: f.meta for f in scan.facts if f.meta is not None}
    report = apply_plan(plan, metas, w.bucket, w.service, LocalBuilder(w.config.bucket, w.config.ingest,
                                                                       w.config.kafka))
    assert not report.failed
    _, plan = w.plan(kafka)
    assert plan.steps == [], plan.model_dump_json()

    # Every record once, in both groups; the quarantined block's records are the only ones not readable.
    backup = w.live_records("backup")
    assert max(backup.values()) == 1
    assert set(backup) == {("records", p, o) for p in (0, 1) for o in range(100)}  # partition 2 is quarantined
    parsed = w.live_records("partition")
    assert max(parsed.values()) == 1
    assert {(p, o) for _, p, o in parsed} == {(0, o) for o in range(100)}
    assert sum(1 for k, _, _ in parsed if k == "quarantine") == 10
    result = BlockFetcher(w.bucket, 0).sync("acme")
    report_ = verify_tenant(w.bucket, result)
    assert report_.ok, report_.to_json()
    assert [p.kind for p in report_.problems if p.block_id == lost[0].id] == ["quarantined"]
    # The index and the bucket agree: the readable blocks are the indexed ones.
    healthy = {v.id for v in result.in_state(BlockState.HEALTHY)}
    assert {m.id for m in w.service.tenant_blocks("acme")} == healthy
    # Nothing was marked whose records no readable block holds; the quarantined block is kept whole.
    for view in result.in_state(BlockState.MARKED_FOR_DELETION):
        assert view.meta is not None
        assert view.mark is not None
        assert view.mark.reason.startswith("repair: ")
        held = backup if view.meta.group == "backup" else parsed
        for dataset in view.meta.datasets:
            if view.id == damaged.id:
                continue  # its data object is the damaged one; its metadata's ranges are checked below
            table = read_dataset(w.bucket, view.meta, dataset, columns=["partition", "offset"])
            assert {(dataset.kind, p, o) for p, o in zip(table.column("partition").to_pylist(),
                                                         table.column("offset").to_pylist(), strict=True)} <= set(held)
    assert result.blocks[lost[0].id].state is BlockState.QUARANTINED
    assert w.bucket.get(lost_key) == b"garbage"
    assert w.service.get_block(lost[0].id) is None  # out of the index ...
    assert lost[0].id not in {t.block_id for t in w.service.tombstones()}  # ... and never to be deleted


@pytest.mark.parametrize("available", [True, False])
def test_without_the_metastore_the_plan_is_the_buckets_view_alone(tmp_path: Path, available: bool) -> None:
    w = World(tmp_path)
    w.ingest("backup", 0, 0, 50)
    w.ingest("backup", 0, 10, 20, commit=False, read_time=w.read_time + 1)
    scan = scan_tenant(w.bucket, "acme", sync_delay=0, index=w.service if available else None)
    plan = plan_repair("acme", scan.facts, metastore=available, sources=scan.sources)
    # With the metastore the unindexed copy is uncommitted and held by a committed block; without it, both are
    # complete blocks and the smaller one is held by the larger: the same step either way.
    assert [s.action for s in plan.steps] == ["drop"]
    assert plan.metastore is available
