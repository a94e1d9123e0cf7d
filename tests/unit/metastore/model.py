"""The reference model of the metastore's state machine for ``test_fsm_model``: records, the blocks that hold them,
and the metadata the real state machine sees.

A record is one Kafka record: (topic, partition, topic incarnation, offset). Its time is a function of its offset
alone, so two incarnations of one topic-partition hold records with equal offsets *and* equal times (the case a
deduplication by (partition, offset, time) gets wrong). A model block knows exactly which records it holds; the
state machine only sees its metadata (Kafka ranges, times, datasets), built here from those records.
"""

from __future__ import annotations

import datetime
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from tests.factories import BASE_MS

from shale.block import BlockMeta, Compaction, Dataset, FileInfo, KafkaRange
from shale.index import PARTITION_WINDOW_MS

TENANT = "acme"
TOPICS = ("a", "b")
PARTITIONS = (0, 1)
STEP_MS = 20 * 60_000  # three records an hour: a batch of a few offsets spans hours (partition-group blocks)
HOUR_MS = 3_600_000
# (group, generation, writer): the backup group has one generation; the partition group a second one, written by
# reprocessing (live ingestion and reprocessing never write one generation).
LANES = (("backup", 1, "ingest"), ("partition", 1, "ingest"), ("partition", 2, "reprocess"))

Rec = tuple[str, int, str, int]
"""(topic, partition, incarnation, offset)"""
Held = tuple[str, int, Rec]
"""(group, generation, record): a record as stored in one group and generation."""


def rtime(rec: Rec) -> int:
    return BASE_MS + rec[3] * STEP_MS


def incarnation(n: int) -> str:
    return f"inc{n}"


def window(time_ms: int) -> int:
    return time_ms - time_ms % PARTITION_WINDOW_MS


def hour_values(time_ms: int) -> dict[str, str]:
    moment = datetime.datetime.fromtimestamp(time_ms / 1000, datetime.UTC)
    return {"dt": moment.strftime("%Y-%m-%d"), "hour": f"{moment.hour:02d}"}


@dataclass(frozen=True)
class Block:
    meta: BlockMeta
    records: frozenset[Rec]

    @property
    def lane(self) -> tuple[str, int]:
        return self.meta.group, self.meta.generation

    def held(self) -> set[Held]:
        return {(self.meta.group, self.meta.generation, r) for r in self.records}


def build_meta(block_id: str, group: str, generation: int, level: int, kafka: list[KafkaRange],
               records: Iterable[Rec], *, partition_values: dict[str, str] | None = None,
               sources: list[str] | None = None, parents: list[str] | None = None, shard: int = 0) -> BlockMeta:
    """The metadata the block writer would write for a block holding exactly ``records``: one records dataset per
    topic, its rows and times those of its records."""
    by_topic: dict[str, list[Rec]] = defaultdict(list)
    for r in records:
        by_topic[r[0]].append(r)
    datasets = []
    for i, (topic, recs) in enumerate(sorted(by_topic.items())):
        times = [rtime(r) for r in recs]
        datasets.append(Dataset(name=f"records/{topic}", kind="records", topic=topic, file=f"records-{i}.parquet",
                                rows=len(recs), bytes=len(recs) * 100, min_time=min(times), max_time=max(times),
                                labels=[{"topic": topic}]))
    return BlockMeta(
        id=block_id, tenant=TENANT, shard=shard, level=level, group=group, generation=generation,
        min_time=min((d.min_time for d in datasets), default=0),
        max_time=max((d.max_time for d in datasets), default=0),
        kafka=kafka, partition_values=partition_values or {}, datasets=datasets,
        files=[FileInfo(name=d.file, size=d.rows * 10, crc32="00000000") for d in datasets],
        compaction=Compaction(sources=sources or [block_id], parents=parents or []))


def active_generation(rules: list[tuple[str, int, int, int]], topic: str, time_ms: int, default: int = 1) -> int:
    """The generation readers see for ``topic`` at ``time_ms``: the latest switch covering it, else ``default``."""
    active = default
    for t, start, end, generation in rules:
        if t == topic and start <= time_ms <= end:
            active = generation
    return active
