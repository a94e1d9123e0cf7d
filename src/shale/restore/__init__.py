"""Restore: replay the backup group into a Kafka topic, exactly once (docs/DESIGN.md, "Restore")."""

import typing as _typing

from shale.exports import lazy_exports as _lazy_exports

if _typing.TYPE_CHECKING:
    from shale.restore.job import RestoreJob, RestoreReport, RestoreRequest
    from shale.restore.partitioner import PartitionMapping, java_partition, murmur2
    from shale.restore.plan import RestorePlan, RestoreRange, build_plan, choose_incarnation

__getattr__ = _lazy_exports(__name__, {  # each public name's module, imported on first use
    "RestoreJob": "job",
    "RestoreReport": "job",
    "RestoreRequest": "job",
    "PartitionMapping": "partitioner",
    "java_partition": "partitioner",
    "murmur2": "partitioner",
    "RestorePlan": "plan",
    "RestoreRange": "plan",
    "build_plan": "plan",
    "choose_incarnation": "plan",
})


__all__ = ["PartitionMapping", "RestoreJob", "RestorePlan", "RestoreRange", "RestoreReport", "RestoreRequest",
           "build_plan", "choose_incarnation", "java_partition", "murmur2"]
