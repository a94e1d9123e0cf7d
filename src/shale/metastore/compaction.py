"""The compaction service inside the metastore (seed 003): the two-step plan update and its commands.

A worker's poll is served by the leader in two steps: ``prepare_plan`` reads the state (read-only) and decides
with the pure planner and scheduler; ``UpdateCompactionPlan`` carries that decision through the log, and every
replica applies it. Each change in the plan carries the state it was prepared against and applies only if that
still holds (a job still unassigned, or still holding the token it had), so a plan is idempotent and two plans
prepared from the same state cannot both assign one job. A plan prepared in an older term is rejected.

Completion replaces the sources by the output atomically (tombstones for the sources, the output queued at the
next level) and is refused when a source has left the index meanwhile (retention): compaction never resurrects
data. A report whose token is older than the job's (the lease expired and the job was reassigned) is refused,
and the worker stops that job.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Histogram

from shale.compaction.model import Assignment, Job, JobStatus, PlanLimits, PlanUpdate, QueueKey
from shale.compaction.planner import plan_jobs
from shale.compaction.protocol import Assigned, JobUpdate, PollRequest
from shale.compaction.scheduler import apply_assignment, choose_assignments, evictions, owns
from shale.errors import CommandRejectedError
from shale.index import IndexWriter
from shale.index.compaction_state import CompactionState
from shale.metastore.commands import (
    AssignJob,
    NewJob,
    Result,
    SetCompactionFailureLimit,
    UpdateCompactionPlan,
)

REASSIGNED = Counter("shale_compaction_lease_expirations_total", "Jobs reassigned after their lease expired.")
COMPLETED = Counter("shale_compaction_jobs_completed_total", "Compaction jobs completed, by level.", ["level"])
REJECTED = Counter("shale_compaction_reports_rejected_total", "Worker reports refused, by reason.", ["reason"])
FIRST_COMPACTION = Histogram("shale_compaction_time_to_first_compaction_seconds",
                             "From a level-0 block's commit to its first compaction.",
                             buckets=(5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600))


def prepare_plan(state: CompactionState, request: PollRequest, now_ms: int, limits: PlanLimits) -> PlanUpdate:
    """Step one: decide, from a read of the state, without changing it."""
    jobs = state.jobs()
    limit = state.failure_limit()
    new = plan_jobs(state.queued(), limits, now_ms, max_jobs=request.capacity)
    return PlanUpdate(new_jobs=new, assign=choose_assignments(jobs + new, now_ms, request.capacity, limit),
                      evict=evictions(jobs + new, limits, limit))


def plan_command(plan: PlanUpdate, request: PollRequest, term: int, limits: PlanLimits) -> UpdateCompactionPlan:
    return UpdateCompactionPlan(
        prepared_term=term, worker=request.worker, lease_ms=limits.lease_ms, updates=request.updates,
        new_jobs=[NewJob(name=j.name, tenant=j.key.tenant, shard=j.key.shard, level=j.key.level, group=j.key.group,
                         generation=j.key.generation, sources=j.sources, raw_bytes=j.raw_bytes,
                         created_at=j.created_at) for j in plan.new_jobs],
        assign=[AssignJob(job=a.job, expect_token=a.expect_token, reassign=a.reassign) for a in plan.assign],
        evict=plan.evict)


def _complete(w: IndexWriter, job: Job, update: JobUpdate, at: int, index: int) -> str:
    missing = [s for s in job.sources if not w.has_block(s)]
    if missing:
        w.compaction.delete_job(job.name)
        return "sources-missing"
    outputs = update.outputs
    if any(o.tenant != job.key.tenant for o in outputs) or w.tombstoned_among([o.id for o in outputs]):
        return "invalid-outputs"
    names = ",".join(o.id for o in outputs)
    for source in job.sources:
        added = w.added_at(source)
        old = w.remove_block(source)
        assert old is not None
        if old.level == 0 and added is not None:
            FIRST_COMPACTION.observe(max(0, at - added) / 1000)
        w.add_tombstone(old, at, f"compacted into {names}")
    w.add_blocks(outputs, at)
    w.touch({job.key.tenant}, index)
    w.compaction.delete_job(job.name)
    COMPLETED.labels(str(job.key.level)).inc()
    return "completed"


def apply_plan(w: IndexWriter, cmd: UpdateCompactionPlan, index: int, term: int, time_ms: int) -> Result:
    if cmd.prepared_term != term:
        raise CommandRejectedError(f"compaction plan prepared in term {cmd.prepared_term}, committed in term {term}",
                                   reason="stale-term")
    state = w.compaction
    limit = state.failure_limit()
    outcomes: dict[str, str] = {}
    for update in cmd.updates:
        job = state.job(update.job)
        if not owns(job, update.token):
            outcomes[update.job] = "lost" if job is not None else "unknown-job"
            REJECTED.labels(outcomes[update.job]).inc()
            continue
        assert job is not None
        if update.status == "in_progress":
            job.lease_expires_at = time_ms + cmd.lease_ms
            state.save_job(job)
            outcomes[update.job] = "refreshed"
        else:
            outcomes[update.job] = _complete(w, job, update, time_ms, index)
    for name in cmd.evict:
        state.delete_job(name)
    for new in cmd.new_jobs:
        if len(state.queued_ids(new.sources)) != len(new.sources) or state.job(new.name) is not None:
            continue  # another plan took these blocks first
        state.dequeue(new.sources)
        state.save_job(Job(new.name, QueueKey(new.tenant, new.shard, new.level, new.group, new.generation),
                           new.sources, new.raw_bytes, new.created_at))
    assigned: list[dict[str, Any]] = []
    for a in cmd.assign:
        job = state.job(a.job)
        if job is None:
            continue
        if apply_assignment(job, Assignment(a.job, a.expect_token, a.reassign), index, time_ms, cmd.lease_ms, limit,
                            cmd.worker):
            if a.reassign:
                REASSIGNED.inc()
            state.save_job(job)
            sources = [w.get_block(s) for s in job.sources]
            assigned.append(Assigned(
                job=job.name, token=job.token, lease_expires_at=job.lease_expires_at, tenant=job.key.tenant,
                shard=job.key.shard, level=job.key.level, group=job.key.group, generation=job.key.generation,
                sources=[s for s in sources if s is not None]).model_dump(mode="json"))
    return Result(ok=True, data={"assigned": assigned, "updates": outcomes})


def apply_failure_limit(w: IndexWriter, cmd: SetCompactionFailureLimit) -> Result:
    w.compaction.set_failure_limit(cmd.limit)
    return Result(ok=True, data={"limit": cmd.limit})


def job_status(job: Job, now_ms: int, failure_limit: int) -> str:
    if job.status is JobStatus.UNASSIGNED:
        return "unassigned"
    if job.failures >= failure_limit and job.lease_expires_at <= now_ms:
        return "excluded"
    return "in_progress" if job.lease_expires_at > now_ms else "lease_expired"
