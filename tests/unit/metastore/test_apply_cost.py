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

from hypothesis import example, given, settings
from hypothesis import strategies as st
from tests.factories import BASE_MS
from tests.unit.metastore.helpers import meta

from shale.block import BlockMeta, Compaction, Dataset, FileInfo, KafkaRange, deterministic_block_id
from shale.bucketindex import state_digest
from shale.metastore.rules.commands import AddBlocks, CommitIngestBatch, OffsetRange, QuarantineBlocks, ReplaceBlocks
from shale.metastore.rules.fsm import StateMachine


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


def _add_cost(tmp_path: Path, blocks: int) -> list[int]:
    """Python calls and SQLite steps of a one-block AddBlocks into a tenant of ``blocks`` blocks (after one that
    may set the tenant up)."""
    state = StateMachine(tmp_path / f"tenant-{blocks}.db")
    for first in range(0, blocks, 500):
        batch = [meta(start=i * 100, end=i * 100 + 100, key=f"b{i}") for i in range(first, min(blocks, first + 500))]
        assert state.apply_next(1, BASE_MS, AddBlocks(blocks=batch)).ok
    assert state.apply_next(1, BASE_MS, AddBlocks(blocks=[meta(key="warm")])).ok
    with counted(state) as costs:
        assert state.apply_next(1, BASE_MS, AddBlocks(blocks=[meta(key="one")])).ok
    state.close()
    return costs


def test_a_one_block_add_costs_the_same_into_3000_blocks_as_into_100(tmp_path: Path) -> None:
    # Before: every command read (and sorted and hashed) every block id of its tenant to stamp its digest.
    small, big = _add_cost(tmp_path, 100), _add_cost(tmp_path, 3000)
    assert big[0] <= small[0] * 1.25, (small, big)
    assert big[1] <= small[1] * 1.25, (small, big)


_OPS = st.lists(st.tuples(st.sampled_from(["add", "replace", "quarantine", "forget"]), st.integers(0, 3)),
                max_size=25)


@settings(max_examples=25, deadline=None)
@given(ops=_OPS)
@example(ops=[("add", 2), ("forget", 0), ("replace", 1), ("add", 0)])
def test_the_kept_digest_is_the_digest_of_the_tenants_blocks(tmp_path_factory: Any, ops: list[tuple[str, int]]
                                                              ) -> None:
    """Whatever adds, replaces and quarantines, each link's digest is ``state_digest`` of the tenant's blocks as
    the entry leaves them; "forget" drops the kept set hashes as a state of the previous release has none (the next
    change computes them from the blocks, once)."""
    state = StateMachine(tmp_path_factory.mktemp("digest") / "state.db")
    live: list[BlockMeta] = []
    for n, (op, k) in enumerate(ops):
        command: Any
        if op == "forget":
            with state.lock:
                state.conn.execute("DELETE FROM tenant_digests")
            continue
        if op == "add" or not live:
            new = [meta(start=n * 100 + i, end=n * 100 + i + 1, key=f"{n}/{i}") for i in range(k + 1)]
            command = AddBlocks(blocks=new + live[:1])  # one already present: added once
            live += new
        elif op == "replace":
            gone, live = live[:k + 1], live[k + 1:]
            merged = [meta(start=10_000 + n, end=10_001 + n, key=f"merged/{n}")] if k % 2 else []
            live += merged
            command = ReplaceBlocks(tenant="acme", sources=[b.id for b in gone], blocks=merged, reason="compacted")
        else:
            gone, live = live[-1:], live[:-1]
            command = QuarantineBlocks(tenant="acme", block_ids=[b.id for b in gone], reason="corrupt")
        result = state.apply_next(1, BASE_MS + n, command)
        assert result.ok, result
        for link in result.data.get("links", {}).values():
            assert link[3] == state_digest([b.id for b in live], [])
    assert state.reader.tenant_block_ids("acme") == {b.id for b in live}


def test_counting_sees_python_calls_and_sqlite_steps(tmp_path: Path) -> None:
    state = StateMachine(tmp_path / "state.db")
    work: Callable[[], object] = lambda: state.conn.execute("SELECT count(*) FROM blocks").fetchone()  # noqa: E731
    with counted(state) as costs:
        work()
    assert costs[0] > 0
    assert costs[1] > 0
