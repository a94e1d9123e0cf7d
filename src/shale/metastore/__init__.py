"""The metastore (seeds 004 and 003): the replicated service around the index.

Components: ``commands`` (typed records), ``fsm`` (the handler registry and state machine), ``log`` (single node
or Raft via pysyncobj), ``reads`` (every read, declared once; ``read_only_index``), ``service`` (reads and
writes), ``http``/``client`` (the API), ``dlq`` (dead letter queue), ``maintenance`` (retention, tombstones),
``rebuild`` (from the bucket), ``server`` (one process; ``open_metastore`` for writers, ``open_index_view`` for
readers).
"""

from shale.metastore.client import MetastoreClient
from shale.metastore.commands import (
    AcknowledgeOffsetLoss,
    AcquireIngestLease,
    AddBlocks,
    Command,
    CommitIngestBatch,
    DeleteTombstones,
    Noop,
    OffsetRange,
    PartitionKey,
    QuarantineBlocks,
    ReleaseIngestLease,
    RenewIngestLease,
    ReplaceBlocks,
    Result,
    SetActiveGeneration,
    SetIngestShards,
    TruncateIndex,
    decode,
    encode,
)
from shale.metastore.dlq import DeadLetterQueue
from shale.metastore.fsm import Entry, StateMachine
from shale.metastore.log import RaftLog, SingleNodeLog
from shale.metastore.reads import IndexReads, read_only_index
from shale.metastore.server import MetastoreNode, open_index_view, open_metastore
from shale.metastore.service import MetastoreService

__all__ = [
    "AcknowledgeOffsetLoss",
    "AcquireIngestLease",
    "AddBlocks",
    "Command",
    "CommitIngestBatch",
    "DeadLetterQueue",
    "DeleteTombstones",
    "Entry",
    "IndexReads",
    "MetastoreClient",
    "MetastoreNode",
    "MetastoreService",
    "Noop",
    "OffsetRange",
    "PartitionKey",
    "QuarantineBlocks",
    "RaftLog",
    "ReleaseIngestLease",
    "RenewIngestLease",
    "ReplaceBlocks",
    "Result",
    "SetActiveGeneration",
    "SetIngestShards",
    "SingleNodeLog",
    "StateMachine",
    "TruncateIndex",
    "decode",
    "encode",
    "open_index_view",
    "open_metastore",
    "read_only_index",
]
