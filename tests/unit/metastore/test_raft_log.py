"""The Raft log in one process (three pysyncobj nodes on loopback): order, entry terms, snapshots."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pysyncobj.transport import TCPTransport
from tests.unit.metastore.helpers import meta
from tests.waiting import eventually

from shale.errors import MetastoreUnavailableError, NotLeaderError
from shale.metastore import AddBlocks, Noop, RaftLog, StateMachine, encode
from shale.metastore.raft.log import LEADER_FALLBACK
from shale.metastore.rules.commands import PartitionKey, TruncateIndex
from shale.metastore.rules.fsm import Entry
from shale.process import free_port

SECRET = "unit-test-cluster-secret"


class Cluster:
    def __init__(self, root: Path, compaction: int = 20_000) -> None:
        self.root = root
        self.compaction = compaction
        self.addresses = [f"127.0.0.1:{free_port()}" for _ in range(3)]
        # Per node: the secret it seals with and the further secrets it accepts (a rotation changes these).
        self.secrets: list[tuple[str, list[str]]] = [(SECRET, [])] * 3
        self.logs: list[RaftLog | None] = [self._node(i) for i in range(3)]

    def _node(self, i: int) -> RaftLog:
        peers = [a for a in self.addresses if a != self.addresses[i]]
        state = StateMachine(self.root / f"n{i}" / "state.db")
        secret, accepted = self.secrets[i]
        return RaftLog(state, self.addresses[i], peers, self.root / f"n{i}" / "raft", secret=secret,
                       accepted_secrets=accepted, compaction_min_entries=self.compaction)

    def restart(self, i: int, secret: str, accepted: list[str]) -> None:
        log = self.logs[i]
        if log is not None:
            log.close()
            # The old node's tick thread is gone before the new node opens the same journal (two writers corrupt it).
            assert not log.node.tick_thread_alive()
            log.state.close()
        self.secrets[i] = (secret, accepted)
        self.logs[i] = self._node(i)

    def leader(self, timeout: float = 20) -> RaftLog:
        return eventually(lambda: next((log for log in self.logs if log is not None and log.is_leader()), None),
                          timeout, "a leader to be elected")

    def settle(self, index: int, timeout: float = 20) -> None:
        for log in self.logs:
            if log is not None:
                log.wait_applied(index, timeout)

    def close(self) -> None:
        for log in self.logs:
            if log is not None:
                log.close()


def propose_concurrently(leader: RaftLog, per_client: int, clients: int = 4) -> None:
    """``clients`` threads each propose ``per_client`` one-block ``AddBlocks`` to ``leader`` (partition = client)."""
    def propose(client: int) -> None:
        for i in range(per_client):
            leader.propose(encode(AddBlocks(blocks=[meta(partition=client, start=i, end=i + 1)])))

    proposers = [threading.Thread(target=propose, args=(c,)) for c in range(clients)]
    for t in proposers:
        t.start()
    for t in proposers:
        t.join()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    yield c
    c.close()


def test_replicas_apply_the_same_commands_in_the_same_order(cluster: Cluster) -> None:
    leader = cluster.leader()
    for i in range(20):
        assert leader.propose(encode(AddBlocks(blocks=[meta(start=i * 10, end=i * 10 + 10)]))).ok
    index = leader.barrier()
    cluster.settle(index)
    hashes = {log.state.state_hash() for log in cluster.logs if log is not None}
    assert len(hashes) == 1
    follower = next(log for log in cluster.logs if log is not None and log is not leader)
    assert follower.state.reader.count_blocks() == 20
    with pytest.raises(NotLeaderError) as info:
        follower.propose(encode(Noop()))
    assert info.value.leader == leader.self_address


def test_nothing_is_acknowledged_or_applied_before_it_is_on_disk(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A follower's acknowledgement leaves only for entries its journal has synced; a node (the leader, whose
    own copy counts towards the majority, or a follower) applies only synced entries."""
    early: list[str] = []
    acks: list[int] = []
    send = TCPTransport.send

    def checked_send(transport: Any, node: Any, message: Any) -> bool:
        if message.get("type") == "next_node_idx" and message.get("success"):
            synced = transport._syncObj._SyncObj__raftLog.synced_index
            acks.append(message["next_node_idx"] - 1)
            if message["next_node_idx"] - 1 > synced:
                early.append(f"acknowledged {message['next_node_idx'] - 1} with {synced} synced")
        return bool(send(transport, node, message))

    monkeypatch.setattr(TCPTransport, "send", checked_send)
    cluster = Cluster(tmp_path)
    try:
        for log in cluster.logs:
            assert log is not None
            journal, apply = log.node._SyncObj__raftLog, log.state.apply

            def checked_apply(entry: Entry, data: bytes, journal: Any = journal, apply: Any = apply) -> Any:
                if entry.index > journal.synced_index:
                    early.append(f"applied {entry.index} with {journal.synced_index} synced")
                return apply(entry, data)

            log.state.apply = checked_apply  # type: ignore[method-assign]
        leader = cluster.leader()
        propose_concurrently(leader, 25)
        cluster.settle(leader.barrier())
        assert all(log is not None and log.state.reader.count_blocks() == 100 for log in cluster.logs)
    finally:
        cluster.close()
    assert early == []
    assert max(acks) >= 100  # the check saw the acknowledgements of the entries proposed


def test_a_follower_keeps_the_entries_it_holds_when_the_leader_sends_them_again(tmp_path: Path) -> None:
    """Raft deletes a follower's entries only from the first one that conflicts with the leader's (same index,
    another term). The leader sends entries again all the time (each acknowledgement of an earlier message moves
    its next index for the follower back), so a follower that dropped and rewrote what it held had, many times a
    second, a journal without entries it had acknowledged. With one leader and no conflict, nothing is deleted."""
    deleted: list[str] = []
    cluster = Cluster(tmp_path)
    try:
        for i, log in enumerate(cluster.logs):
            assert log is not None
            journal = log.node._SyncObj__raftLog
            delete = journal.deleteEntriesFrom

            def recorded(position: int, journal: Any = journal, delete: Any = delete, i: int = i) -> None:
                if position < len(journal):
                    deleted.append(f"node {i} deleted entries {journal[position][1]}-{journal[-1][1]}")
                delete(position)

            journal.deleteEntriesFrom = recorded
        leader = cluster.leader()
        term = leader.status().term
        propose_concurrently(leader, 50)
        cluster.settle(leader.barrier())
        assert leader.is_leader()
        assert leader.status().term == term
        hashes = {log.state.state_hash() for log in cluster.logs if log is not None}
        assert len(hashes) == 1
    finally:
        cluster.close()
    assert deleted == []


def test_a_leader_cut_off_with_entries_of_its_own_catches_up_once_the_cut_heals(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The long partitions profile's leader-isolated scenario, in one process: the leader is cut off (every
    message to or from it lost) and appends entries nobody else has; the others elect a leader that commits more
    than one append message holds (pysyncobj's batches are 64 KiB); the cut heals. The old leader must drop its
    entries and take the new leader's. pysyncobj's leader sends all its batches at once and each of the
    follower's refusals sets its next index: the first refusal (a conflict at the follower's last entry) moved it
    back one entry, the next one (a later batch, past the follower's end) forward again, for ever."""
    cut: set[str] = set()
    send = TCPTransport.send

    def lossy(transport: Any, node: Any, message: Any) -> bool:
        if cut & {transport._selfNode.address, node.address}:
            return True  # lost on the way, as a cut link loses it
        return bool(send(transport, node, message))

    monkeypatch.setattr(TCPTransport, "send", lossy)
    cluster = Cluster(tmp_path)
    try:
        old = cluster.leader()
        assert old.propose(encode(AddBlocks(blocks=[meta(start=0, end=1)]))).ok
        cut.add(old.self_address)
        for i in range(3):  # entries of the old leader's term that nobody else gets
            with pytest.raises(MetastoreUnavailableError):
                old.propose(encode(AddBlocks(blocks=[meta(partition=9, start=i, end=i + 1)])), timeout=0.5)
        new = eventually(lambda: next((log for log in cluster.logs if log is not None and log is not old
                                       and log.is_leader()), None), 20, "the others to elect a leader")
        for i in range(40):  # about 200 KiB of entries: more than one append message
            assert new.propose(encode(AddBlocks(blocks=[
                meta(partition=1, start=i * 50 + j, end=i * 50 + j + 1) for j in range(50)]))).ok
        cut.clear()
        index = new.barrier()
        old.wait_applied(index, 30)
        hashes = {log.state.state_hash() for log in cluster.logs if log is not None}
        assert len(hashes) == 1
        assert old.state.reader.count_blocks() == 1 + 40 * 50  # the cut-off entries are gone
    finally:
        cluster.close()


def test_commands_see_the_entry_term_and_stale_plans_are_rejected(cluster: Cluster) -> None:
    leader = cluster.leader()
    term = leader.status().term
    assert term >= 1
    key = PartitionKey(tenant="acme", shard=0, window_start=0)
    cutoffs = {"acme": 2**53}
    stale = leader.propose(encode(TruncateIndex(prepared_term=term - 1, cutoffs=cutoffs, partitions=[key])))
    assert stale.reason == "stale-term"
    assert leader.propose(encode(TruncateIndex(prepared_term=term, cutoffs=cutoffs, partitions=[key]))).ok
    # Every replica reached the same verdicts from the entries' own terms.
    cluster.settle(leader.barrier())
    assert len({log.state.state_hash() for log in cluster.logs if log is not None}) == 1


def test_a_follower_that_lost_its_disk_catches_up_from_a_snapshot(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, compaction=30)
    try:
        leader = cluster.leader()
        lost = next(i for i, log in enumerate(cluster.logs) if log is not leader)
        for i in range(80):
            leader.propose(encode(AddBlocks(blocks=[meta(start=i * 10, end=i * 10 + 10)])))
        lost_log = cluster.logs[lost]
        assert lost_log is not None
        lost_log.close()
        cluster.logs[lost] = None
        shutil.rmtree(tmp_path / f"n{lost}")
        for i in range(80, 160):
            leader.propose(encode(AddBlocks(blocks=[meta(start=i * 10, end=i * 10 + 10)])))
        leader.node.forceLogCompaction()
        snapshot = tmp_path / f"n{cluster.addresses.index(leader.self_address)}" / "raft" / "raft.snapshot"
        eventually(snapshot.exists, 30, f"the leader's snapshot {snapshot}")
        cluster.logs[lost] = cluster._node(lost)
        index = leader.barrier()
        cluster.settle(index, timeout=30)
        restored = cluster.logs[lost]
        assert restored is not None
        assert restored.state.reader.count_blocks() == 160
        assert restored.state.state_hash() == leader.state.state_hash()
    finally:
        cluster.close()


def test_a_leader_cut_off_from_its_majority_steps_down_and_refuses_at_once(cluster: Cluster) -> None:
    """``LEADER_FALLBACK``: a leader that hears from no follower steps down within a few seconds (pysyncobj's
    default is 30 s), so a client asking it is told at once to look elsewhere instead of waiting its timeout."""
    leader = cluster.leader()
    assert leader.propose(encode(Noop())).ok
    for i, log in enumerate(cluster.logs):
        if log is not None and log is not leader:
            log.close()
            cluster.logs[i] = None
    eventually(lambda: not leader.is_leader(), 4 * LEADER_FALLBACK, "the cut-off leader to step down")
    with pytest.raises(NotLeaderError):
        leader.propose(encode(Noop()), timeout=LEADER_FALLBACK)
