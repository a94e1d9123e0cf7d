"""Restore: replay the backup group into a Kafka topic, exactly once (docs/DESIGN.md, "Restore")."""

import typing as _typing

from shale.exports import lazy_exports as _lazy_exports

if _typing.TYPE_CHECKING:
    from shale.restore.job import RestoreJob, RestoreReport, RestoreRequest, job_name
    from shale.restore.offsets import (
        committed_offsets,
        dead_lettered,
        erased_source_offsets,
        set_offsets,
        translate,
    )
    from shale.restore.partitioner import PartitionMapping, java_partition, murmur2
    from shale.restore.plan import RestorePlan, RestoreRange, build_plan, choose_incarnation
    from shale.restore.progress import read_anchors, read_progress
    from shale.restore.throttle import RestoreLimits

__getattr__ = _lazy_exports(__name__, {  # each public name's module, imported on first use
    "RestoreJob": "job",
    "RestoreReport": "job",
    "RestoreRequest": "job",
    "job_name": "job",
    "committed_offsets": "offsets",
    "dead_lettered": "offsets",
    "erased_source_offsets": "offsets",
    "set_offsets": "offsets",
    "translate": "offsets",
    "PartitionMapping": "partitioner",
    "java_partition": "partitioner",
    "murmur2": "partitioner",
    "RestorePlan": "plan",
    "RestoreRange": "plan",
    "build_plan": "plan",
    "choose_incarnation": "plan",
    "read_anchors": "progress",
    "read_progress": "progress",
    "RestoreLimits": "throttle",
})


__all__ = [
    "PartitionMapping",
    "RestoreJob",
    "RestoreLimits",
    "RestorePlan",
    "RestoreRange",
    "RestoreReport",
    "RestoreRequest",
    "build_plan",
    "choose_incarnation",
    "committed_offsets",
    "dead_lettered",
    "erased_source_offsets",
    "java_partition",
    "job_name",
    "murmur2",
    "read_anchors",
    "read_progress",
    "set_offsets",
    "translate",
]
