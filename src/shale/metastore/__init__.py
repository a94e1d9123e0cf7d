"""The metastore (seeds 004 and 003): the replicated service around the index.

Components: ``commands`` (typed records), ``fsm`` (the handler registry and state machine), ``log`` (single node
or Raft via pysyncobj), ``reads`` (every read, declared once; ``read_only_index``), ``service`` (reads and
writes), ``http``/``client`` (the API), ``dlq`` (dead letter queue), ``maintenance`` (retention, tombstones),
``rebuild`` (from the bucket), ``server`` (one process; ``open_metastore`` for writers, ``open_index_view`` for
readers).
"""

import typing as _typing

from shale.exports import lazy_exports as _lazy_exports
from shale.metastore.capabilities import (
    BlockQueries,
    Commands,
    ErasureReads,
    GenerationRules,
    OffsetReads,
    RestoreReads,
    TenantBlocks,
    Tenants,
)
from shale.metastore.client import MetastoreClient, tls_verify
from shale.metastore.commands import (
    AcknowledgeOffsetLoss,
    AcquireIngestLease,
    AddBlocks,
    Command,
    CommitIngestBatch,
    DeleteTombstones,
    ErasedPosition,
    ErasureWatermark,
    Noop,
    OffsetRange,
    PartitionKey,
    PlanErasure,
    QuarantineBlocks,
    RecordErasureReceipt,
    RecordRestore,
    ReleaseIngestLease,
    RenewIngestLease,
    ReplaceBlocks,
    RequestErasure,
    Result,
    SetActiveGeneration,
    SetCompactionFailureLimit,
    SetIngestShards,
    TrimBlockChanges,
    TruncateIndex,
    decode,
    encode,
)
from shale.metastore.dlq import DeadLetterQueue, Queued
from shale.metastore.erasures import Watermarks, erased_offsets, erasure_id, every_erasure
from shale.metastore.fsm import Entry, StateMachine, restore_file
from shale.metastore.garbage import Claims, unclaimed
from shale.metastore.leases import BRIDGED_SILENCE, LEASE_REASONS
from shale.metastore.log import RaftLog, SingleNodeLog
from shale.metastore.reads import IndexReads, read_only_index
from shale.metastore.server import (
    MetastoreNode,
    client_token,
    open_index_view,
    open_metastore,
    remote_client,
    state_path,
)
from shale.metastore.service import MetastoreService
from shale.metastore.shards import shard_of

if _typing.TYPE_CHECKING:
    from shale.metastore.rebuild import rebuild_from_bucket

__getattr__ = _lazy_exports(__name__, {  # each public name's module, imported on first use
    "rebuild_from_bucket": "rebuild",
})

__all__ = [
    "BRIDGED_SILENCE",
    "LEASE_REASONS",
    "AcknowledgeOffsetLoss",
    "AcquireIngestLease",
    "AddBlocks",
    "BlockQueries",
    "Claims",
    "Command",
    "Commands",
    "CommitIngestBatch",
    "DeadLetterQueue",
    "DeleteTombstones",
    "Entry",
    "ErasedPosition",
    "ErasureReads",
    "ErasureWatermark",
    "GenerationRules",
    "IndexReads",
    "MetastoreClient",
    "MetastoreNode",
    "MetastoreService",
    "Noop",
    "OffsetRange",
    "OffsetReads",
    "PartitionKey",
    "PlanErasure",
    "QuarantineBlocks",
    "Queued",
    "RaftLog",
    "RecordErasureReceipt",
    "RecordRestore",
    "ReleaseIngestLease",
    "RenewIngestLease",
    "ReplaceBlocks",
    "RequestErasure",
    "RestoreReads",
    "Result",
    "SetActiveGeneration",
    "SetCompactionFailureLimit",
    "SetIngestShards",
    "SingleNodeLog",
    "StateMachine",
    "TenantBlocks",
    "Tenants",
    "TrimBlockChanges",
    "TruncateIndex",
    "Watermarks",
    "client_token",
    "decode",
    "encode",
    "erased_offsets",
    "erasure_id",
    "every_erasure",
    "open_index_view",
    "open_metastore",
    "read_only_index",
    "rebuild_from_bucket",
    "remote_client",
    "restore_file",
    "shard_of",
    "state_path",
    "tls_verify",
    "unclaimed",
]
