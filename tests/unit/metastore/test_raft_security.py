"""The Raft port's defences: frames unpickle without code, the secret is required, and it rotates without
downtime (three pysyncobj nodes on loopback in one process)."""

from __future__ import annotations

import os
import pickle
import pickletools
from pathlib import Path

import pysyncobj.syncobj
import pysyncobj.tcp_connection
import pytest
from cryptography.fernet import InvalidToken, MultiFernet
from pysyncobj import pickle as raft_pickle
from pysyncobj.node import TCPNode
from tests.unit.metastore.helpers import meta
from tests.unit.metastore.test_raft_log import SECRET, Cluster

from shale.errors import ConfigError
from shale.metastore import AddBlocks, RaftLog, StateMachine, encode
from shale.metastore.raft import raftwire
from shale.process import free_port


class _RunsCode:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("touch /tmp/shale-should-never-exist",))


def test_frames_carry_pysyncobj_data_but_never_code() -> None:
    message = {"type": "append_entries", "term": 3, "entries": [(b"\x00" + b"command", 7, 3)], "empty": b"",
               "commit_index": 6}
    wire = raft_pickle.dumps(message)  # what pysyncobj sends: protocol 2
    assert {op.name for op, _, _ in pickletools.genops(wire)} & {"GLOBAL", "STACK_GLOBAL"}, "protocol 2 names globals"
    assert raftwire.frame_loads(wire) == message
    with pytest.raises(pickle.UnpicklingError, match=r"refuses posix\.system"):
        raftwire.frame_loads(raft_pickle.dumps(_RunsCode()))
    huge = b"c__builtin__\nbytes\n(I1000000000000\ntR."  # bytes(10**12): memory, not code, but refused too
    with pytest.raises(pickle.UnpicklingError, match="empty bytes"):
        raftwire.frame_loads(huge)
    with pytest.raises(pickle.UnpicklingError, match="refuses"):
        raftwire.frame_loads(raft_pickle.dumps({TCPNode("127.0.0.1:1")}))  # members only in snapshot headers
    header = raft_pickle.dumps(((b"\x01x", 5, 2), (b"\x01y", 4, 2), {TCPNode("127.0.0.1:1"), TCPNode("127.0.0.1:2")}))
    members = raftwire.snapshot_loads(header)[2]
    assert {n.address for n in members} == {"127.0.0.1:1", "127.0.0.1:2"}
    with pytest.raises(pickle.UnpicklingError):
        raftwire.snapshot_loads(raft_pickle.dumps(_RunsCode()))


def test_raft_log_replaces_pysyncobj_unpickling_and_needs_a_secret(tmp_path: Path) -> None:
    # pysyncobj 0.3.17 imports its pickle module as these two attributes; if an upgrade moves them, this fails.
    assert hasattr(pysyncobj.tcp_connection, "pickle")
    assert hasattr(pysyncobj.syncobj, "pickle")
    with pytest.raises(ConfigError, match=r"metastore\.secret is required"):
        RaftLog(StateMachine(tmp_path / "s.db"), f"127.0.0.1:{free_port()}", [f"127.0.0.1:{free_port()}"],
                tmp_path / "raft", secret="")
    raftwire.install()
    assert raftwire.installed()


def test_a_frame_sealed_with_another_secret_is_refused_and_rotation_accepts_both() -> None:
    old, new = raftwire.cluster_encryptor("old-secret"), raftwire.cluster_encryptor("new-secret")
    with pytest.raises(InvalidToken):
        old.decrypt(new.encrypt(b"frame"))
    both = raftwire.cluster_encryptor("old-secret", ["new-secret"])
    assert both.decrypt(new.encrypt(b"frame")) == b"frame"
    assert old.decrypt(both.encrypt(b"frame")) == b"frame"  # seals with the first
    assert raftwire.peer_token("old-secret") != raftwire.peer_token("new-secret")
    assert "old-secret" not in raftwire.peer_token("old-secret")


def test_the_cluster_secret_rotates_one_node_at_a_time_without_losing_writes(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    new = "rotated-cluster-secret"
    written = 0

    def write() -> None:
        nonlocal written
        leader = cluster.leader(timeout=30)
        assert leader.propose(encode(AddBlocks(blocks=[meta(start=written * 10, end=written * 10 + 10)]))).ok
        written += 1
        cluster.settle(leader.barrier(), timeout=30)

    try:
        write()
        # Every connection seals its frames with the node's MultiFernet (pysyncobj's own password is unset).
        transport = cluster.leader().node._SyncObj__transport
        assert transport._connections
        assert all(isinstance(conn.encryptor, MultiFernet) for conn in transport._connections.values())
        for step in ((SECRET, [new]), (new, [SECRET]), (new, [])):
            for i in range(3):
                cluster.restart(i, *step)
                write()
        assert all(log is not None and log.state.reader.count_blocks() == written for log in cluster.logs)
        assert len({log.state.state_hash() for log in cluster.logs if log is not None}) == 1
    finally:
        cluster.close()
