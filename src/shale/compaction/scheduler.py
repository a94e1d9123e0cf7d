"""The job scheduler (seed 003): pure. Small job first; leases timed by the log; fencing tokens.

Priority, within the lowest level that has eligible work: unassigned jobs first; then in-progress jobs whose
lease expired (abandoned), fewest failures and earliest expiry first. A job whose failures reached the limit is
never reassigned: it stays at the bottom until an operator raises the limit. When the schedule holds more than
``queue_limit`` jobs, excluded jobs are evicted (their blocks will not be compacted).

Leases and tokens are set when the plan is applied: the token is the log index of the applying entry (always
higher than any earlier token), and the lease runs from that entry's time.
"""

from __future__ import annotations

from shale.compaction.model import Assignment, Job, JobStatus, PlanLimits


def _eligible(job: Job, now_ms: int, failure_limit: int) -> bool:
    if job.status is JobStatus.UNASSIGNED:
        return True
    return job.lease_expires_at <= now_ms and job.failures < failure_limit


def choose_assignments(jobs: list[Job], now_ms: int, capacity: int, failure_limit: int) -> list[Assignment]:
    """Which jobs to hand to a worker with ``capacity`` free slots."""
    if capacity <= 0:
        return []
    ranked = sorted((j for j in jobs if _eligible(j, now_ms, failure_limit)),
                    key=lambda j: (j.key.level, int(j.status), j.failures, j.lease_expires_at, j.name))
    return [Assignment(j.name, j.token, reassign=j.status is JobStatus.IN_PROGRESS) for j in ranked[:capacity]]


def evictions(jobs: list[Job], limits: PlanLimits, failure_limit: int) -> list[str]:
    """Excluded jobs to drop when the schedule is over its size limit (most-failed first)."""
    excess = len(jobs) - limits.queue_limit
    if excess <= 0:
        return []
    excluded = sorted((j for j in jobs if j.failures >= failure_limit), key=lambda j: (-j.failures, j.name))
    return [j.name for j in excluded[:excess]]


def apply_assignment(job: Job, assignment: Assignment, entry_index: int, entry_time: int, lease_ms: int,
                     failure_limit: int, worker: str) -> bool:
    """Apply one prepared assignment at a log entry, if the job is still as it was when prepared. Idempotent:
    a second application finds the token changed and does nothing."""
    if job.token != assignment.expect_token:
        return False
    if job.status is JobStatus.IN_PROGRESS:
        if job.lease_expires_at > entry_time or job.failures >= failure_limit:
            return False
        job.failures += 1  # the previous owner's lease expired: one more failure (seed 003)
    job.status = JobStatus.IN_PROGRESS
    job.token = entry_index
    job.lease_expires_at = entry_time + lease_ms
    job.worker = worker
    return True


def owns(job: Job | None, token: int) -> bool:
    """Seed 003: ownership is confirmed if the worker's token is at least the job's token."""
    return job is not None and job.status is JobStatus.IN_PROGRESS and token >= job.token
