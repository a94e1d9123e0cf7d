"""Ingestion (seed 002): Kafka topics into blocks, exactly once, by batches that read exact offset ranges.

The public face: ``IngestJob`` runs one group (``run(available_now=...)``); ``verify_topic`` reconciles Kafka with
what is stored; ``build_ledger`` answers "is this day complete?"; ``Written`` and ``batch_commit`` are the typed
record a task returns and the one way a batch's commit is built (ingestion and reprocessing share them). The
sequence is in this package's README and docs/DESIGN.md section 10.
"""

import typing as _typing
from importlib import import_module as _import_module

if _typing.TYPE_CHECKING:
    from shale.ingest.blocks import GROUPS, Chunk, GroupSpec, Written, write_chunk
    from shale.ingest.committer import Committer, IngestConflictError, batch_commit
    from shale.ingest.job import IngestJob
    from shale.ingest.ledger import Ledger, build_ledger
    from shale.ingest.plan import BatchPlan, Loss, PartitionRange, plan_batch
    from shale.ingest.verify import VerifyReport, verify_topic

_HOMES = {  # each public name's module, imported on first use (PEP 562)
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
}


def __getattr__(name: str) -> object:
    """A public name, imported on first use: a Spark Python worker that runs a task of ``shale.ingest.task``
    imports what the task needs, not the driver's job, committer and metastore client (half its import time)."""
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(_import_module(f"{__name__}.{_HOMES[name]}"), name)


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
