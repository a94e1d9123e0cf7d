"""Table tests for every planner and scheduler rule (seed 003), each applied twice to prove idempotence."""

from __future__ import annotations

import copy

import pytest

from shale.compaction import (
    Job,
    JobStatus,
    PlanLimits,
    QueuedBlock,
    QueueKey,
    apply_assignment,
    choose_assignments,
    evictions,
    owns,
    plan_jobs,
)
from shale.compaction.model import Assignment

K0 = QueueKey("acme", 0, 0, "backup", 1)
K1 = QueueKey("acme", 0, 1, "backup", 1)
KP = QueueKey("acme", 0, 0, "partition", 1)
LIMITS = PlanLimits(blocks_per_job=(3, 2), job_byte_budget=1000, max_age_ms=60_000, max_level=2, lease_ms=10_000)


def _blocks(key: QueueKey, n: int, size: int = 100, at: int = 0, prefix: str = "b") -> list[QueuedBlock]:
    return [QueuedBlock(f"{prefix}{key.level}-{i:03d}", key, size, at + i) for i in range(n)]


@pytest.mark.parametrize(("queued", "now", "capacity", "expected"), [
    # a job closes at the level's block count
    (_blocks(K0, 7), 100, 10, [["b0-000", "b0-001", "b0-002"], ["b0-003", "b0-004", "b0-005"]]),
    # ... or when the uncompressed bytes reach the budget
    (_blocks(K0, 5, size=400), 100, 10, [["b0-000", "b0-001"], ["b0-002", "b0-003"]]),
    # ... or when the oldest block has waited max_age (two blocks at least)
    (_blocks(K0, 2), 60_000, 10, [["b0-000", "b0-001"]]),
    (_blocks(K0, 2), 59_999, 10, []),
    (_blocks(K0, 1), 10**9, 10, []),
    # adaptive capacity: no more jobs than the worker's free slots
    (_blocks(K0, 9), 100, 1, [["b0-000", "b0-001", "b0-002"]]),
    (_blocks(K0, 9), 100, 0, []),
    # small job first: level 0 before level 1, whatever the arrival order
    (_blocks(K1, 2, at=0) + _blocks(K0, 3, at=50), 100, 1, [["b0-000", "b0-001", "b0-002"]]),
    # queues never mix keys; the top level and oversized blocks are left alone
    (_blocks(QueueKey("acme", 0, 2, "backup", 1), 5) + _blocks(K0, 2, size=1000), 10**9, 10, []),
    (_blocks(K0, 2) + _blocks(QueueKey("beta", 0, 0, "backup", 1), 2, prefix="x"), 10**9, 10,
     [["b0-000", "b0-001"], ["x0-000", "x0-001"]]),
    # nor, in the partition group, days: a day's blocks wait for their own (a late block of yesterday does not
    # hold today's queue back), so an output keeps its day
    ([QueuedBlock(f"p{i}", KP, 100, i, day=20_000 + (i == 1)) for i in range(5)], 100, 10,
     [["p0", "p2", "p3"]]),
    ([QueuedBlock(f"p{i}", KP, 100, i, day=20_000 + (i % 2)) for i in range(4)], 10**9, 10,
     [["p0", "p2"], ["p1", "p3"]]),
])
def test_planner_rules(queued: list[QueuedBlock], now: int, capacity: int, expected: list[list[str]]) -> None:
    first = plan_jobs(queued, LIMITS, now, capacity)
    second = plan_jobs(queued, LIMITS, now, capacity)
    assert [j.sources for j in first] == expected
    assert [j.name for j in first] == [j.name for j in second]  # pure and deterministic


def _job(name: str, level: int = 0, status: JobStatus = JobStatus.UNASSIGNED, token: int = 0, lease: int = 0,
         failures: int = 0) -> Job:
    return Job(name, QueueKey("acme", 0, level, "backup", 1), [f"{name}-src"], 10, 0, status, token, lease,
               failures)


@pytest.mark.parametrize(("jobs", "now", "capacity", "expected"), [
    # unassigned before abandoned; lower levels before higher
    ([_job("a", 1), _job("b", 0), _job("c", 0, JobStatus.IN_PROGRESS, 5, lease=10)], 100, 3, ["b", "c", "a"]),
    # a live lease is not taken
    ([_job("a", 0, JobStatus.IN_PROGRESS, 5, lease=200)], 100, 3, []),
    # abandoned jobs: fewer failures first, then earlier expiry
    ([_job("x", 0, JobStatus.IN_PROGRESS, 5, lease=50, failures=2),
      _job("y", 0, JobStatus.IN_PROGRESS, 6, lease=90, failures=0),
      _job("z", 0, JobStatus.IN_PROGRESS, 7, lease=10, failures=0)], 100, 3, ["z", "y", "x"]),
    # a job that reached the failure limit is excluded
    ([_job("bad", 0, JobStatus.IN_PROGRESS, 5, lease=10, failures=3), _job("ok")], 100, 3, ["ok"]),
    ([_job("a"), _job("b")], 100, 1, ["a"]),
])
def test_scheduler_priority(jobs: list[Job], now: int, capacity: int, expected: list[str]) -> None:
    first = choose_assignments(jobs, now, capacity, failure_limit=3)
    assert [a.job for a in first] == expected
    assert [a.job for a in choose_assignments(jobs, now, capacity, failure_limit=3)] == expected


def test_assignment_sets_token_and_lease_from_the_entry_and_is_idempotent() -> None:
    job = _job("a")
    (assignment,) = choose_assignments([job], 100, 1, 3)
    assert apply_assignment(job, assignment, entry_index=42, entry_time=1000, lease_ms=10_000, failure_limit=3,
                            worker="w1")
    assert (job.status, job.token, job.lease_expires_at, job.failures, job.worker) == (
        JobStatus.IN_PROGRESS, 42, 11_000, 0, "w1")
    before = copy.deepcopy(job)
    assert not apply_assignment(job, assignment, 42, 1000, 10_000, 3, "w1")  # applied twice: nothing changes
    assert job == before


def test_expired_lease_is_reassigned_with_a_higher_token_and_counts_a_failure() -> None:
    job = _job("a", status=JobStatus.IN_PROGRESS, token=42, lease=11_000)
    assert not apply_assignment(job, Assignment("a", 42, True), 50, 10_999, 10_000, 3, "w2")  # lease still live
    assert apply_assignment(job, Assignment("a", 42, True), 50, 11_000, 10_000, 3, "w2")
    assert (job.token, job.failures, job.worker, job.lease_expires_at) == (50, 1, "w2", 21_000)
    assert not apply_assignment(job, Assignment("a", 42, True), 51, 30_000, 10_000, 3, "w3")  # stale expectation
    assert owns(job, 50)
    assert not owns(job, 42)  # the first worker's token no longer owns the job
    assert not owns(None, 50)


def test_excluded_jobs_are_never_reassigned_and_are_evicted_over_the_limit() -> None:
    job = _job("a", status=JobStatus.IN_PROGRESS, token=9, lease=0, failures=3)
    assert not apply_assignment(job, Assignment("a", 9, True), 10, 100, 10, 3, "w")
    assert apply_assignment(job, Assignment("a", 9, True), 10, 100, 10, 4, "w")  # after the limit is raised
    jobs = [_job(f"ok{i}") for i in range(3)] + [_job("bad1", failures=5), _job("bad2", failures=3)]
    small = PlanLimits(queue_limit=4)
    assert evictions(jobs, small, failure_limit=3) == ["bad1"]
    assert evictions(jobs, small, failure_limit=3) == ["bad1"]
    assert evictions(jobs, PlanLimits(queue_limit=10), failure_limit=3) == []


def _kind(block: QueuedBlock) -> str:
    return block.id[0]


@pytest.mark.parametrize(("ids", "now", "expected"), [
    # blocks apart from a job's are left for a job of their own kind (a topic recreated: partition blocks of two
    # incarnations whose offsets overlap)
    ("ABAABB", 100, [["A0", "A2", "A3"], ["B1", "B4", "B5"]]),
    # a kind that cannot make a job yet does not hold back another that can
    ("ABBB", 100, [["B1", "B2", "B3"]]),
    ("AB", 10**9, []),  # aged, but no two blocks may merge
    ("AABB", 10**9, [["A0", "A1"], ["B2", "B3"]]),
])
def test_blocks_apart_are_never_in_one_job(ids: str, now: int, expected: list[list[str]]) -> None:
    queued = [QueuedBlock(f"{kind}{i}", KP, 100, i) for i, kind in enumerate(ids)]

    def apart(a: QueuedBlock, b: QueuedBlock) -> bool:
        return _kind(a) != _kind(b)

    jobs = plan_jobs(queued, LIMITS, now, 10, apart=apart)
    assert [j.sources for j in jobs] == expected
    assert plan_jobs(queued, LIMITS, now, 10, apart=apart) == jobs
    assert [j.sources for j in plan_jobs(queued, LIMITS, now, 10, apart=lambda a, b: False)] == [
        j.sources for j in plan_jobs(queued, LIMITS, now, 10)]
