"""Ingestion (seed 002): Kafka topics into blocks, exactly once, by batches that read exact offset ranges.

The public face: ``IngestJob`` runs one group (``run(available_now=...)``); ``batch_commit`` is the one way a
batch's commit is built from the ``shale.encoder.Written`` its tasks return (ingestion and reprocessing share it).
The sequence is in this package's README and docs/design/ingest.md; what checks ingest's work afterwards
(``shale verify``, the completeness ledger) is ``shale.verify``.
"""

import typing as _typing

from shale.exports import lazy_exports as _lazy_exports

if _typing.TYPE_CHECKING:
    from shale.ingest.committer import Committer, IngestConflictError, batch_commit
    from shale.ingest.job import IngestJob
    from shale.ingest.plan import BatchPlan, Loss, PartitionRange, plan_batch
    from shale.ingest.task import ChunkWriter, chunk_bytes

__getattr__ = _lazy_exports(__name__, {  # each public name's module, imported on first use
    "Committer": "committer",
    "IngestConflictError": "committer",
    "batch_commit": "committer",
    "IngestJob": "job",
    "BatchPlan": "plan",
    "Loss": "plan",
    "PartitionRange": "plan",
    "plan_batch": "plan",
    "ChunkWriter": "task",
    "chunk_bytes": "task",
})


__all__ = [
    "BatchPlan",
    "ChunkWriter",
    "Committer",
    "IngestConflictError",
    "IngestJob",
    "Loss",
    "PartitionRange",
    "batch_commit",
    "chunk_bytes",
    "plan_batch",
]
