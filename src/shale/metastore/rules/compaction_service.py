"""The compaction service inside the metastore (seed 003): the two-step plan update and its commands.

A worker's poll is served by the leader in two steps: ``prepare_plan`` reads the state (read-only) and decides
with the pure planner and scheduler; ``UpdateCompactionPlan`` carries that decision through the log, and every
replica applies it. Each change in the plan carries the state it was prepared against and applies only if that
still holds (a job still unassigned, or still holding the token it had), so a plan is idempotent and two plans
prepared from the same state cannot both assign one job. A plan prepared in an older term is rejected.

Completion replaces the sources by the outputs atomically (tombstones for the sources, the outputs queued at the
next level) once the outputs are checked against the job (tenant, shard, group, generation, level, parents,
lineage, Kafka offsets, rows): a report cannot tombstone records it does not hold. It is refused when a source
has left the index meanwhile (retention): compaction never resurrects data; the job is dropped and its
surviving sources go back to the queue. A report whose token is older than the job's (the lease expired and the
job was reassigned) is refused, and the worker stops that job.

Retries are answered as applied, twice over: a poll carries a request id, and a poll already applied is
answered with the answer it got then (``compaction_polls``, one per worker, kept ``POLL_MEMORY_MS``); and a
success report for a job that is gone is answered ``completed`` when its effect is in the index (its outputs
indexed or tombstoned, its sources tombstoned "compacted into" exactly those outputs).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

from prometheus_client import Counter, Histogram

from shale.block import BlockMeta, incarnations_overlap, shared_scopes
from shale.compaction import (
    Assigned,
    AssignJob,
    Assignment,
    Job,
    JobStatus,
    JobUpdate,
    NewJob,
    PlanLimits,
    PlanUpdate,
    PollRequest,
    QueuedBlock,
    QueueKey,
    apply_assignment,
    choose_assignments,
    evictions,
    owns,
    plan_jobs,
)
from shale.errors import CommandRejectedError
from shale.index import CompactionState, IndexWriter
from shale.metastore.rules import erasures
from shale.metastore.rules.commands import Result, SetCompactionFailureLimit, UpdateCompactionPlan

REASSIGNED = Counter("shale_compaction_lease_expirations_total", "Jobs reassigned after their lease expired.")
COMPLETED = Counter("shale_compaction_jobs_completed_total", "Compaction jobs completed, by level.", ["level"])
REJECTED = Counter("shale_compaction_reports_rejected_total", "Worker reports refused, by reason.", ["reason"])
FIRST_COMPACTION = Histogram("shale_compaction_time_to_first_compaction_seconds",
                             "From a level-0 block's commit to its first compaction.",
                             buckets=(5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600))


# How long a worker's last poll answer is kept for the worker to send that poll again (a client's deadline is a
# minute; a worker riding out a metastore outage sends its unanswered poll again as soon as it is back).
POLL_MEMORY_MS = 24 * 3_600_000


def prepare_plan(state: CompactionState, request: PollRequest, now_ms: int, limits: PlanLimits,
                 blocks: Callable[[str], BlockMeta | None] | None = None) -> PlanUpdate:
    """Step one: decide, from a read of the state, without changing it. A poll already applied plans nothing:
    the command answers it from the remembered answer. ``blocks`` reads an indexed block's metadata: with it,
    no job merges partition blocks holding two incarnations' records at the same offsets (``apart``)."""
    if request.request and state.poll_answer(request.worker, request.request) is not None:
        return PlanUpdate()
    jobs = state.jobs()
    limit = state.failure_limit()
    new = plan_jobs(state.queued(), limits, now_ms, max_jobs=request.capacity,
                    apart=apart(blocks) if blocks is not None else None)
    return PlanUpdate(new_jobs=new, assign=choose_assignments(jobs + new, now_ms, request.capacity, limit),
                      evict=evictions(jobs + new, limits, limit))


def apart(blocks: Callable[[str], BlockMeta | None]) -> Callable[[QueuedBlock, QueuedBlock], bool]:
    """Partition blocks one merge must not hold together: ranges of two incarnations of a topic intersecting
    (``shale.block.incarnations_overlap``; a topic recreated, its offsets from 0 again). A merged partition
    dataset does not name its rows' incarnations, so an erasure could not tell such rows apart: it would keep both
    and its receipt wait for ever. A backup dataset names them, so backup blocks merge whatever their ranges."""
    metas: dict[str, BlockMeta | None] = {}

    def meta(block_id: str) -> BlockMeta | None:
        if block_id not in metas:
            metas[block_id] = blocks(block_id)
        return metas[block_id]

    def check(a: QueuedBlock, b: QueuedBlock) -> bool:
        if a.key.group != "partition":
            return False
        first, second = meta(a.id), meta(b.id)
        return first is not None and second is not None and incarnations_overlap(first, second)

    return check


def plan_command(plan: PlanUpdate, request: PollRequest, term: int, limits: PlanLimits) -> UpdateCompactionPlan:
    return UpdateCompactionPlan(
        prepared_term=term, worker=request.worker, request=request.request, lease_ms=limits.lease_ms,
        updates=request.updates,
        new_jobs=[NewJob(name=j.name, tenant=j.key.tenant, shard=j.key.shard, level=j.key.level, group=j.key.group,
                         generation=j.key.generation, sources=j.sources, raw_bytes=j.raw_bytes,
                         created_at=j.created_at) for j in plan.new_jobs],
        assign=[AssignJob(job=a.job, expect_token=a.expect_token, reassign=a.reassign) for a in plan.assign],
        evict=plan.evict)


def _drop_job(w: IndexWriter, job: Job) -> None:
    """Remove a job that can no longer complete; its sources still in the index go back to the queue (with
    the time they entered the index, so they are planned again at once)."""
    w.compaction.delete_job(job.name)
    w.compaction.requeue(job.sources)


def _offsets(blocks: list[BlockMeta]) -> set[tuple[str, int, str, int, int]]:
    """The union of the blocks' Kafka ranges per topic-partition and incarnation, as maximal ranges."""
    spans: dict[tuple[str, int, str], list[tuple[int, int]]] = defaultdict(list)
    for block in blocks:
        for r in block.kafka:
            if r.end > r.start:
                spans[(r.topic, r.partition, r.incarnation)].append((r.start, r.end))
    out: set[tuple[str, int, str, int, int]] = set()
    for key, ranges in spans.items():
        ranges.sort()
        low, high = ranges[0]
        for start, stop in ranges[1:]:
            if start > high:
                out.add((*key, low, high))
                low = start
            high = max(high, stop)
        out.add((*key, low, high))
    return out


def output_problem(job: Job, sources: list[BlockMeta], outputs: list[BlockMeta]) -> str | None:
    """Why ``outputs`` cannot replace ``sources`` as ``job``'s result, or None. A buggy or hostile report must
    not tombstone records: the outputs must be of the job's kind, name the job's sources as parents, and
    account for the sources' lineage, Kafka offsets and rows."""
    rows_in = sum(s.rows for s in sources)
    if not outputs:  # a merge always writes one output, even of sources without records (their offsets)
        return f"no outputs for sources holding {rows_in} rows"
    ids = [o.id for o in outputs]
    if len(set(ids)) != len(ids) or set(ids) & set(job.sources):
        return "outputs repeat a block id or reuse a source's"
    k, parents = job.key, sorted(job.sources)
    for o in outputs:
        if (o.tenant, o.shard, o.group, o.generation, o.level) != (k.tenant, k.shard, k.group, k.generation,
                                                                   k.level + 1):
            return (f"output {o.id} is {o.tenant}/{o.shard} {o.group} generation {o.generation} level {o.level}; "
                    f"the job needs {k.tenant}/{k.shard} {k.group} generation {k.generation} level {k.level + 1}")
        if sorted(o.compaction.parents) != parents:
            return f"output {o.id} names parents other than the job's sources"
    if {x for o in outputs for x in o.compaction.sources} != {x for s in sources for x in s.compaction.sources}:
        return "the outputs' lineage (compaction.sources) differs from the sources'"
    if _offsets(outputs) != _offsets(sources):
        return "the outputs' Kafka offsets differ from the sources'"
    rows_out = sum(o.rows for o in outputs)
    if rows_out > rows_in or (rows_in and not rows_out):
        return f"the outputs hold {rows_out} rows for {rows_in} source rows"
    if rows_out < rows_in and not shared_scopes(sources):
        # No two sources may hold one record (same topic incarnation, intersecting offsets): nothing is a copy.
        return f"the outputs hold {rows_out} rows for {rows_in} source rows, and no two sources share a record"
    return None


def _complete(w: IndexWriter, job: Job, update: JobUpdate, at: int, index: int,
              links: dict[str, list[object]]) -> str:
    if erasures.erasure_of(job.name) is not None:
        outcome = erasures.complete(w, job, update, at)
        if outcome == "completed":
            links[job.name] = w.touch({job.key.tenant}, index, at)[job.key.tenant]
            COMPLETED.labels(str(job.key.level)).inc()
        elif outcome == "sources-missing":
            _drop_job(w, job)
        return outcome
    sources = [w.get_block(s) for s in job.sources]
    present = [s for s in sources if s is not None]
    if len(present) != len(sources):
        _drop_job(w, job)
        return "sources-missing"
    outputs = update.outputs
    problem = output_problem(job, present, outputs)
    if problem is None and any(set(o.erased or ()) - set(erasures.merge_erased(w, present) or ()) for o in outputs):
        problem = "an output names an erasure a source still holds records of"
    if problem is None and w.tombstoned_among([o.id for o in outputs]):
        problem = "an output was already deleted"
    if problem is None and w.existing([o.id for o in outputs]):
        problem = "an output is already in the index"
    if problem is not None:
        return f"invalid-outputs: {problem}"
    names = ",".join(o.id for o in outputs)
    for source in job.sources:
        added = w.added_at(source)
        old = w.remove_block(source)
        assert old is not None
        if old.level == 0 and added is not None:
            FIRST_COMPACTION.observe(max(0, at - added) / 1000)
        w.add_tombstone(old, at, f"compacted into {names}")
    w.add_blocks(outputs, at)
    erasures.cover(w, outputs, at, parents=present)
    links[job.name] = w.touch({job.key.tenant}, index, at)[job.key.tenant]
    w.compaction.delete_job(job.name)
    COMPLETED.labels(str(job.key.level)).inc()
    return "completed"


def already_completed(w: IndexWriter, update: JobUpdate) -> bool:
    """Whether a success report for a job that is gone describes a completion the index holds: every output
    indexed (or tombstoned since) and every parent tombstoned "compacted into" exactly these outputs. A retried
    report then answers as applied, and its worker keeps its committed output."""
    if update.status != "success" or not update.outputs:
        return False
    if erasures.erasure_of(update.job) is not None:
        return erasures.already_completed(w, update)
    reason = f"compacted into {','.join(o.id for o in update.outputs)}"
    parents = {p for o in update.outputs for p in o.compaction.parents}
    return (bool(parents) and all(w.has_block(o.id) or w.tombstoned(o.id) for o in update.outputs)
            and all(w.tombstone_reason(p) == reason for p in parents))


def _assigned(w: IndexWriter, job: Job) -> dict[str, Any]:
    sources = [s for s in (w.get_block(s) for s in job.sources) if s is not None]
    return Assigned(job=job.name, token=job.token, lease_expires_at=job.lease_expires_at, tenant=job.key.tenant,
                    shard=job.key.shard, level=job.key.level, group=job.key.group, generation=job.key.generation,
                    sources=sources,
                    erase=erasures.erase_plan(w, job.name, sources[0]) if sources else None,
                    erased=erasures.merge_erased(w, sources)).model_dump(mode="json")


def _replayed(w: IndexWriter, answer: dict[str, Any]) -> Result:
    """The answer of a poll applied before, for the worker that sends it again: the same outcomes, and the jobs
    it was assigned that it still holds (same token)."""
    assigned = []
    for name, token in answer["assigned"]:
        job = w.compaction.job(name)
        if job is not None and job.status is JobStatus.IN_PROGRESS and job.token == token:
            assigned.append(_assigned(w, job))
    return Result(ok=True, data={"assigned": assigned, "updates": answer["updates"], "links": answer.get("links", {})})


def apply_plan(w: IndexWriter, cmd: UpdateCompactionPlan, index: int, term: int, time_ms: int) -> Result:
    if cmd.prepared_term != term:
        raise CommandRejectedError(f"compaction plan prepared in term {cmd.prepared_term}, committed in term {term}",
                                   reason="stale-term")
    state = w.compaction
    if cmd.request and (answer := state.poll_answer(cmd.worker, cmd.request)) is not None:
        return _replayed(w, answer)
    limit = state.failure_limit()
    outcomes: dict[str, str] = {}
    links: dict[str, list[object]] = {}
    for update in cmd.updates:
        job = state.job(update.job)
        if not owns(job, update.token):
            if job is None and already_completed(w, update):
                outcomes[update.job] = "completed"
                continue
            outcomes[update.job] = "lost" if job is not None else "unknown-job"
        else:
            assert job is not None
            if update.status == "in_progress":
                job.lease_expires_at = time_ms + cmd.lease_ms
                state.save_job(job)
                outcomes[update.job] = "refreshed"
            else:
                outcomes[update.job] = _complete(w, job, update, time_ms, index, links)
        if outcomes[update.job] not in ("refreshed", "completed"):
            REJECTED.labels(outcomes[update.job].split(":")[0]).inc()
    for name in cmd.evict:
        # Deliberate: an evicted job failed the limit; its sources stay in the index, readable, uncompacted, and
        # are not queued again (they would only make the same failing job again).
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
        if not all(w.has_block(s) for s in job.sources):
            _drop_job(w, job)  # a source left the index (retention): the merge could never complete
            continue
        if apply_assignment(job, Assignment(a.job, a.expect_token, a.reassign), index, time_ms, cmd.lease_ms, limit,
                            cmd.worker):
            if a.reassign:
                REASSIGNED.inc()
            state.save_job(job)
            assigned.append(_assigned(w, job))
    if cmd.request:
        state.save_poll_answer(cmd.worker, cmd.request, time_ms,
                               {"updates": outcomes, "assigned": [[a["job"], a["token"]] for a in assigned],
                                "links": links})
        state.forget_poll_answers(before=time_ms - POLL_MEMORY_MS)
    return Result(ok=True, data={"assigned": assigned, "updates": outcomes, "links": links})


def apply_failure_limit(w: IndexWriter, cmd: SetCompactionFailureLimit) -> Result:
    w.compaction.set_failure_limit(cmd.limit)
    return Result(ok=True, data={"limit": cmd.limit})


def job_status(job: Job, now_ms: int, failure_limit: int) -> str:
    if job.status is JobStatus.UNASSIGNED:
        return "unassigned"
    if job.failures >= failure_limit and job.lease_expires_at <= now_ms:
        return "excluded"
    return "in_progress" if job.lease_expires_at > now_ms else "lease_expired"


def job_rows(state: CompactionState, now_ms: int) -> list[dict[str, Any]]:
    """Every compaction job as ``shale compact jobs``, the HTTP API and the status page show it."""
    limit = state.failure_limit()
    return [{"name": j.name, "tenant": j.key.tenant, "shard": j.key.shard, "level": j.key.level,
             "group": j.key.group, "generation": j.key.generation, "sources": len(j.sources),
             "source_ids": list(j.sources),
             "raw_bytes": j.raw_bytes, "status": job_status(j, now_ms, limit), "token": j.token,
             "lease_expires_at": j.lease_expires_at, "failures": j.failures, "worker": j.worker}
            for j in state.jobs()]


def queue_counts(state: CompactionState) -> dict[str, int]:
    """Blocks waiting to be planned into a job, per ``<tenant>/L<level>``."""
    counts: dict[str, int] = {}
    for block in state.queued():
        name = f"{block.key.tenant}/L{block.key.level}"
        counts[name] = counts.get(name, 0) + 1
    return counts
