"""Compaction (seed 003): the pure planner and scheduler run inside the metastore's commands; the worker is a
Spark application that polls the metastore for jobs and merges blocks in Spark tasks."""

from shale.compaction.model import Job, JobStatus, PlanLimits, PlanUpdate, QueuedBlock, QueueKey
from shale.compaction.planner import job_name, plan_jobs
from shale.compaction.scheduler import apply_assignment, choose_assignments, evictions, owns

__all__ = [
    "Job",
    "JobStatus",
    "PlanLimits",
    "PlanUpdate",
    "QueueKey",
    "QueuedBlock",
    "apply_assignment",
    "choose_assignments",
    "evictions",
    "job_name",
    "owns",
    "plan_jobs",
]
