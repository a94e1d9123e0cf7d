"""The command log: a single-node log (the embedded default, no network) or a Raft log through pysyncobj.

Both give every command an index, a term and the leader's timestamp, and apply it to the state machine in
log order. ``propose`` blocks until the command is applied and returns its result. ``barrier`` commits a
no-op and returns the applied index after it: once it returns, every write acknowledged before the call is
visible to reads on this node (the read barrier of linearizable reads).
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from cryptography.fernet import MultiFernet
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, SyncObjException, replicated
from pysyncobj import pickle as raft_pickle
from pysyncobj.transport import TCPTransport

from shale.errors import CommandRejectedError, ConfigError, MetastoreUnavailableError, NotLeaderError, ShaleError
from shale.metastore.raft import journal, raftwire
from shale.metastore.rules import Command, Entry, Noop, Result, StateMachine, decode, encode

log = logging.getLogger(__name__)
SNAPSHOT_MAGIC = b"SHALESNAP1"
ELECTION_TIMEOUT = (1.0, 2.5)
"""A follower that hears nothing from a leader for a random time in this range (seconds) asks to be elected.
pysyncobj's default, 0.4-1.4 s, is shorter than the pauses of a Python leader under load: its heartbeats go out from
one thread that shares the GIL with the HTTP threads, the applier and the bucket-index writer, and on the 2-core
machine a 3-node cluster under 4 clients of 500-block commands paused them for 0.3-0.6 s again and again
(measured on the leader: each tick's socket wait of 20 ms took that long to get the GIL back). Followers then
elected a new leader 10-25 times a minute (20-52 role changes in 35-60 s runs), each election a pause of every
request; with this range, 2-11 role changes in a run (six runs), 2 of them the first election
(docs/design/metastore.md).
The price: a dead leader is replaced 1-2.5 s after its last heartbeat instead of 0.4-1.4 s. etcd and
hashicorp/raft (Pyroscope's) wait 1 s by default."""
LEADER_FALLBACK = ELECTION_TIMEOUT[1] + 1.0
"""A leader that has had no answer from a majority for this long steps down (pysyncobj's ``leaderFallbackTimeout``,
30 s by default). Cut off from its followers, it would otherwise go on calling itself the leader for 30 s while the
majority elects another: every request sent to it waits for its timeout, and two nodes report ``role: leader``.
Once it has stepped down it answers at once that it knows no leader, and a client tries the next node. Above the
followers' longest election timeout, so that a slow but connected cluster elects no more often than its followers
already make it; well under an ingest lease (15 s by default, ``ingest.lease_duration``): a holder's renewal is due
every third of a lease and must land within the two thirds left, so the renewals that follow the one a cut-off
leader swallowed reach the new leader in time (the partition tests' 5 s lease leaves 3.3 s, against 3.5 s here:
their clients give up on a node after 3 s and try the next)."""


@dataclass
class LogStatus:
    role: str  # "leader", "follower", "candidate" or "single"
    leader: str | None  # the leader's Raft address (None when unknown)
    term: int
    applied_index: int
    commit_index: int
    members: list[str] = field(default_factory=list)
    has_quorum: bool = True


class CommandLog(Protocol):
    def propose(self, data: bytes, timeout: float) -> Result: ...

    def propose_command(self, command: Command, timeout: float) -> Result:
        """Propose a validated command. The Raft log encodes it; the single-node log applies it as it is."""
        ...

    def barrier(self, timeout: float) -> int: ...

    def status(self) -> LogStatus: ...


class SingleNodeLog:
    """Term 1 forever; each command gets the next index inside the state's write transaction, so several
    processes sharing one state file on one host still agree on the order."""

    def __init__(self, state: StateMachine, clock: Callable[[], float] = time.time) -> None:
        self.state = state
        self.clock = clock

    def propose(self, data: bytes, timeout: float = 30.0) -> Result:
        try:
            command = decode(data)
        except CommandRejectedError as exc:
            return Result(ok=False, reason=exc.reason, message=str(exc))
        return self.propose_command(command, timeout)

    def propose_command(self, command: Command, timeout: float = 30.0) -> Result:
        return self.state.apply_next(1, int(self.clock() * 1000), command)

    def barrier(self, timeout: float = 30.0) -> int:
        # One process applies synchronously: everything acknowledged is already visible.
        return self.state.applied()[0]

    def status(self) -> LogStatus:
        index, _ = self.state.applied()
        return LogStatus("single", None, 1, index, index)


class _AckAfterSyncTransport(TCPTransport):  # type: ignore[misc]
    """pysyncobj's transport, except that a follower's acknowledgements (``next_node_idx``) of journal entries not
    yet on disk are held back: the node's next tick syncs the journal once and sends them all (group commit)."""

    def __init__(self, syncobj: Any, self_node: Any, other_nodes: Any) -> None:
        super().__init__(syncobj, self_node, other_nodes)
        self.held: list[tuple[Any, Any]] = []

    def send(self, node: Any, message: Any) -> bool:
        if message.get("type") == "next_node_idx" and (self.held or _journal_dirty(self._syncObj)):
            self.held.append((node, message))
            return True
        return bool(super().send(node, message))

    def release(self) -> None:
        held, self.held = self.held, []
        for node, message in held:
            super().send(node, message)


def _journal_dirty(node: Any) -> bool:
    raft_journal = node._SyncObj__raftLog
    return isinstance(raft_journal, journal.DurableJournal) and raft_journal.dirty


class _Applier:
    """Applies committed entries to the state on a thread of its own, in log order. pysyncobj applies them on its
    tick thread, the one that also sends the leader's heartbeats and reads the followers' answers: a command of 500
    blocks took 0.04 s to apply alone but 0.3-3.6 s on a loaded 3-node cluster (the GIL shared with the HTTP
    threads), longer than the election timeout, so followers elected one leader after another (tens of elections a
    minute, requests waiting up to 16 s, once a minute with no leader; issue 44). The tick now only queues an entry;
    a proposer waits for its result (``result``), and a snapshot waits until the state has caught up (``drain``).
    The journal stays the truth: entries queued but not applied when a node stops are applied again by its replay
    (the state skips those it holds)."""

    KEPT = 10_000
    """Results kept for proposers (the oldest dropped first): a follower's entries have none waiting."""

    def __init__(self, state: StateMachine) -> None:
        self.state = state
        self._queue: deque[tuple[Entry, bytes]] = deque()
        self._results: OrderedDict[int, Result] = OrderedDict()
        self._cond = threading.Condition()
        self._busy = False
        self._failed: BaseException | None = None
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="raft-apply", daemon=True)
        self._thread.start()

    def submit(self, entry: Entry, data: bytes) -> None:
        with self._cond:
            self._queue.append((entry, data))
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if not self._queue:
                    return
                entry, data = self._queue.popleft()
                self._busy = True
            try:
                result = self.state.apply(entry, data)
            except BaseException as exc:  # the state cannot move past this entry: stop applying, say so
                log.critical("the metastore state could not apply a committed entry; this node applies nothing "
                             "more until it restarts", extra={"index": entry.index}, exc_info=True)
                with self._cond:
                    self._failed, self._busy = exc, False
                    self._cond.notify_all()
                return
            with self._cond:
                self._results[entry.index] = result
                while len(self._results) > self.KEPT:
                    self._results.popitem(last=False)
                self._busy = False
                self._cond.notify_all()

    def _check(self) -> None:
        if self._failed is not None:
            raise MetastoreUnavailableError(f"this node stopped applying entries: {self._failed!r}; restart it")

    def result(self, index: int, timeout: float) -> Result | None:
        """The result of entry ``index`` once applied (None after ``timeout`` seconds)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while index not in self._results:
                self._check()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)
            return self._results.pop(index)

    def drain(self) -> None:
        """Wait until every queued entry is applied (the state is at pysyncobj's last applied entry)."""
        with self._cond:
            while (self._queue or self._busy) and self._failed is None:
                self._cond.wait()
            self._check()

    def close(self) -> None:
        """Apply what is queued, then stop the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout=60)


def held_entries_skipped(held: Sequence[Any], message: dict[str, Any]) -> dict[str, Any]:
    """The leader's message without the entries this node already holds.

    pysyncobj's follower deletes every entry after the message's ``prevLogIdx`` before it appends the
    message's entries, also those it holds already; Raft deletes only from the first entry that conflicts (the
    same index, another term). The leader sends entries again all the time: its next index for a follower goes
    back with each acknowledgement of an earlier message, and its heartbeats point there. So a follower deleted
    and rewrote entries it had synced and acknowledged tens of times a second, and a crash in between lost
    entries the leader had counted towards a majority (76 deletions in 200 proposals, none of them needed).

    The message handed to pysyncobj starts after the entries this node holds with the same index and term.
    When it holds all of them and its own last entry is of the leader's term, that entry is in the leader's log
    (Raft's log matching: every entry up to it is too), so the message points there: nothing is deleted and
    the acknowledgement says all it holds. A conflict still goes to pysyncobj's deletion, as Raft wants; so
    do entries of an older term past the message (Raft would keep them until one conflicts, but pysyncobj
    would then count them as the leader's when it acknowledges and commits)."""
    if not len(held):
        return message
    first, last = int(held[0][1]), int(held[-1][1])
    prev, prev_term = int(message["prevLogIdx"]), message["prevLogTerm"]
    if not first <= prev <= last or held[prev - first][2] != prev_term:
        return message  # pysyncobj answers that it cannot append here
    entries = list(message.get("entries", []))
    skip = 0
    for _command, idx, term in entries:
        if idx > last or held[idx - first][2] != term:
            break
        skip, prev, prev_term = skip + 1, idx, term
    if skip == len(entries) and prev < last and held[-1][2] == message["term"]:
        prev, prev_term = last, held[-1][2]
    if prev == message["prevLogIdx"]:
        return message
    return {**message, "prevLogIdx": prev, "prevLogTerm": prev_term, "entries": entries[skip:]}


class _RaftNode(SyncObj):  # type: ignore[misc]
    """The pysyncobj object. Its one replicated method carries our command bytes and the leader's clock.

    Durability: every tick first syncs the journal (one fdatasync for all the entries appended since the last
    one), then sends the acknowledgements held until then, then runs pysyncobj's tick. A leader counts its own copy
    of an entry towards a majority in that tick, after the sync; a follower acknowledges only after it; votes and
    the term reach the disk inside the journal's ``setCurrentTerm``, before pysyncobj sends anything. The same sync
    runs again at the end of each tick, before it waits for messages: the leader's fdatasync of the entries it
    has just sent then overlaps with the followers' work on them instead of following it."""

    def __init__(self, applier: _Applier, self_address: str, peers: list[str], conf: SyncObjConf,
                 encryptor: MultiFernet) -> None:
        self._applier = applier
        self._shale_encryptor = encryptor
        self._refused: dict[Any, tuple[int, int]] = {}
        """Per follower, the term and the lowest next index a refusal named since its last acceptance."""
        super().__init__(self_address, peers, conf, transportClass=_AckAfterSyncTransport)
        self.addOnTickCallback(self._sync_journal)  # pysyncobj calls these last in a tick, before its poll

    def _sync_journal(self) -> None:
        raft_journal = self._SyncObj__raftLog
        if isinstance(raft_journal, journal.DurableJournal):
            raft_journal.sync()
        transport = self._SyncObj__transport
        if isinstance(transport, _AckAfterSyncTransport):
            transport.release()

    def _onTick(self, timeToWait: float = 0.0) -> None:  # noqa: N802,N803 - pysyncobj's names
        self._sync_journal()
        super()._onTick(timeToWait)

    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:  # noqa: N802 - pysyncobj's name
        kind = message.get("type")
        if kind == "append_entries" and "prevLogIdx" in message and "transmission" not in message:
            message = held_entries_skipped(self._SyncObj__raftLog, message)
        elif kind == "next_node_idx":
            message = self._refusals_only_go_back(node, message)
        super()._SyncObj__onMessageReceived(node, message)

    def _refusals_only_go_back(self, node: Any, message: dict[str, Any]) -> dict[str, Any]:
        """A follower's refusal of an append moves the leader's next index for it back, never forward past an
        earlier refusal of this term, until the follower accepts one.

        pysyncobj's leader sends all the batches from its next index for a follower at once, and each refusal
        sets that index to what the follower names: its own last index + 1 when the append starts past its end,
        the append's ``prevLogIdx`` when the entry there conflicts. A follower with entries of its own (a leader
        cut off, then back) refused the first batch at the conflict and every later batch past its end, so the
        index went back one entry and forward again, for ever: the node never caught up (the long partitions
        profile; ``test_a_leader_cut_off_with_entries_of_its_own_catches_up_once_the_cut_heals``). Raft goes back
        until the logs match."""
        term = self.raftCurrentTerm
        if message.get("success"):
            self._refused.pop(node, None)
            return message
        if not message.get("reset"):
            return message
        refused = self._refused.get(node)
        if refused is not None and refused[0] == term and message["next_node_idx"] > refused[1]:
            return {**message, "next_node_idx": refused[1]}
        self._refused[node] = (term, message["next_node_idx"])
        return message

    @property
    def encryptor(self) -> MultiFernet:
        # pysyncobj's transport seals and opens every frame with this (it reads the property for each connection).
        # Ours is a MultiFernet, so a node can accept a second secret during a rotation; pysyncobj's own password
        # option allows one secret only and is left unset.
        return self._shale_encryptor

    def _getEncryptor(self) -> MultiFernet:  # noqa: N802 - pysyncobj's name
        return self._shale_encryptor

    @replicated  # type: ignore[untyped-decorator]
    def apply_command(self, data: bytes, time_ms: int) -> int:
        """Queue the committed entry for the applier (``_Applier``); the proposer gets its index."""
        index = int(self.raftLastApplied) + 1
        self._applier.submit(Entry(index, self._entry_term(index), time_ms), data)
        return index

    def _entry_term(self, index: int) -> int:
        # The term of the entry being applied (not the node's current term, which is newer when a restarted
        # node replays its journal). pysyncobj keeps it private; this is the one place that reaches for it,
        # and tests/unit/metastore/test_raft_log.py checks it.
        entries = self._SyncObj__getEntries(index, 1)
        return int(entries[0][2]) if entries else int(self.raftCurrentTerm)

    def leader_address(self) -> str | None:
        leader = self._getLeader()
        return None if leader is None else str(leader.address)


class RaftLog:
    """A member of a 3- or 5-node Raft cluster. Snapshots are SQLite backups of the state. Every frame is sealed
    with the cluster secret and unpickled without code (see raftwire.py); the port binds ``bind`` (default: the
    node's own address)."""

    def __init__(self, state: StateMachine, self_address: str, peers: list[str], data_dir: Path,
                 secret: str, clock: Callable[[], float] = time.time,
                 compaction_min_entries: int = 20_000, accepted_secrets: Sequence[str] = (), bind: str = "") -> None:
        if not secret:
            raise ConfigError(
                "metastore.secret is required for a multi-node metastore (metastore.raft_address is set): without "
                "it the Raft port would accept unauthenticated frames. Give every member the same long random "
                "secret through $SHALE_METASTORE__SECRET or the config file, never on a command line.")
        raftwire.install()
        journal.install()
        self.state = state
        self.clock = clock
        self.self_address = self_address
        journal.durable_directory(data_dir)
        self._snapshot_db = data_dir / "snapshot.db"
        conf = SyncObjConf(
            journalFile=str(data_dir / "raft.log"),
            fullDumpFile=str(data_dir / "raft.snapshot"),
            serializer=self._serialize,
            deserializer=self._deserialize,
            bindAddress=bind or None,
            logCompactionMinEntries=compaction_min_entries,
            logCompactionMinTime=300,
            dynamicMembershipChange=False,
            commandsWaitLeader=False,
            appendEntriesUseBatch=False,
            raftMinTimeout=ELECTION_TIMEOUT[0],
            raftMaxTimeout=ELECTION_TIMEOUT[1],
            leaderFallbackTimeout=LEADER_FALLBACK,
            connectionRetryTime=1.0,
            useFork=False,
            autoTickPeriod=0.02,
            onStateChanged=self._role_changed,
        )
        self.applier = _Applier(state)  # before the node: its first tick may replay the journal or load a snapshot
        self.node = _RaftNode(self.applier, self_address, peers, conf,
                              raftwire.cluster_encryptor(secret, accepted_secrets))

    def _role_changed(self, old: int, new: int) -> None:
        """Log each change of this node's Raft role (pysyncobj's tick thread): a leader stepping down after
        ``LEADER_FALLBACK``, elections, a new leader. Repeated changes mean an unstable cluster."""
        roles = {0: "follower", 1: "candidate", 2: "leader"}
        node = getattr(self, "node", None)
        log.info(f"raft role: {roles.get(old, old)} -> {roles.get(new, new)}",
                 extra={"node": self.self_address, "term": getattr(node, "raftCurrentTerm", None)})

    # -- snapshots: pysyncobj's custom serializer hooks ---------------------------------------------

    def _serialize(self, filename: str, raft_data: Any) -> None:
        """Write the snapshot file: our header, pysyncobj's own bookkeeping (its log entries and members, never
        client data), then a SQLite backup of the state at exactly the last applied entry."""
        self.applier.drain()
        self.state.backup_to(self._snapshot_db)
        header = raft_pickle.dumps(raft_data)
        with open(filename, "wb") as out:
            out.write(SNAPSHOT_MAGIC + struct.pack(">Q", len(header)) + header)
            out.write(self._snapshot_db.read_bytes())
            out.flush()
            os.fsync(out.fileno())  # the journal drops the entries it holds once it is renamed into place
        self._snapshot_db.unlink(missing_ok=True)

    def _deserialize(self, filename: str) -> Any:
        with open(filename, "rb") as source:
            if source.read(len(SNAPSHOT_MAGIC)) != SNAPSHOT_MAGIC:
                raise ShaleError(f"{filename} is not a Shale Raft snapshot")
            (size,) = struct.unpack(">Q", source.read(8))
            # The file may have come from the leader over the network: its header is unpickled without code.
            raft_data = raftwire.snapshot_loads(source.read(size))
            db = source.read()
        snapshot_index = int(raft_data[0][1])
        self.applier.drain()
        if self.state.applied()[0] < snapshot_index:
            # The local state is older than the snapshot (a new or lagging member): replace it. A local state
            # at or past the snapshot is kept: it holds only committed entries, and replay skips them.
            self._snapshot_db.write_bytes(db)
            self.state.restore_from(self._snapshot_db)
            self._snapshot_db.unlink(missing_ok=True)
            log.info("restored state from snapshot", extra={"index": snapshot_index})
        return raft_data

    # -- the log ------------------------------------------------------------------------------------

    def is_leader(self) -> bool:
        return bool(self.node._isLeader())

    def propose(self, data: bytes, timeout: float = 30.0) -> Result:
        if not self.is_leader():
            raise NotLeaderError(f"{self.self_address} is not the Raft leader", leader=self.node.leader_address())
        result: list[Any] = []
        done = threading.Event()

        def callback(res: Any, err: int) -> None:
            result.extend([res, err])
            done.set()

        deadline = time.monotonic() + timeout
        self.node.apply_command(data, int(self.clock() * 1000), callback=callback)
        if not done.wait(timeout):
            raise MetastoreUnavailableError(
                f"command not applied within {timeout:.0f}s (no quorum?); it may still be applied later: commands "
                "are idempotent, so retrying is safe")
        res, err = result
        if err == FAIL_REASON.SUCCESS:
            applied = self.applier.result(int(res), max(0.0, deadline - time.monotonic()))
            if applied is None:
                raise MetastoreUnavailableError(
                    f"command committed at index {res} but not applied within {timeout:.0f}s; it will be: commands "
                    "are idempotent, so retrying is safe")
            return applied
        if err in (FAIL_REASON.NOT_LEADER, FAIL_REASON.MISSING_LEADER, FAIL_REASON.LEADER_CHANGED,
                   FAIL_REASON.DISCARDED):
            raise NotLeaderError(f"leadership changed while applying (reason {err}); retry on the new leader",
                                 leader=self.node.leader_address())
        raise MetastoreUnavailableError(f"Raft refused the command (pysyncobj reason {err}); retry later")

    def propose_command(self, command: Command, timeout: float = 30.0) -> Result:
        return self.propose(encode(command), timeout)

    def barrier(self, timeout: float = 30.0) -> int:
        result = self.propose(encode(Noop()), timeout)
        return int(result.data.get("index", self.state.applied()[0]))

    def wait_applied(self, index: int, timeout: float) -> None:
        """Wait until this node has applied ``index`` (the follower half of a read-index read)."""
        deadline = time.monotonic() + timeout
        while self.state.applied()[0] < index:
            if time.monotonic() > deadline:
                raise MetastoreUnavailableError(f"this node has not applied index {index} within {timeout:.0f}s")
            time.sleep(0.005)

    def status(self) -> LogStatus:
        raw = self.node.getStatus()
        state = {0: "follower", 1: "candidate", 2: "leader"}.get(int(raw.get("state", 0)), "follower")
        leader = raw.get("leader")
        return LogStatus(state, None if leader is None else str(getattr(leader, "address", leader)),
                         int(raw.get("raft_term", 0)),
                         self.state.applied()[0], int(raw.get("commit_idx", 0)),
                         sorted([self.self_address, *(str(n) for n in self.node.otherNodes)]),
                         bool(raw.get("has_quorum", False)))

    def close(self) -> None:
        """Stop the node and wait for its tick thread. pysyncobj's destroy() only flags the thread, which goes on
        appending to the journal until it notices; a node reopened on the same journal meanwhile (a restart in the
        same process) would write the file through two mappings and corrupt it."""
        with contextlib.suppress(SyncObjException):  # already stopped
            self.node.destroy()
        thread = getattr(self.node, "_SyncObj__thread", None)
        if isinstance(thread, threading.Thread) and thread is not threading.current_thread():
            thread.join(timeout=30)
        self.applier.close()  # after the tick thread: nothing more is queued
