"""One metastore process (``shale metastore serve``), and the two ways to reach a metastore: ``open_metastore``
for writers (the embedded service over a writable state, or a client) and ``open_index_view`` for readers (a
read-only view of the embedded state, or a client)."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import uvicorn
from prometheus_client import Gauge

from shale.bucketindex import BucketIndexWriter
from shale.config import MetastoreConfig, ShaleConfig
from shale.errors import ConfigError, MetastoreUnavailableError, NotLeaderError
from shale.logs import register_secrets
from shale.metastore.api import auth
from shale.metastore.api.client import MetastoreClient, tls_verify
from shale.metastore.api.http import create_app
from shale.metastore.api.maintenance import Maintenance
from shale.metastore.api.reads import IndexReads, read_only_index
from shale.metastore.api.service import MetastoreService
from shale.metastore.raft import CommandLog, RaftLog, SingleNodeLog, peer_token
from shale.metastore.rules import StateMachine
from shale.objstore import open_bucket

log = logging.getLogger(__name__)
STATE_FILE = "state.db"
RAFT_ROLE = Gauge("shale_metastore_raft_leader", "1 on the Raft leader (or a single node), 0 elsewhere.")
RAFT_TERM = Gauge("shale_metastore_raft_term", "The node's current Raft term.")
APPLIED = Gauge("shale_metastore_applied_index", "The last log index applied to the state.")
HAS_LEADER = Gauge("shale_metastore_raft_has_leader", "1 when this node knows a leader with a quorum, else 0.")
JOBS = Gauge("shale_compaction_jobs", "Compaction jobs by status and level.", ["status", "level"])
LEASES = Gauge("shale_ingest_lease_holders", "1 while a live driver holds the shard's ingest lease, 0 when it "
               "expired or was released (nobody writes the shard).", ["group", "generation", "shard"])
QUEUED = Gauge("shale_compaction_queue_blocks", "Blocks waiting to be planned into a job, by level.", ["level"])
SETTING = Gauge("shale_config_seconds", "Configured durations alert rules compare against: block_sync_delay, "
                "block_delete_delay, bucket_index_max_stale_period.", ["setting"])


def state_path(config: ShaleConfig) -> Path:
    return Path(config.metastore.data_dir) / STATE_FILE


def client_token(m: MetastoreConfig) -> str:
    """This process's API token: ``metastore.token``, else the file ``metastore.token_file``, else the local
    admin token of a single-node metastore on this host (``<data_dir>/admin.token``) when it is readable, else
    none (calls are then refused with 401 and a message that says what to configure)."""
    token = m.token.get_secret_value()
    if not token and m.token_file:
        token = auth.read_token_file(Path(m.token_file), "metastore.token_file")
    if not token:
        local = Path(m.data_dir) / auth.LOCAL_ADMIN_TOKEN
        if local.exists():
            token = auth.read_token_file(local, "the local admin token")
    register_secrets([token])
    return token


def open_index_view(config: ShaleConfig) -> IndexReads:
    """What a reader reads through: a read-only view of the embedded state (it never creates one: a missing state
    is a ``ConfigError``), or a client of the remote metastore. Commands that change nothing use this."""
    if config.metastore.mode == "embedded":
        return read_only_index(state_path(config), timeout=config.metastore.query_timeout)
    return remote_client(config.metastore)


def open_metastore(config: ShaleConfig) -> MetastoreService | MetastoreClient:
    """For writers: the embedded service (a local single-node state, created if missing, no network) or a
    client of remote nodes."""
    m = config.metastore
    if m.mode == "embedded":
        state = StateMachine(state_path(config))
        return MetastoreService(state, SingleNodeLog(state), compaction=config.compaction,
                                query_timeout=m.query_timeout)
    return remote_client(m)


def remote_client(m: MetastoreConfig, deadline: float | None = None) -> MetastoreClient:
    """A client of the remote metastore with this process's token and CA: every command builds its client here."""
    return MetastoreClient(m.addresses, timeout=m.request_timeout,
                           deadline=m.client_deadline if deadline is None else deadline,
                           token=client_token(m), ca_file=m.tls_ca_file)


def token_table(m: MetastoreConfig) -> tuple[auth.TokenTable, str]:
    """The tokens a node accepts, and a sentence for its start-up log line saying where they come from. A
    multi-node metastore takes them from ``metastore.tokens_file`` only; a single node also keeps a local admin
    token in its data directory, so that `shale metastore serve` and `shale run` work with no set-up and local
    clients with the same configuration find it."""
    secrets = [s.get_secret_value() for s in [m.secret, *m.accepted_secrets] if s.get_secret_value()]
    if m.raft_address and not m.tokens_file:
        raise ConfigError("metastore.tokens_file is required for a multi-node metastore (metastore.raft_address "
                          "is set): list the API tokens there (`shale metastore token create` writes entries)")
    table = auth.TokenTable(Path(m.tokens_file) if m.tokens_file else None)
    source = f"{len(table)} tokens from {m.tokens_file}" if m.tokens_file else "no tokens file"
    for secret in secrets:
        peer = peer_token(secret)
        table.add(peer, auth.Principal("metastore-peer", "peer"))
        register_secrets([peer])
    if not m.raft_address:
        path, token = auth.local_admin_token(Path(m.data_dir))
        table.add(token, auth.Principal("local-admin", "admin"))
        register_secrets([token])
        source += f"; local admin token in {path} (mode 0600) for clients on this host with this metastore.data_dir"
    return table, source


SHUTDOWN_GRACE = 1
"""Seconds a stopping node waits for requests in flight (an idle keep-alive connection, such as a browser's, is not
waited for)."""


class _Server(uvicorn.Server):
    """uvicorn's server, stopping on SIGTERM or SIGINT with a log line, then returning (uvicorn's own handlers
    re-raise the signal after the shutdown, which killed the process before ``close`` could log that it stopped)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, signum: int, _: object) -> None:
        if self.should_exit and signum == signal.SIGINT:
            self.force_exit = True  # a second Ctrl-C: do not wait for requests in flight
        if not self.should_exit:
            log.info("metastore stopping", extra={"signal": signal.Signals(signum).name})
        self.should_exit = True


class MetastoreNode:
    """A single node or one Raft member, its HTTP API, and (when leader) its maintenance loop."""

    def __init__(self, config: ShaleConfig) -> None:
        self.config = config
        m = config.metastore
        # The state, the journal and the local admin token are this user's alone.
        Path(m.data_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
        self.state = StateMachine(state_path(config))
        self.http_of = {member.raft: member.http.rstrip("/") for member in m.members}
        self.self_http = self.http_of.get(m.raft_address, f"http://{m.listen}")
        self.raft: RaftLog | None = None
        self.log: CommandLog
        self.tokens, self.token_source = token_table(m)
        if m.raft_address:
            peers = [member.raft for member in m.members if member.raft != m.raft_address]
            if not peers:
                raise MetastoreUnavailableError("metastore.raft_address is set but metastore.members lists no peers")
            self.raft = RaftLog(self.state, m.raft_address, peers, Path(m.data_dir) / "raft",
                                secret=m.secret.get_secret_value(),
                                accepted_secrets=[s.get_secret_value() for s in m.accepted_secrets],
                                compaction_min_entries=m.snapshot_entries, bind=m.raft_listen)
            self.log = self.raft
        else:
            self.log = SingleNodeLog(self.state)
        peer_headers = {"authorization": f"Bearer {peer_token(m.secret.get_secret_value())}"} \
            if m.raft_address else {}
        self._peer = httpx.Client(timeout=m.request_timeout, headers=peer_headers, verify=tls_verify(m.tls_ca_file))
        self.service = MetastoreService(self.state, self.log, linearize=self._linearize, timeout=m.request_timeout,
                                        compaction=config.compaction, query_timeout=m.query_timeout)
        self.app = create_app(self.service, self.leader_http, self.ready, self.barrier, self.tokens,
                              max_request_bytes=m.max_request_bytes)
        self.bucket = open_bucket(config.bucket)
        self.maintenance = Maintenance(self.service, self.bucket, config.retention, config.block.delete_delay,
                                       self.is_leader, lambda: self.log.status().term,
                                       sync_delay=config.block.sync_delay,
                                       erasure_delay_floor=config.erasure_delay_floor,
                                       write_deltas=config.bucket_index.deltas)
        self.index_writer = BucketIndexWriter(self.bucket, self.state.reader, config.bucket_index)
        self._stop = threading.Event()
        self.tasks: list[tuple[str, Callable[[threading.Event], None]]] = []
        """More leader background loops (name, loop until the event is set), started by ``serve``: the CLI adds the
        Iceberg publisher here, since it sits above the metastore in the layering."""
        SETTING.labels("block_sync_delay").set(config.block.sync_delay)
        SETTING.labels("block_delete_delay").set(config.block.delete_delay)
        SETTING.labels("bucket_index_max_stale_period").set(config.bucket_index.max_stale_period)

    def is_leader(self) -> bool:
        return self.raft is None or self.raft.is_leader()

    def leader_http(self) -> str | None:
        if self.raft is None:
            return self.self_http
        leader = self.raft.node.leader_address()
        return None if leader is None else self.http_of.get(leader)

    def ready(self) -> bool:
        if self.raft is None:
            return True
        status = self.raft.status()
        return status.leader is not None and status.has_quorum

    def barrier(self) -> int:
        return self.log.barrier(self.config.metastore.request_timeout)

    def _linearize(self, timeout: float) -> None:
        """Read-index: the leader commits a no-op; a follower gets that index from the leader and waits for it."""
        if self.raft is None:
            return
        if self.raft.is_leader():
            self.raft.barrier(timeout)
            return
        leader = self.leader_http()
        if leader is None:
            raise NotLeaderError("no Raft leader is known; reads that must be current wait for an election")
        try:
            response = self._peer.post(leader + "/v1/raft/barrier", json={})  # JSON: the API refuses other types
            response.raise_for_status()
        except httpx.HTTPError as exc:
            raise MetastoreUnavailableError(f"the leader {leader} did not answer a read barrier: {exc}") from exc
        self.raft.wait_applied(int(response.json()["index"]), timeout)

    def _watch(self) -> None:
        while not self._stop.wait(1.0):
            status = self.log.status()
            RAFT_ROLE.set(1 if status.role in ("leader", "single") else 0)
            RAFT_TERM.set(status.term)
            APPLIED.set(status.applied_index)
            HAS_LEADER.set(1 if self.raft is None or (status.leader and status.has_quorum) else 0)
            self._compaction_gauges()
            LEASES.clear()
            for lease in self.service.ingest_leases():
                LEASES.labels(lease["group"], str(lease["generation"]), str(lease["shard"])).set(
                    1 if lease["holder"] else 0)

    def _compaction_gauges(self) -> None:
        jobs: dict[tuple[str, str], int] = {}
        for job in self.service.compaction_jobs():
            key = (job["status"], str(job["level"]))
            jobs[key] = jobs.get(key, 0) + 1
        JOBS.clear()
        for (status, level), n in jobs.items():
            JOBS.labels(status, level).set(n)
        queued: dict[str, int] = {}
        for name, n in self.service.compaction_queue().items():
            level = name.rsplit("/L", 1)[1]
            queued[level] = queued.get(level, 0) + n
        QUEUED.clear()
        for level, n in queued.items():
            QUEUED.labels(level).set(n)

    def serve(self) -> None:
        """Serve until SIGTERM or SIGINT (uvicorn handles both), then stop cleanly."""
        m = self.config.metastore
        host, _, port = m.listen.rpartition(":")
        threads = [threading.Thread(target=self._watch, name="metastore-watch", daemon=True),
                   threading.Thread(target=self.maintenance.loop, name="metastore-maintenance", daemon=True,
                                    args=(self._stop, m.maintenance_interval, m.dlq_interval,
                                          m.bucket_scan_interval)),
                   threading.Thread(target=self.index_writer.loop, name="bucket-index-writer", daemon=True,
                                    args=(self._stop, self.config.bucket_index.debounce, self.is_leader)),
                   *(threading.Thread(target=task, name=name, daemon=True, args=(self._stop,))
                     for name, task in self.tasks)]
        for t in threads:
            t.start()
        tls = bool(m.tls_cert_file)
        log.info("metastore serving", extra={"http": f"{'https' if tls else 'http'}://{m.listen}",
                                             "raft": m.raft_listen or m.raft_address or "single node",
                                             "auth": self.token_source})
        try:
            # log_config None: uvicorn's lines go through Shale's handler (its format and secret redaction).
            _Server(uvicorn.Config(self.app, host=host, port=int(port), log_level="warning",
                                   access_log=False, log_config=None, timeout_graceful_shutdown=SHUTDOWN_GRACE,
                                   ssl_certfile=m.tls_cert_file or None,
                                   ssl_keyfile=m.tls_key_file or None)).run()
        finally:
            self.close()

    def close(self) -> None:
        self._stop.set()
        if self.raft is not None:
            self.raft.close()
        self._peer.close()
        log.info("metastore stopped")


