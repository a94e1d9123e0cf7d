"""What applying a command costs grows with what the command carries, never with the square of it nor with the
tenant's history. Costs are counted, not timed: Python calls and returns seen by a profile hook, and SQLite virtual
machine steps (both deterministic for a given interpreter and SQLite)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from tests.factories import BASE_MS

from shale.block import BlockMeta, Compaction, Dataset, FileInfo, KafkaRange, deterministic_block_id
from shale.metastore.commands import CommitIngestBatch, OffsetRange
from shale.metastore.fsm import StateMachine


@contextmanager
def counted(state: StateMachine) -> Iterator[list[int]]:
    """``[python calls, sqlite steps]`` made inside the block (SQLite's in virtual machine instructions)."""
    costs = [0, 0]

    def on_call(frame: FrameType, event: str, arg: Any) -> None:
        if event in ("call", "c_call"):
            costs[0] += 1

    def on_step() -> int:
        costs[1] += 1
        return 0

    state.conn.set_progress_handler(on_step, 1)
    sys.setprofile(on_call)
    try:
        yield costs
    finally:
        sys.setprofile(None)
        state.conn.set_progress_handler(None, 0)


def _block(partitions: int, start: int, tenant: str = "acme") -> BlockMeta:
    """A level-0 block of one topic's ``partitions`` partitions, a row group each, as ingest writes one."""
    block_id = deterministic_block_id(BASE_MS, f"{tenant}/{partitions}/{start}")
    return BlockMeta(
        id=block_id, tenant=tenant, group="backup", min_time=BASE_MS, max_time=BASE_MS + partitions,
        kafka=[KafkaRange(topic="app", partition=p, start=start, end=start + 2) for p in range(partitions)],
        datasets=[Dataset(name="records/app", kind="records", topic="app", file="records-0.parquet",
                          rows=2 * partitions, bytes=200 * partitions, min_time=BASE_MS,
                          max_time=BASE_MS + partitions, labels=[{"topic": "app"}],
                          row_groups=[(2, BASE_MS, BASE_MS + p) for p in range(partitions)],
                          row_group_partitions=list(range(partitions)))],
        files=[FileInfo(name="records-0.parquet", size=100, crc32="00000000")],
        compaction=Compaction(sources=[block_id]))


def _commit_cost(tmp_path: Path, partitions: int) -> float:
    """Python calls per partition of the second commit of a batch of ``partitions`` partitions (the first creates
    every partition's offsets)."""
    state = StateMachine(tmp_path / f"commit-{partitions}.db")
    cost = 0
    for start in (0, 2):
        command = CommitIngestBatch(group="backup", ranges=[
            OffsetRange(topic="app", partition=p, start=start, end=start + 2, stored=2) for p in range(partitions)],
            blocks=[_block(partitions, start)])
        with counted(state) as costs:
            assert state.apply_next(1, BASE_MS + start, command).ok
        cost = costs[0]
    # each partition's event time is its own row group's, whatever the others hold
    assert {o.partition: o.max_event_time for o in state.reader.offsets("backup", 1)} == {
        p: BASE_MS + p for p in range(partitions)}
    state.close()
    return cost / partitions


def test_a_commit_costs_the_same_per_partition_at_400_partitions_as_at_50(tmp_path: Path) -> None:
    # Before: every range asked every block for its event time, each answer reading all of the block's ranges
    # and row groups again (35.8 s for one commit of 10,000 partitions).
    small, big = _commit_cost(tmp_path, 50), _commit_cost(tmp_path, 400)
    assert big / small <= 1.25, (small, big)


def test_counting_sees_python_calls_and_sqlite_steps(tmp_path: Path) -> None:
    state = StateMachine(tmp_path / "state.db")
    work: Callable[[], object] = lambda: state.conn.execute("SELECT count(*) FROM blocks").fetchone()  # noqa: E731
    with counted(state) as costs:
        work()
    assert costs[0] > 0
    assert costs[1] > 0
