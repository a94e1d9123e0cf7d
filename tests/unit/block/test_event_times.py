"""``BlockMeta.event_times`` answers in one pass what ``event_time_of`` answers one partition at a time."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st
from tests.factories import BASE_MS

from shale.block import BlockMeta, Compaction, Dataset, FileInfo, KafkaRange, deterministic_block_id


@st.composite
def blocks(draw: st.DrawFn) -> BlockMeta:
    block_id = deterministic_block_id(BASE_MS, "b")
    topics = ["a", "b"]
    kafka = [KafkaRange(topic=t, partition=p, start=0, end=1)
             for t in topics for p in sorted(draw(st.sets(st.integers(0, 4), max_size=4)))]
    datasets = []
    for n in range(draw(st.integers(0, 3))):
        topic = draw(st.sampled_from(topics))
        groups = draw(st.lists(st.tuples(st.integers(0, 5), st.integers(-5, 50), st.integers(-5, 50)), max_size=5))
        per_partition = draw(st.booleans()) and groups
        datasets.append(Dataset(
            name=f"{n}/{topic}", kind=draw(st.sampled_from(["records", "quarantine"])), topic=topic,
            file="f.parquet", rows=draw(st.integers(0, 3)), bytes=0, min_time=-5, max_time=draw(st.integers(-5, 50)),
            row_groups=groups,
            row_group_partitions=[draw(st.integers(0, 4)) for _ in groups] if per_partition else None))
    return BlockMeta(id=block_id, tenant="acme", group="backup", min_time=-5, max_time=50, kafka=kafka,
                     datasets=datasets, files=[FileInfo(name="f.parquet", size=1, crc32="00000000")],
                     compaction=Compaction(sources=[block_id]))


@given(block=blocks())
@example(block=BlockMeta(
    id=deterministic_block_id(BASE_MS, "b"), tenant="acme", group="backup", min_time=-5, max_time=50,
    kafka=[KafkaRange(topic="a", partition=0, start=0, end=1)],
    datasets=[Dataset(name="r/a", kind="records", topic="a", file="f.parquet", rows=1, bytes=0, min_time=-5,
                      max_time=-3, row_groups=[(1, -5, -4)], row_group_partitions=[0])],
    compaction=Compaction(sources=[deterministic_block_id(BASE_MS, "b")])))
def test_event_times_are_event_time_of_every_range(block: BlockMeta) -> None:
    assert block.event_times() == {(r.topic, r.partition): block.event_time_of(r.topic, r.partition)
                                   for r in block.kafka}
