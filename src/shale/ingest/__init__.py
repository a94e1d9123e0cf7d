"""Ingestion (seed 002): Kafka topics into blocks, exactly once, by batches that read exact offset ranges.

The public face: ``IngestJob`` runs one group (``run(available_now=...)``); ``verify_topic`` reconciles Kafka with
what is stored; ``build_ledger`` answers "is this day complete?"; ``Written`` and ``batch_commit`` are the typed
record a task returns and the one way a batch's commit is built (ingestion and reprocessing share them). The
sequence is in this package's README and docs/DESIGN.md section 10.
"""

import typing as _typing

from shale.exports import lazy_exports as _lazy_exports

if _typing.TYPE_CHECKING:
    from shale.ingest.blocks import GROUPS, Chunk, GroupSpec, Written, write_chunk
    from shale.ingest.committer import Committer, IngestConflictError, batch_commit
    from shale.ingest.job import IngestJob
    from shale.ingest.ledger import Ledger, build_ledger
    from shale.ingest.plan import BatchPlan, Loss, PartitionRange, plan_batch
    from shale.ingest.verify import VerifyReport, verify_topic

__getattr__ = _lazy_exports(__name__, {  # each public name's module, imported on first use
    "GROUPS": "blocks",
    "Chunk": "blocks",
    "GroupSpec": "blocks",
    "Written": "blocks",
    "write_chunk": "blocks",
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
    "VerifyReport": "verify",
    "verify_topic": "verify",
})


__all__ = [
    "GROUPS",
    "BatchPlan",
    "Chunk",
    "Committer",
    "GroupSpec",
    "IngestConflictError",
    "IngestJob",
    "Ledger",
    "Loss",
    "PartitionRange",
    "VerifyReport",
    "Written",
    "batch_commit",
    "build_ledger",
    "plan_batch",
    "verify_topic",
    "write_chunk",
]
