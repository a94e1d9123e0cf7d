"""A restore task's reading side: a partition's rows in source offset order from the blocks the plan names,
resumed from any offset; a corrupt block stops the partition with the block and the offsets named."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.factories import write_backup_block

from shale.block import BlockMeta
from shale.block.layout import block_file_key
from shale.config import BucketConfig
from shale.objstore import task_bucket
from shale.restore.task import PartitionStoppedError, PartitionWork, decode_work, encode_work, partition_rows


def work(metas: list[BlockMeta], start: int, end: int) -> PartitionWork:
    intervals = tuple((r.start, r.end, m) for m in metas for r in m.kafka)
    return PartitionWork("job", "app", "app", 0, start, end, intervals, 1, 1, None, 100)


@pytest.fixture(scope="module")
def stored() -> tuple[BucketConfig, list[BlockMeta]]:
    config = BucketConfig(url=f"memory://{uuid.uuid4().hex}")
    bucket = task_bucket(config)  # the tasks' own client of the bucket, which holds the blocks in memory
    metas = [write_backup_block(bucket, "acme", "app", 0, start, 50) for start in (0, 50, 100)]
    return config, metas


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 150), st.integers(0, 150))
def test_rows_come_in_offset_order_from_the_resume_point(stored: tuple[BucketConfig, list[BlockMeta]], resume: int,
                                                        end: int) -> None:
    config, metas = stored
    task = decode_work(encode_work(work(metas, 0, end)))  # as it crosses into a Spark task
    offsets = [o for _, table in partition_rows(config, task, resume) for o in table.column("offset").to_pylist()]
    assert offsets == list(range(resume, end))


def test_a_corrupt_block_stops_the_partition_naming_it(stored: tuple[BucketConfig, list[BlockMeta]]) -> None:
    config, metas = stored
    broken = metas[1]
    bucket = task_bucket(config)
    key = block_file_key(broken, broken.files[0].name)
    original = bucket.get(key)
    bucket.put(key, original[:-40] + b"\0" * 40)
    try:
        rows = partition_rows(config, work(metas, 0, 150), 0)
        first_id, _ = next(rows)
        assert first_id == metas[0].id
        with pytest.raises(PartitionStoppedError, match=rf"block {broken.id} holding offsets \[50, 100\)"):
            next(rows)
    finally:
        bucket.put(key, original)
