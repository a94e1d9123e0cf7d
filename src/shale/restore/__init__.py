"""Restore: replay the backup group into a Kafka topic, exactly once (docs/DESIGN.md, "Restore")."""

from shale.restore.job import RestoreJob, RestoreReport, RestoreRequest
from shale.restore.partitioner import PartitionMapping, java_partition, murmur2
from shale.restore.plan import RestorePlan, RestoreRange, build_plan, choose_incarnation

__all__ = ["PartitionMapping", "RestoreJob", "RestorePlan", "RestoreRange", "RestoreReport", "RestoreRequest",
           "build_plan", "choose_incarnation", "java_partition", "murmur2"]
