"""The restore plan: per source partition, the backup intervals in offset order, cut by the range, stopped at the
first gap (named, with the operator's reason when the loss was acknowledged)."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.factories import BASE_MS, write_backup_block

from shale.block import BlockMeta, KafkaRange
from shale.errors import ConfigError, NotFoundError
from shale.index import LossRow
from shale.objstore import open_bucket_url
from shale.restore import RestoreRange, build_plan, choose_incarnation

INC_A, INC_B = "A" * 22, "B" * 22


@pytest.fixture(scope="module")
def template() -> BlockMeta:
    return write_backup_block(open_bucket_url("memory://"), "acme", "app", 0, 0, 10)


def block(template: BlockMeta, partition: int, start: int, end: int, *, min_time: int = BASE_MS,
          incarnation: str = INC_A, topic: str = "app") -> BlockMeta:
    """A backup block holding offsets [start, end) of one partition, one record per offset."""
    datasets = [d.model_copy(update={"rows": end - start, "bytes": 10 * (end - start)}) for d in template.datasets]
    return template.model_copy(update={
        "id": f"b-{topic}-{incarnation[:1]}-{partition}-{start}-{end}", "min_time": min_time, "max_time": min_time,
        "kafka": [KafkaRange(topic=topic, partition=partition, start=start, end=end, incarnation=incarnation)],
        "datasets": datasets})


def cuts(total: int, points: list[int]) -> list[tuple[int, int]]:
    """``[0, total)`` cut into contiguous spans at ``points``."""
    return list(itertools.pairwise(sorted({0, total, *(p % total for p in points)})))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 500), st.lists(st.integers(0, 10_000), max_size=8), st.randoms(use_true_random=False))
def test_contiguous_blocks_restore_everything_in_offset_order(template: BlockMeta, total: int, points: list[int],
                                                               rng: random.Random) -> None:
    spans = cuts(total, points)
    blocks = [block(template, 0, a, b) for a, b in spans]
    rng.shuffle(blocks)
    plan = build_plan(blocks, tenant="acme", topic="app", incarnation=INC_A, target_partitions=None)
    (p,) = plan.partitions
    assert (p.start, p.end, p.gaps) == (0, total, [])
    assert [(i.start, i.end) for i in p.intervals] == spans
    assert (p.records, p.bytes) == (total, 10 * total)
    assert plan.mapping.describe() == "same partition"


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 500), st.lists(st.integers(0, 10_000), min_size=1, max_size=8), st.integers(0, 100))
def test_a_missing_block_stops_the_partition_at_the_gap(template: BlockMeta, total: int, points: list[int],
                                                        which: int) -> None:
    spans = cuts(total, points)
    missing = spans[which % len(spans)]
    blocks = [block(template, 0, a, b) for a, b in spans if (a, b) != missing]
    blocks.append(block(template, 1, 0, total))  # another partition: not affected
    loss = LossRow(group="backup", generation=1, topic="app", partition=0, incarnation=INC_A, start=missing[0],
                   end=missing[1], reason="retention ran first", acknowledged_at=0)
    wanted = RestoreRange(offsets={0: (0, total), 1: (0, total)})
    plan = build_plan(blocks, tenant="acme", topic="app", incarnation=INC_A, target_partitions=None,
                      range_=wanted, losses=[loss])
    first, second = plan.partitions
    assert first.end == missing[0]
    assert [(g.start, g.end) for g in first.gaps] == [missing]
    assert "retention ran first" in first.gaps[0].reason
    assert all(i.end <= missing[0] for i in first.intervals)
    assert (second.start, second.end, second.gaps) == (0, total, [])


def test_a_gap_without_acknowledged_loss_says_no_block_holds_it(template: BlockMeta) -> None:
    plan = build_plan([block(template, 0, 0, 10), block(template, 0, 20, 30)], tenant="acme", topic="app",
                      incarnation=INC_A, target_partitions=None)
    (gap,) = plan.partitions[0].gaps
    assert (gap.start, gap.end, gap.reason) == (10, 20, "no backup block holds these offsets")
    assert plan.summary()["partitions"][0]["gaps"] == [{"start": 10, "end": 20, "reason": gap.reason}]  # type: ignore[index]


def test_until_drops_the_blocks_that_start_at_or_after_it(template: BlockMeta) -> None:
    blocks = [block(template, 0, 0, 10, min_time=100), block(template, 0, 10, 20, min_time=200),
              block(template, 0, 20, 30, min_time=300)]
    plan = build_plan(blocks, tenant="acme", topic="app", incarnation=INC_A, target_partitions=None,
                      range_=RestoreRange(until_ms=250))
    (p,) = plan.partitions
    assert (p.start, p.end, p.gaps, len(p.intervals)) == (0, 20, [], 2)
    assert plan.until_ms == 250


def test_offsets_cut_the_range_and_count_records_pro_rata(template: BlockMeta) -> None:
    plan = build_plan([block(template, 0, 0, 100)], tenant="acme", topic="app", incarnation=INC_A,
                      target_partitions=None, range_=RestoreRange(offsets={0: (25, 75)}))
    (p,) = plan.partitions
    assert (p.start, p.end, p.records, p.gaps) == (25, 75, 50, [])


def test_other_incarnations_and_topics_are_not_restored(template: BlockMeta) -> None:
    blocks = [block(template, 0, 0, 10, incarnation=INC_A, min_time=1),
              block(template, 0, 0, 5, incarnation=INC_B, min_time=2),
              block(template, 0, 0, 99, topic="other", min_time=1)]
    assert choose_incarnation(blocks, "app") == INC_B
    assert choose_incarnation(blocks, "app", at_ms=1) == INC_A
    assert choose_incarnation(blocks, "app", INC_A) == INC_A
    plan = build_plan(blocks, tenant="acme", topic="app", incarnation=INC_A, target_partitions=None)
    assert [(p.partition, p.start, p.end) for p in plan.partitions] == [(0, 0, 10)]
    assert plan.incarnations == [INC_A, INC_B]
    with pytest.raises(ConfigError):
        choose_incarnation(blocks, "app", "C" * 22)
    with pytest.raises(NotFoundError):
        choose_incarnation(blocks, "missing")


def test_another_partition_count_maps_by_key(template: BlockMeta) -> None:
    blocks = [block(template, p, 0, 10) for p in range(3)]
    plan = build_plan(blocks, tenant="acme", topic="app", incarnation=INC_A, target_partitions=5)
    assert (plan.mapping.source_partitions, plan.mapping.target_partitions, plan.mapping.by_key) == (3, 5, True)
    assert "murmur2" in plan.mapping.describe()


class _Index:
    """The index reads ``RestoreJob.plan`` makes: backup blocks of one topic, no committed offsets beyond them."""

    def __init__(self, blocks: list[BlockMeta]) -> None:
        self.blocks = blocks

    def query_blocks(self, tenants: list[str], *args: object, group: str = "") -> list[BlockMeta]:
        return self.blocks

    def offset_history(self, group: str, generation: int) -> tuple[list[object], list[LossRow]]:
        return [], []

    def offsets(self, group: str, generation: int) -> list[object]:
        return []


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(partitions=st.integers(2, 8), empty=st.integers(1, 3), recreated=st.booleans())
def test_the_source_partition_count_counts_a_last_partition_that_never_held_a_record(
        template: BlockMeta, monkeypatch: pytest.MonkeyPatch, partitions: int, empty: int, recreated: bool) -> None:
    """Issue 54, point 14: the last ``empty`` partitions of the source never held a record, so no block and no
    committed offset names them. While the source topic lives (same topic id), Kafka's count is the plan's and a
    created target gets every partition; a recreated topic of the same name is another incarnation, not asked."""
    from shale.config import BucketConfig, KafkaConfig
    from shale.kafka import TopicState
    from shale.restore import job as restore_job

    empty = min(empty, partitions - 1)
    held = partitions - empty
    blocks = [block(template, p, 0, 5) for p in range(held)]
    live = TopicState("app", INC_B if recreated else INC_A, tuple(range(partitions)))
    monkeypatch.setattr(restore_job, "describe_topics", lambda kafka, topics, client=None: {"app": live})
    request = restore_job.RestoreRequest(tenant="acme", topic="app", target_topic="app-restored")
    job = restore_job.RestoreJob(_Index(blocks), BucketConfig(url="memory://x"),  # type: ignore[arg-type]
                                 KafkaConfig(bootstrap_servers="127.0.0.1:1"), request)
    plan = job.plan()
    if recreated:  # the metastore's facts alone: only the partitions that held a record
        assert (plan.mapping.source_partitions, plan.counted_from) == (held, "metastore")
        return
    assert (plan.mapping.source_partitions, plan.mapping.target_partitions) == (partitions, partitions)
    assert plan.counted_from == "kafka"
    assert plan.summary()["source_partitions"] == partitions
    assert plan.mapping.describe() == "same partition"
    # Given by the operator (the source topic gone): the same count, and a count below the facts is refused.
    job.request = restore_job.RestoreRequest(tenant="acme", topic="app", target_topic="app-restored",
                                             source_partitions=partitions)
    monkeypatch.setattr(restore_job, "describe_topics", lambda kafka, topics, client=None: {})
    assert (job.plan().mapping.source_partitions, job.plan().counted_from) == (partitions, "operator")
    job.request = restore_job.RestoreRequest(tenant="acme", topic="app", target_topic="app-restored",
                                             source_partitions=held - 1 or None)
    if held > 1:
        with pytest.raises(ConfigError, match="give its real count"):
            job.plan()
