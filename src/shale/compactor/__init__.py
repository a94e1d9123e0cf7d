"""The compaction worker (seed 003's worker, with Spark doing the work): a Spark application that polls the
metastore's compaction service for jobs, merges each job's blocks in a Spark task and reports back. The pure
planner, scheduler and the service's state are in ``shale.compaction``."""

from shale.compactor.erase import erased_lineage, erased_rows
from shale.compactor.merge import MergeResult, merge_blocks, output_id
from shale.compactor.worker import CompactionService, CompactionWorker

__all__ = [
    "CompactionService",
    "CompactionWorker",
    "MergeResult",
    "erased_lineage",
    "erased_rows",
    "merge_blocks",
    "output_id",
]
