"""Compaction (seed 003): the pure planner and scheduler run inside the metastore's commands; the worker is a
Spark application that polls the metastore for jobs and merges blocks in Spark tasks."""

import typing as _typing

from shale.compaction.model import DAY_MS, Assignment, Job, JobStatus, PlanLimits, PlanUpdate, QueuedBlock, QueueKey
from shale.compaction.planner import job_name, plan_jobs, uncompactable
from shale.compaction.scheduler import apply_assignment, choose_assignments, evictions, owns
from shale.exports import lazy_exports as _lazy_exports

if _typing.TYPE_CHECKING:
    from shale.compaction.messages import (
        MAX_POLL_CAPACITY,
        Assigned,
        AssignJob,
        ErasePlan,
        JobUpdate,
        NewJob,
        PollRequest,
        PollResponse,
    )

__getattr__ = _lazy_exports(__name__, {  # each public name's module, imported on first use
    "MAX_POLL_CAPACITY": "messages",
    "AssignJob": "messages",
    "Assigned": "messages",
    "ErasePlan": "messages",
    "JobUpdate": "messages",
    "NewJob": "messages",
    "PollRequest": "messages",
    "PollResponse": "messages",
})

__all__ = [
    "DAY_MS",
    "MAX_POLL_CAPACITY",
    "AssignJob",
    "Assigned",
    "Assignment",
    "ErasePlan",
    "Job",
    "JobStatus",
    "JobUpdate",
    "NewJob",
    "PlanLimits",
    "PlanUpdate",
    "PollRequest",
    "PollResponse",
    "QueueKey",
    "QueuedBlock",
    "apply_assignment",
    "choose_assignments",
    "evictions",
    "job_name",
    "owns",
    "plan_jobs",
    "uncompactable",
]
