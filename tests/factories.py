"""Small builders of realistic test data shared by the unit and integration tests."""

from __future__ import annotations

import time

import pyarrow as pa

from shale.block import BlockMeta, BlockSpec, DatasetInput, KafkaRange, deterministic_block_id, write_block
from shale.block.schemas import BACKUP_SCHEMA
from shale.objstore import Bucket

BASE_MS = 1_795_000_000_000  # 2026-11-18


def backup_table(topic: str, partition: int, start: int, count: int, base_ms: int = BASE_MS,
                 step_ms: int = 1000) -> pa.Table:
    """``count`` Kafka records of one partition from offset ``start``, one per ``step_ms``."""
    offsets = list(range(start, start + count))
    return pa.table({
        "topic": [topic] * count,
        "partition": pa.array([partition] * count, pa.int32()),
        "offset": pa.array(offsets, pa.int64()),
        "timestamp": pa.array([base_ms + (o - start) * step_ms for o in offsets], pa.timestamp("ms", tz="UTC")),
        "timestamp_type": pa.array([0] * count, pa.int8()),
        "key": [f"k{o}".encode() for o in offsets],
        "value": [f'{{"n": {o}, "msg": "event {o}"}}'.encode() for o in offsets],
        "headers": pa.array([[{"key": "source", "value": b"test"}]] * count, BACKUP_SCHEMA.field("headers").type),
    }, schema=BACKUP_SCHEMA)


def write_backup_block(bucket: Bucket, tenant: str, topic: str, partition: int, start: int, count: int,
                       base_ms: int = BASE_MS, block_time_ms: int | None = None, incarnation: str = "",
                       **spec: object) -> BlockMeta:
    """One level-0 backup block holding offsets ``[start, start+count)`` of one partition (of one incarnation of
    its topic: a recreated topic's offsets start again at 0)."""
    table = backup_table(topic, partition, start, count, base_ms)
    generation = spec.get("generation", 1)
    block_id = deterministic_block_id(block_time_ms or base_ms, f"backup/{generation}/{topic}/{incarnation}/"
                                                                f"{partition}/{start}/{start + count}")
    block_spec = BlockSpec(id=block_id, tenant=tenant, group="backup",
                           kafka=[KafkaRange(topic=topic, partition=partition, start=start, end=start + count,
                                             incarnation=incarnation)],
                           **spec)  # type: ignore[arg-type]
    return write_block(bucket, block_spec, [DatasetInput("records", topic, table, "timestamp",
                                                         labels=[{"topic": topic}])])


class Clock:
    """A clock that moves only when told to: ``now`` in seconds, the real time unless given."""

    def __init__(self, now: float | None = None) -> None:
        self.now = time.time() if now is None else now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move ``seconds`` past the later of this clock and the real time (objects carry real upload times)."""
        self.now = max(self.now, time.time()) + seconds
