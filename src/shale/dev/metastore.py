"""A real multi-process metastore cluster on loopback (for tests, benchmarks and local experiments)."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from shale.config import BucketConfig
from shale.errors import ServiceStartError
from shale.metastore.client import MetastoreClient
from shale.process import ManagedProcess, free_port

READY_TIMEOUT_S = 60.0


@dataclass
class MetastoreCluster:
    """``size`` nodes of ``shale metastore serve`` (1 = single node without Raft)."""

    directory: Path
    size: int = 3
    bucket: BucketConfig = field(default_factory=lambda: BucketConfig(url="memory://metastore-cluster"))
    secret: str = ""
    extra: list[str] = field(default_factory=list)
    http_ports: list[int] = field(default_factory=list)
    raft_ports: list[int] = field(default_factory=list)
    processes: list[ManagedProcess | None] = field(default_factory=list)

    @property
    def addresses(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.http_ports]

    def _command(self, i: int) -> list[str]:
        sets = [f"metastore.listen=127.0.0.1:{self.http_ports[i]}",
                f"metastore.data_dir={self.directory / f'node{i}'}",
                f"bucket.url={self.bucket.url}", f"bucket.endpoint={self.bucket.endpoint}",
                f"bucket.access_key_id={self.bucket.access_key_id}",
                f"bucket.secret_access_key={self.bucket.secret_access_key}",
                f"bucket.allow_http={'true' if self.bucket.allow_http else 'false'}", *self.extra]
        if self.size > 1:
            members = ", ".join(f'{{raft = "127.0.0.1:{r}", http = "http://127.0.0.1:{h}"}}'
                                for r, h in zip(self.raft_ports, self.http_ports, strict=True))
            sets += [f"metastore.raft_address=127.0.0.1:{self.raft_ports[i]}", f"metastore.members=[{members}]"]
            if self.secret:
                sets.append(f"metastore.secret={self.secret}")
        command = [sys.executable, "-m", "shale.cli", "--log-format", "json"]
        for s in sets:
            command += ["--set", s]
        return [*command, "metastore", "serve"]

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
        process = ManagedProcess(f"metastore-{i}", self._command(i), self.directory / f"node{i}.log")
        process.start()
        self.processes[i] = process
        if wait:
            self._wait_http(i)

    def _wait_http(self, i: int) -> None:
        process = self.processes[i]
        assert process is not None
        process.wait_ready(lambda: httpx.get(self.addresses[i] + "/healthz", timeout=1).status_code == 200,
                           READY_TIMEOUT_S, "serving HTTP")

    def client(self, timeout: float = 10.0, deadline: float = 60.0) -> MetastoreClient:
        return MetastoreClient(self.addresses, timeout=timeout, deadline=deadline)

    def leader(self) -> int | None:
        for i, address in enumerate(self.addresses):
            if self.processes[i] is None:
                continue
            try:
                status = httpx.get(address + "/v1/status", timeout=2).json()
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
        body: dict[str, Any] = httpx.get(self.addresses[i] + "/v1/status", timeout=5).json()
        return body

    def kill9(self, i: int) -> None:
        process = self.processes[i]
        if process is not None:
            process.kill9()
        self.processes[i] = None

    def state_hashes(self) -> list[tuple[str, int]]:
        out = []
        for i, address in enumerate(self.addresses):
            if self.processes[i] is None:
                continue
            body = httpx.get(address + "/v1/state-hash", timeout=10).json()
            out.append((body["hash"], body["applied_index"]))
        return out

    def stop(self) -> None:
        for process in self.processes:
            if process is not None:
                process.stop()
