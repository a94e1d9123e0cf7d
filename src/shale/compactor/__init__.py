"""The compaction worker (seed 003's worker, with Spark doing the work): a Spark application that polls the
metastore's compaction service for jobs, merges each job's blocks in a Spark task and reports back. The pure
planner, scheduler and the service's state are in ``shale.compaction``."""

from shale.compactor.merge import MergeResult, merge_blocks
from shale.compactor.worker import CompactionService, CompactionWorker

__all__ = ["CompactionService", "CompactionWorker", "MergeResult", "merge_blocks"]
