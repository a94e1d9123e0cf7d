"""A real multi-process metastore cluster on loopback (for tests, benchmarks and local experiments).

Secrets never appear on the nodes' command lines: the cluster secret and the bucket key reach each node through
its environment, and API tokens through a tokens file of digests (``tokens.toml`` in the cluster directory). The
cluster issues itself an admin token for its own calls; ``issue_token`` adds others (nodes re-read the file).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from shale.config import BucketConfig
from shale.errors import ServiceStartError
from shale.metastore import MetastoreClient, tls_verify
from shale.metastore.api import auth
from shale.process import ManagedProcess, free_port

READY_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class TlsFiles:
    """PEM files for HTTPS: the nodes' certificate and key, and the CA clients verify them against."""

    cert: Path
    key: Path
    ca: Path


@dataclass
class MetastoreCluster:
    """``size`` nodes of ``shale metastore serve`` (1 = single node without Raft). ``secret`` None draws a random
    cluster secret; "" starts the nodes without one (a multi-node cluster then refuses to start)."""

    directory: Path
    size: int = 3
    bucket: BucketConfig = field(default_factory=lambda: BucketConfig(url="memory://metastore-cluster"))
    secret: str | None = None
    extra: list[str] = field(default_factory=list)
    tls: TlsFiles | None = None
    http_ports: list[int] = field(default_factory=list)
    raft_ports: list[int] = field(default_factory=list)
    processes: list[ManagedProcess | None] = field(default_factory=list)
    admin_token: str = field(default="", repr=False)
    hosts: list[str] = field(default_factory=list)
    """Node i's address (default loopback): where it listens and its peers reach it."""
    wrappers: list[list[str]] = field(default_factory=list)
    """Node i's command prefix (``ip netns exec NS``: a node in a network namespace of its own)."""
    data_root: Path | None = None
    """Where the nodes' data directories lie (``node<i>`` in it); default ``directory``. The power-loss test puts
    them on its own filesystem, and the logs and tokens file stay in ``directory``."""
    environment: dict[str, str] = field(default_factory=dict)
    """More variables for the nodes' environment."""

    def __post_init__(self) -> None:
        if self.secret is None:
            self.secret = secrets.token_urlsafe(32)
        self.tokens_file = self.directory / "tokens.toml"
        if not self.admin_token:
            self.admin_token = self.issue_token("cluster-admin", "admin")

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def addresses(self) -> list[str]:
        return [f"{self.scheme}://{self.host(i)}:{p}" for i, p in enumerate(self.http_ports)]

    def host(self, i: int) -> str:
        return self.hosts[i] if self.hosts else "127.0.0.1"

    def issue_token(self, name: str, role: str, groups: Sequence[str] = (), tenants: Sequence[str] = ()) -> str:
        """Add a token to the cluster's tokens file and return it (running nodes pick it up within a second)."""
        token = auth.new_token()
        entry = auth.TokenEntry(name=name, role=role, groups=list(groups), tenants=list(tenants),  # type: ignore[arg-type]
                                sha256=auth.digest(token))
        existing = auth.load_tokens(self.tokens_file) if self.tokens_file.exists() else []
        auth.write_private(self.tokens_file, "".join(auth.format_entry(e) + "\n" for e in [*existing, entry]))
        return token

    def _command(self, i: int) -> list[str]:
        sets = [f"metastore.listen={self.host(i)}:{self.http_ports[i]}",
                f"metastore.data_dir={(self.data_root or self.directory) / f'node{i}'}",
                f"metastore.tokens_file={self.tokens_file}",
                f"bucket.url={self.bucket.url}", f"bucket.endpoint={self.bucket.endpoint}",
                f"bucket.access_key_id={self.bucket.access_key_id}",
                f"bucket.allow_http={'true' if self.bucket.allow_http else 'false'}", *self.extra]
        if self.tls:
            sets += [f"metastore.tls_cert_file={self.tls.cert}", f"metastore.tls_key_file={self.tls.key}",
                     f"metastore.tls_ca_file={self.tls.ca}"]
        if self.size > 1:
            members = ", ".join(f'{{raft = "{self.host(j)}:{r}", http = "{address}"}}' for j, (r, address) in
                                enumerate(zip(self.raft_ports, self.addresses, strict=True)))
            sets += [f"metastore.raft_address={self.host(i)}:{self.raft_ports[i]}", f"metastore.members=[{members}]"]
        command = [sys.executable, "-m", "shale.cli", "--log-format", "json"]
        for s in sets:
            command += ["--set", s]
        return [*(self.wrappers[i] if self.wrappers else []), *command, "metastore", "serve"]

    def _environment(self) -> dict[str, str]:
        """The nodes' environment: this process's, plus the secrets (which must never be on a command line)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SHALE_METASTORE__")}
        env.update(self.environment)
        env["SHALE_BUCKET__SECRET_ACCESS_KEY"] = self.bucket.secret_access_key.get_secret_value()
        if self.size > 1 and self.secret:
            env["SHALE_METASTORE__SECRET"] = self.secret
        return env

    def start(self) -> MetastoreCluster:
        self.http_ports = self.http_ports or [free_port() for _ in range(self.size)]
        self.raft_ports = self.raft_ports or [free_port() for _ in range(self.size)]
        self.processes = [None] * self.size
        for i in range(self.size):
            self.start_node(i, wait=False)
        for i in range(self.size):
            self._wait_http(i)
        self.wait_leader()
        return self

    def start_node(self, i: int, wait: bool = True) -> None:
        process = ManagedProcess(f"metastore-{i}", self._command(i), self.directory / f"node{i}.log",
                                 env=self._environment())
        process.start()
        self.processes[i] = process
        if wait:
            self._wait_http(i)

    def _http(self, timeout: float = 10.0) -> httpx.Client:
        return httpx.Client(timeout=timeout, headers={"authorization": f"Bearer {self.admin_token}"},
                            verify=tls_verify(str(self.tls.ca) if self.tls else ""))

    def _wait_http(self, i: int) -> None:
        process = self.processes[i]
        assert process is not None
        with self._http(timeout=1) as http:
            process.wait_ready(lambda: http.get(self.addresses[i] + "/healthz").status_code == 200,
                               READY_TIMEOUT_S, "serving HTTP")

    def client(self, timeout: float = 10.0, deadline: float = 60.0, token: str | None = None) -> MetastoreClient:
        """A client with the cluster's admin token (or ``token``)."""
        return MetastoreClient(self.addresses, timeout=timeout, deadline=deadline,
                               token=self.admin_token if token is None else token,
                               ca_file=str(self.tls.ca) if self.tls else "")

    def leader(self) -> int | None:
        with self._http(timeout=2) as http:
            for i, address in enumerate(self.addresses):
                if self.processes[i] is None:
                    continue
                try:
                    status = http.get(address + "/v1/status").json()
                except (httpx.HTTPError, ValueError):
                    continue
                if status.get("role") in ("leader", "single"):
                    return i
        return None

    def wait_leader(self, timeout: float = READY_TIMEOUT_S) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            leader = self.leader()
            if leader is not None:
                return leader
            time.sleep(0.1)
        raise ServiceStartError(f"the metastore cluster elected no leader within {timeout:.0f}s; logs in "
                                f"{self.directory}")

    def stop_node(self, i: int) -> None:
        """Stop node ``i`` gracefully (SIGTERM, as ``systemctl stop`` does): one step of a rolling restart."""
        process = self.processes[i]
        if process is not None:
            process.stop()
        self.processes[i] = None

    def status(self, i: int) -> dict[str, Any]:
        """Node ``i``'s ``/v1/status`` (role, leader, term, applied index)."""
        with self._http(timeout=5) as http:
            body: dict[str, Any] = http.get(self.addresses[i] + "/v1/status").json()
        return body

    def kill9_all(self) -> None:
        """SIGKILL every node at once (all signals sent before waiting for any): a power cut's end of the
        processes."""
        running = [p for p in self.processes if p is not None and p.popen is not None]
        for process in running:
            assert process.popen is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.popen.pid, signal.SIGKILL)
        for process in running:
            process.kill9()
        self.processes = [None] * self.size

    def kill9(self, i: int) -> None:
        process = self.processes[i]
        if process is not None:
            process.kill9()
        self.processes[i] = None

    def state_hashes(self) -> list[tuple[str, int]]:
        out = []
        with self._http() as http:
            for i, address in enumerate(self.addresses):
                if self.processes[i] is None:
                    continue
                body = http.get(address + "/v1/state-hash").json()
                out.append((body["hash"], body["applied_index"]))
        return out

    def content_hashes(self) -> list[str]:
        """Every live node's hash of the index content alone: a leader election's no-op entry moves the applied
        index (and so ``state_hashes``) but not this."""
        with self._http() as http:
            return [http.get(address + "/v1/state-hash").json()["content_hash"]
                    for i, address in enumerate(self.addresses) if self.processes[i] is not None]

    def stop(self) -> None:
        for process in self.processes:
            if process is not None:
                process.stop()
