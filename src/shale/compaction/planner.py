"""The job planner (seed 003): pure. Queues of blocks per (tenant, shard, level, group, generation), and per day
in the partition group (``QueuedBlock.day``), in arrival order; a job closes when its queue holds the level's block
count, or the uncompressed bytes reach the job budget (worker memory stays bounded), or the oldest queued block
has waited ``max_age`` (with at least two blocks). Lower levels are planned first (small job first)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable

from shale.block import Overlap
from shale.compaction.model import Job, PlanLimits, QueuedBlock, QueueKey


def job_name(key: QueueKey, sources: list[str]) -> str:
    """Deterministic: the same sources always make the same job."""
    return f"{key.tenant}/{key.shard}/L{key.level}/{key.group}/g{key.generation}/{sources[0]}-{len(sources)}"


Apart = Callable[[QueuedBlock, QueuedBlock], bool]
"""Whether two queued blocks must not be merged by one job (``plan_jobs``)."""


def _take(blocks: list[QueuedBlock], limits: PlanLimits, now_ms: int, apart: Apart | None = None,
          skipped: list[QueuedBlock] | None = None) -> list[QueuedBlock] | None:
    """The next job's blocks from the head of ``blocks``, or None; the blocks passed over as ``apart`` from one
    taken go to ``skipped``."""
    if len(blocks) < 2:
        return None
    want = limits.blocks_for(blocks[0].key.level)
    taken: list[QueuedBlock] = []
    size = 0
    budget = False
    for block in blocks:
        if apart is not None and any(apart(t, block) for t in taken):
            if skipped is not None:
                skipped.append(block)  # left in the queue for a job of its own kind
            continue
        if taken and size + block.raw_bytes > limits.job_byte_budget:
            budget = True
            break
        taken.append(block)
        size += block.raw_bytes
        if len(taken) == want:
            break
    full = len(taken) == want or (budget and len(taken) >= 2)  # count reached, or bytes did
    aged = now_ms - blocks[0].added_at >= limits.max_age_ms and len(taken) >= 2
    return taken if full or aged else None


def plan_jobs(queued: Iterable[QueuedBlock], limits: PlanLimits, now_ms: int, max_jobs: int,
              apart: Apart | None = None) -> list[Job]:
    """Up to ``max_jobs`` new jobs from the queues (adaptive capacity: the caller passes the free slots the
    polling worker reported). Pure and deterministic. ``apart``: blocks no job may hold together (a queued
    block apart from one a job took waits for another job, and closes a job by count or age only)."""
    queues: dict[tuple[QueueKey, int], list[QueuedBlock]] = defaultdict(list)
    for block in queued:
        # A block already at the top level, or alone as large as a job's budget, is not compacted further.
        if block.key.level < limits.max_level and block.raw_bytes < limits.job_byte_budget:
            queues[block.queue].append(block)
    jobs: list[Job] = []
    for key, day in sorted(queues, key=lambda q: (q[0].level, q[0].tenant, q[0].shard, q[0].group, q[0].generation,
                                                  q[1])):
        blocks = sorted(queues[key, day], key=lambda b: (b.added_at, b.id))
        while len(jobs) < max_jobs:
            skipped: list[QueuedBlock] = []
            taken = _take(blocks, limits, now_ms, apart, skipped)
            if taken is None:
                if not skipped:
                    break
                blocks = skipped  # the head's kind waits; the blocks apart from it may make a job of their own
                continue
            sources = [b.id for b in taken]
            jobs.append(Job(job_name(key, sources), key, sources, sum(b.raw_bytes for b in taken), now_ms))
            blocks = [b for b in blocks if b not in taken]
        if len(jobs) >= max_jobs:
            break
    return jobs


def uncompactable(overlaps: Iterable[Overlap], queued: Iterable[QueuedBlock], jobs: Iterable[Job],
                  limits: PlanLimits) -> list[Overlap]:
    """The overlaps compaction will not merge away. It merges (and deduplicates) two blocks only when they are in
    one job, or wait in one queue and are both within its reach (below ``max_level`` and smaller than a job's
    budget); any other overlap (another shard or level, a block at the top level or too large, a block whose job
    was evicted) stays until ``shale bucket repair`` merges it. Blocks of one queue may still land in different
    jobs: their outputs then meet one level up, and at the top level the overlap is reported."""
    in_job = {source: job.name for job in jobs for source in job.sources}
    waiting = {b.id: b.queue for b in queued
               if b.key.level < limits.max_level and b.raw_bytes < limits.job_byte_budget}
    out = []
    for overlap in overlaps:
        a, b = overlap.first, overlap.second
        same_job = a in in_job and in_job[a] == in_job.get(b)
        same_queue = a in waiting and waiting[a] == waiting.get(b)
        if not (same_job or same_queue):
            out.append(overlap)
    return out
