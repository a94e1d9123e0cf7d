"""What the Raft port trusts: frames sealed with the cluster secret, and pickles that cannot name code.

pysyncobj sends every message as a zlib-compressed pickle (protocol 2). Given a password it seals each frame with
Fernet (AES-128-CBC with HMAC-SHA256) and checks the HMAC before anything is unpickled, so only holders of the
cluster secret can get bytes to the unpickler; a multi-node metastore therefore refuses to start without
``metastore.secret``. As defence in depth, ``install`` replaces the pickle module pysyncobj uses for network frames
and log entries by one whose unpickler resolves only the globals pysyncobj really sends (measured with a recording
unpickler on a 3-node cluster through elections, snapshots and catch-up: ``_codecs.encode`` and ``bytes``, which
protocol 2 uses to spell bytes), each replaced by a stand-in that can only make bytes. Snapshot headers also carry
``set`` and ``pysyncobj.node.TCPNode`` (the member list). Anything else, ``os.system`` or any class, is refused
and the connection dropped, so even a holder of the secret cannot run code through the port.

Rotation: ``cluster_encryptor`` seals with the first secret and accepts any of ``[secret, *accepted]`` (Fernet's
``MultiFernet``). A rolling rotation goes through three restarts of every node, one node at a time: accept the new
secret (``accepted_secrets = [new]``), send the new one (``secret = new``, ``accepted_secrets = [old]``), forget the
old one (``accepted_secrets = []``). DESIGN 9.6 has the runbook.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import pickle
from collections.abc import Callable, Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import pysyncobj.syncobj
import pysyncobj.tcp_connection
from cryptography.fernet import MultiFernet
from pysyncobj import pickle as raft_pickle
from pysyncobj.encryptor import getEncryptor
from pysyncobj.node import TCPNode

PEER_TOKEN_CONTEXT = b"shale-metastore-peer-token/v1"


def _bytes_from_latin1(text: object, encoding: str = "utf-8", errors: str = "strict") -> bytes:
    """Stand-in for ``_codecs.encode``: protocol 2 spells ``b"..."`` as ``_codecs.encode("...", "latin1")``."""
    if not isinstance(text, str) or encoding.replace("-", "") != "latin1":
        raise pickle.UnpicklingError("the Raft wire only decodes latin-1 text into bytes")
    return text.encode("latin-1")


def _empty_bytes(*args: object) -> bytes:
    """Stand-in for ``bytes``: protocol 2 spells ``b""`` as ``bytes()``. ``bytes(10**12)`` is refused."""
    if args:
        raise pickle.UnpicklingError("the Raft wire only builds empty bytes with bytes()")
    return b""


FRAME_GLOBALS: Mapping[tuple[str, str], Any] = {
    ("_codecs", "encode"): _bytes_from_latin1,
    ("__builtin__", "bytes"): _empty_bytes,
    ("builtins", "bytes"): _empty_bytes,
}
SNAPSHOT_GLOBALS: Mapping[tuple[str, str], Any] = {
    **FRAME_GLOBALS,
    ("__builtin__", "set"): set,
    ("builtins", "set"): set,
    ("pysyncobj.node", "TCPNode"): TCPNode,
}


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, allowed: Mapping[tuple[str, str], Any]) -> None:
        super().__init__(io.BytesIO(data))
        self.allowed = allowed

    def find_class(self, module: str, name: str) -> Any:
        found = self.allowed.get((module, name))
        if found is None:
            raise pickle.UnpicklingError(f"the Raft wire refuses {module}.{name}: only pysyncobj's own data may "
                                         "be unpickled")
        return found

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("the Raft wire has no persistent ids")


def _loader(allowed: Mapping[tuple[str, str], Any]) -> Callable[[bytes | str], Any]:
    def loads(data: bytes | str) -> Any:
        return _RestrictedUnpickler(raft_pickle.to_bytes(data), allowed).load()
    return loads


frame_loads = _loader(FRAME_GLOBALS)
"""Unpickle a network frame or a log entry's command: pysyncobj's data only, no code."""

snapshot_loads = _loader(SNAPSHOT_GLOBALS)
"""Unpickle a snapshot header (it also lists the members as ``TCPNode`` objects)."""

_WIRE = SimpleNamespace(loads=frame_loads, dumps=raft_pickle.dumps, to_bytes=raft_pickle.to_bytes)


def install() -> None:
    """Make pysyncobj unpickle frames and log entries with ``frame_loads`` (idempotent). pysyncobj imports its
    pickle module as a module attribute in ``tcp_connection`` and ``syncobj``; those two attributes are the only
    ones replaced, and tests/unit/metastore/test_raft_security.py checks that they still exist in the pinned
    version."""
    pysyncobj.tcp_connection.pickle = _WIRE
    pysyncobj.syncobj.pickle = _WIRE


def installed() -> bool:
    return pysyncobj.tcp_connection.pickle is _WIRE and pysyncobj.syncobj.pickle is _WIRE


def cluster_encryptor(secret: str, accepted: Sequence[str] = ()) -> MultiFernet:
    """Seal with ``secret``; open frames sealed with it or any ``accepted`` secret. Keys are derived as pysyncobj
    derives its password's (PBKDF2-SHA256), so the wire format is pysyncobj's own."""
    if not secret:
        raise ValueError("a cluster encryptor needs a secret")
    return MultiFernet([getEncryptor(s) for s in dict.fromkeys([secret, *accepted]) if s])


def peer_token(secret: str) -> str:
    """The bearer token metastore nodes present to each other (the follower's read-barrier call to the leader):
    an HMAC of a fixed context under the cluster secret, so it changes when the secret does and reveals nothing
    about it."""
    return hmac.new(secret.encode(), PEER_TOKEN_CONTEXT, hashlib.sha256).hexdigest()
