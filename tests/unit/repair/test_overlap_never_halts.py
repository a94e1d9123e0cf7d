"""Compaction never halts on an overlap: a job whose sources overlap is merged (each record once) and completes;
an overlap compaction will not merge is reported by the leader's bucket scan (a gauge, the status page with the
repair command) while everything else goes on."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from prometheus_client import REGISTRY
from tests.factories import BASE_MS, Clock, write_backup_block

from shale.block import BlockMeta, read_dataset
from shale.block.overlap import Overlap
from shale.compaction.messages import JobUpdate, PollRequest
from shale.compaction.model import Job, PlanLimits, QueuedBlock, QueueKey
from shale.compaction.planner import uncompactable
from shale.compactor.merge import merge_blocks
from shale.config import CompactionConfig, RetentionConfig, ShaleConfig
from shale.metastore import AddBlocks, MetastoreService, SingleNodeLog, StateMachine, read_only_index
from shale.metastore.api.maintenance import Maintenance
from shale.metastore.rules.commands import ReplaceBlocks
from shale.objstore import ObstoreBucket, open_bucket_url
from shale.web.page import render
from shale.web.status import collect

K0 = QueueKey("acme", 0, 0, "backup", 1)
K1 = QueueKey("acme", 0, 1, "backup", 1)
LIMITS = PlanLimits(max_level=2, job_byte_budget=1000)
PAIR = Overlap("a", "b", "offsets [40,60) are in both a and b")


@pytest.mark.parametrize(("queued", "jobs", "stuck"), [
    ([QueuedBlock("a", K0, 10, 0), QueuedBlock("b", K0, 10, 1)], [], False),  # one queue, both in reach
    ([], [Job("j", K0, ["a", "b"], 20, 0)], False),  # one job
    ([QueuedBlock("a", K0, 10, 0), QueuedBlock("b", K1, 10, 1)], [], True),  # two levels
    ([QueuedBlock("a", K0, 10, 0), QueuedBlock("b", QueueKey("acme", 1, 0, "backup", 1), 10, 1)], [], True),
    ([QueuedBlock("a", QueueKey("acme", 0, 2, "backup", 1), 10, 0),
      QueuedBlock("b", QueueKey("acme", 0, 2, "backup", 1), 10, 1)], [], True),  # at the top level
    ([QueuedBlock("a", K0, 5000, 0), QueuedBlock("b", K0, 10, 1)], [], True),  # a too large to compact
    ([QueuedBlock("a", K0, 10, 0)], [Job("j", K0, ["b", "c"], 20, 0)], True),  # b's job does not hold a
    ([], [], True),  # neither queued nor in a job (its job was evicted)
], ids=["one queue", "one job", "levels", "shards", "top level", "too large", "other job", "evicted"])
def test_which_overlaps_compaction_will_not_merge(queued: list[QueuedBlock], jobs: list[Job], stuck: bool) -> None:
    assert uncompactable([PAIR], queued, jobs, LIMITS) == ([PAIR] if stuck else [])


def _block(bucket: ObstoreBucket, start: int, count: int, **spec: object) -> BlockMeta:
    """A backup block of offsets [start, start + count): the record at offset o has time BASE_MS + o s in every
    block that holds it (the same Kafka record has the same timestamp)."""
    return write_backup_block(bucket, "acme", "app", 0, start, count, base_ms=BASE_MS + start * 1000, **spec)


@pytest.fixture
def bucket() -> ObstoreBucket:
    return open_bucket_url(f"memory://halt-{uuid.uuid4().hex}")


def _service(tmp_path: Path, clock: Clock, **compaction: object) -> MetastoreService:
    state = StateMachine(tmp_path / "s.db")
    return MetastoreService(state, SingleNodeLog(state, clock=clock), clock=clock,
                            compaction=CompactionConfig(**compaction))  # type: ignore[arg-type]


def test_a_job_whose_sources_overlap_completes_with_each_record_once(tmp_path: Path, bucket: ObstoreBucket) -> None:
    clock = Clock()
    service = _service(tmp_path, clock, blocks_per_job=[3])
    blocks = [_block(bucket, 0, 60), _block(bucket, 40, 60), _block(bucket, 50, 10)]
    service.submit(AddBlocks(blocks=blocks)).raise_for_rejection()
    (job,) = service.poll_compaction(PollRequest(worker="w", capacity=1)).assigned
    result = merge_blocks(bucket, job.sources, job=job.job, token=job.token, level=job.level)
    assert (result.rows_in, result.rows_out) == (130, 100)
    done = service.poll_compaction(PollRequest(worker="w", capacity=0, updates=[
        JobUpdate(job=job.job, token=job.token, status="success", outputs=[result.output])]))
    assert done.updates == {job.job: "completed"}
    offsets = read_dataset(bucket, result.output, result.output.datasets[0], columns=["offset"]).column("offset")
    assert sorted(offsets.to_pylist()) == list(range(100))
    assert [m.id for m in service.tenant_blocks("acme")] == [result.output.id]


def test_the_bucket_scan_reports_an_overlap_compaction_will_not_merge(tmp_path: Path, bucket: ObstoreBucket) -> None:
    clock = Clock()
    service = _service(tmp_path, clock, max_level=1)
    # Two level-1 blocks (the top level here) hold offsets [40, 60) both; a third block is fine.
    left, right = _block(bucket, 0, 60, level=1), _block(bucket, 40, 60, level=1)
    other = write_backup_block(bucket, "beta", "app", 0, 0, 10)
    service.submit(AddBlocks(blocks=[left, right, other])).raise_for_rejection()
    clock.now += 3600
    maintenance = Maintenance(service, bucket, RetentionConfig(), 60, is_leader=lambda: True, term=lambda: 1,
                              clock=clock, sync_delay=60)
    maintenance.scan_bucket()

    assert REGISTRY.get_sample_value("shale_bucket_overlapping_blocks", {"tenant": "acme"}) == 2
    assert REGISTRY.get_sample_value("shale_bucket_overlapping_blocks", {"tenant": "beta"}) == 0
    assert [o["blocks"] for o in maintenance.overlaps["acme"]] == [sorted([left.id, right.id])]
    view = read_only_index(service.state.path, clock=clock)
    page = render(collect(view, service.status(), bucket, ShaleConfig(), maintenance.partial_blocks, {},
                          maintenance.overlaps))
    assert "shale bucket repair --tenant acme" in page
    assert left.id in page
    # Nothing stopped: both blocks stay indexed and readable; a repair merges them, and the next scan is clean.
    assert {m.id for m in service.tenant_blocks("acme")} == {left.id, right.id}
    merged = merge_blocks(bucket, [left, right], job="repair-0", token=0, level=1).output
    service.submit(ReplaceBlocks(tenant="acme", sources=[left.id, right.id], blocks=[merged])).raise_for_rejection()
    maintenance.scan_bucket()
    assert REGISTRY.get_sample_value("shale_bucket_overlapping_blocks", {"tenant": "acme"}) == 0
    assert maintenance.overlaps == {}
    assert "no overlapping blocks" in render(collect(view, service.status(), bucket, ShaleConfig(), {}, {},
                                                     maintenance.overlaps))
