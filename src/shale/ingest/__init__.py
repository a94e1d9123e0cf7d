"""Ingestion (seed 002): Kafka topics into blocks, exactly once, by batches that read exact offset ranges.

The public face: ``IngestJob`` runs one group (``run(available_now=...)``); ``verify_topic`` reconciles Kafka with
what is stored; ``build_ledger`` answers "is this day complete?"; ``batch_commit`` is the one way a batch's commit
is built from the ``shale.encoder.Written`` its tasks return (ingestion and reprocessing share it). The sequence
is in this package's README and docs/DESIGN.md section 10.
"""

import typing as _typing

from shale.exports import lazy_exports as _lazy_exports

if _typing.TYPE_CHECKING:
    from shale.ingest.committer import Committer, IngestConflictError, batch_commit
    from shale.ingest.job import IngestJob
    from shale.ingest.ledger import Ledger, build_ledger
    from shale.ingest.plan import BatchPlan, Loss, PartitionRange, plan_batch
    from shale.ingest.task import ChunkWriter, chunk_bytes
    from shale.ingest.verify import NothingStored, StoredBlocks, VerifyReport, group_blocks, verify_topic

__getattr__ = _lazy_exports(__name__, {  # each public name's module, imported on first use
    "Committer": "committer",
    "IngestConflictError": "committer",
    "batch_commit": "committer",
    "IngestJob": "job",
    "Ledger": "ledger",
    "build_ledger": "ledger",
    "BatchPlan": "plan",
    "Loss": "plan",
    "PartitionRange": "plan",
    "plan_batch": "plan",
    "ChunkWriter": "task",
    "chunk_bytes": "task",
    "NothingStored": "verify",
    "StoredBlocks": "verify",
    "VerifyReport": "verify",
    "group_blocks": "verify",
    "verify_topic": "verify",
})


__all__ = [
    "BatchPlan",
    "ChunkWriter",
    "Committer",
    "IngestConflictError",
    "IngestJob",
    "Ledger",
    "Loss",
    "NothingStored",
    "PartitionRange",
    "StoredBlocks",
    "VerifyReport",
    "batch_commit",
    "build_ledger",
    "chunk_bytes",
    "group_blocks",
    "plan_batch",
    "verify_topic",
]
