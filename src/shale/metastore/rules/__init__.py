"""The metastore's rules: what every command means and how the state machine applies it (seeds 004 and 003).

The bottom of the metastore: it knows the index's stores and nothing of how commands are replicated or served.
``commands`` (typed records, ``encode``/``decode``), ``fsm`` (``StateMachine``: the handler registry, one apply
transaction per entry) and the rules of each command family: ``leases`` and ``shards`` (ingest leases and the shard
map), ``generations``, ``restores``, ``erasures``, ``compaction_service`` (plans, polls, job reports), ``garbage``
(which blocks no commit can claim). Replication (``shale.metastore.raft``) and the API (``shale.metastore.api``)
use it through this face.
"""

from shale.metastore.rules.commands import (
    CLIENT_COMMANDS,
    AcknowledgeOffsetLoss,
    AcquireIngestLease,
    AddBlocks,
    Command,
    CommitIngestBatch,
    DeleteTombstones,
    ErasedPosition,
    ErasureWatermark,
    IngestLeaseCommand,
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
from shale.metastore.rules.compaction_service import job_rows, plan_command, prepare_plan, queue_counts
from shale.metastore.rules.erasures import Watermarks, erased_offsets, erasure_id, erasure_rows, every_erasure
from shale.metastore.rules.fsm import Entry, StateMachine, restore_file
from shale.metastore.rules.garbage import Claims, unclaimed
from shale.metastore.rules.leases import BRIDGED_SILENCE, LEASE_REASONS, lease_rows
from shale.metastore.rules.restores import KEPT, restore_rows
from shale.metastore.rules.shards import shard_of

__all__ = [
    "BRIDGED_SILENCE",
    "CLIENT_COMMANDS",
    "KEPT",
    "LEASE_REASONS",
    "AcknowledgeOffsetLoss",
    "AcquireIngestLease",
    "AddBlocks",
    "Claims",
    "Command",
    "CommitIngestBatch",
    "DeleteTombstones",
    "Entry",
    "ErasedPosition",
    "ErasureWatermark",
    "IngestLeaseCommand",
    "Noop",
    "OffsetRange",
    "PartitionKey",
    "PlanErasure",
    "QuarantineBlocks",
    "RecordErasureReceipt",
    "RecordRestore",
    "ReleaseIngestLease",
    "RenewIngestLease",
    "ReplaceBlocks",
    "RequestErasure",
    "Result",
    "SetActiveGeneration",
    "SetCompactionFailureLimit",
    "SetIngestShards",
    "StateMachine",
    "TrimBlockChanges",
    "TruncateIndex",
    "Watermarks",
    "decode",
    "encode",
    "erased_offsets",
    "erasure_id",
    "erasure_rows",
    "every_erasure",
    "job_rows",
    "lease_rows",
    "plan_command",
    "prepare_plan",
    "queue_counts",
    "restore_file",
    "restore_rows",
    "shard_of",
    "unclaimed",
]
