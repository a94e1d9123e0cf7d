"""The metastore's API: how callers reach the replicated state, and the leader's own loops (seeds 004 and 003).

The top of the metastore, over replication (``shale.metastore.raft``) and the rules (``shale.metastore.rules``).
``service`` (``MetastoreService``: reads and writes over a log and a state), ``reads`` (``IndexReads``: every read,
declared once with its route; ``read_only_index``), ``capabilities`` (what a consumer may need, one protocol each),
``http`` (the routes), ``auth`` and ``sessions`` (who may call what), ``openapi``, ``client`` (``MetastoreClient``),
``dlq`` (the dead letter queue: commands that could not reach the service), ``maintenance`` (the leader's loops:
retention, tombstones, DLQ replay, bucket scan) and ``server`` (``MetastoreNode``; ``open_metastore`` for writers,
``open_index_view`` for readers).
"""

from shale.metastore.api.capabilities import (
    BlockQueries,
    Commands,
    ErasureReads,
    GenerationRules,
    OffsetReads,
    RestoreReads,
    TenantBlocks,
    Tenants,
)
from shale.metastore.api.client import MetastoreClient, tls_verify
from shale.metastore.api.dlq import DeadLetterQueue, Queued
from shale.metastore.api.reads import IndexReads, read_only_index
from shale.metastore.api.server import (
    MetastoreNode,
    client_token,
    open_index_view,
    open_metastore,
    remote_client,
    state_path,
)
from shale.metastore.api.service import MetastoreService

__all__ = [
    "BlockQueries",
    "Commands",
    "DeadLetterQueue",
    "ErasureReads",
    "GenerationRules",
    "IndexReads",
    "MetastoreClient",
    "MetastoreNode",
    "MetastoreService",
    "OffsetReads",
    "Queued",
    "RestoreReads",
    "TenantBlocks",
    "Tenants",
    "client_token",
    "open_index_view",
    "open_metastore",
    "read_only_index",
    "remote_client",
    "state_path",
    "tls_verify",
]
