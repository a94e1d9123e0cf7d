"""The metastore's replication: how a command reaches every replica's state machine (seed 004).

Above the rules (``shale.metastore.rules``), below the API. ``log`` (``CommandLog``: ``SingleNodeLog``, the embedded
default, or ``RaftLog`` through pysyncobj), ``journal`` (the Raft journal on disk: entries, term and vote durable
before the node says anything about them), ``raftwire`` (what the Raft port trusts: sealed frames, pickles that
cannot name code, the peer token) and ``rebuild`` (a state rebuilt from the bucket alone, without the log).
"""

import typing as _typing

from shale.exports import lazy_exports as _lazy_exports
from shale.metastore.raft.log import CommandLog, RaftLog, SingleNodeLog
from shale.metastore.raft.raftwire import peer_token

if _typing.TYPE_CHECKING:
    from shale.metastore.raft.rebuild import rebuild_from_bucket

__getattr__ = _lazy_exports(__name__, {  # each public name's module, imported on first use
    "rebuild_from_bucket": "rebuild",
})

__all__ = [
    "CommandLog",
    "RaftLog",
    "SingleNodeLog",
    "peer_token",
    "rebuild_from_bucket",
]
