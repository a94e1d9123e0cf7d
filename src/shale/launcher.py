"""``shale run``: a whole single-machine deployment from one configuration, supervised.

Processes: the metastore (``shale metastore serve``, which also serves the status page), one ``shale ingest`` per
configured group, and the compaction workers. The others reach the metastore over HTTP. The foreground ingest
groups start beside the metastore (their client retries until it serves; their Spark application starts
meanwhile); the background services (the backup group and the compaction workers, ``BACKGROUND_NICE``) start
once the partition group holds its ingest lease, or after ``FOREGROUND_WAIT``: Spark applications that start at
once share the cores, and three of them on two cores each took 2-3 times as long to start as one alone
(docs/design/operating.md, "`shale run`"), so the group that queries read started last of all.
``run.services`` selects which of them this machine runs (docs/DEPLOY.md): a machine without the metastore uses
the configuration's remote metastore nodes.
Each runs in its own process group; one that dies is restarted after ``run.restart_delay``. SIGTERM or SIGINT
stops everything in reverse order (SIGTERM, then SIGKILL after a grace period) and leaves no process behind.

Secrets never go on a child's command line: each ingest group and compaction worker gets a token of its own
(role ingest for its group, role compactor; only where this machine runs the metastore, else they use the
configured ``metastore.token_file``) in a 0600 file under ``<metastore.data_dir>/run/``, which the
metastore accepts through a tokens file there that also carries the configured ``metastore.tokens_file``'s
entries (kept in step while running). A secret given to ``shale run`` with ``--set`` reaches the children through
their environment instead.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from shale.config import ShaleConfig
from shale.errors import ConfigError, ShaleError
from shale.logs import register_secrets
from shale.metastore import tls_verify
from shale.metastore.api import auth
from shale.process import ManagedProcess, free_port

log = logging.getLogger(__name__)


BACKGROUND_NICE = 10
"""How much lower the CPU priority of the backup group and the compaction workers is in ``shale run``: when the
machine is busy, the partition group (what queries read) gets the cores first, so its batches and the latency
from produce to query stay short; the background services get every core the partition group leaves idle, and
their work is the same, only later (the backup group's records wait in Kafka, within its retention).

Each service is a session of its own (its process group is stopped as one), and where Linux groups a session's
processes for the scheduler (``/proc/sys/kernel/sched_autogroup_enabled``, on by default in many distributions) a
process's nice value weighs only against the other processes of its session: the whole session's autogroup gets
the same nice value (``lower_autogroup_priority``). Without it the background services took as much of the cores
as the partition group: a full topic of 1,000,000 records over 256 partitions reached the partition group's last
commit in 33 s, and in 25 s once their autogroups had the lower priority (docs/design/ingest.md 10.9)."""


def lower_autogroup_priority(pid: int, nice: int) -> bool:
    """Give the scheduler autogroup of ``pid``'s session the nice value ``nice`` (sched(7), "The autogroup
    feature"); False where the kernel has no autogroups or refuses (then the per-process nice value stands)."""
    try:
        Path(f"/proc/{pid}/autogroup").write_text(f"{nice}\n")
    except OSError as exc:
        log.debug("the session's autogroup keeps its priority", extra={"pid": pid, "error": str(exc)})
        return False
    return True


FOREGROUND_WAIT = 120.0
"""How long ``shale run`` waits for the partition group's lease (its Spark application started, its warm-up done)
before starting the background services anyway (a group that cannot start must not hold the others back)."""


@dataclass
class Service:
    name: str
    args: list[str]
    metrics: str
    token: auth.TokenEntry | None = None  # the role this service's token carries (none for the metastore)
    background: bool = False  # runs at a lower CPU priority (BACKGROUND_NICE)
    process: ManagedProcess | None = None
    restarts: int = 0


@dataclass
class Deployment:
    config: ShaleConfig
    base_args: list[str]
    log_dir: Path
    secret_env: Mapping[str, str] = field(default_factory=dict)  # secrets given with --set, for the children
    services: list[Service] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        run, m = self.config.run, self.config.metastore
        http = f"{'https' if m.tls_cert_file else 'http'}://{m.listen}"
        self.run_dir = Path(m.data_dir) / "run"
        self.tokens_file = self.run_dir / "tokens.toml"
        self._configured_stamp: tuple[int, int] | None = None
        self.local_metastore = "metastore" in run.services
        remote: list[str] = []  # without a local metastore, the configuration's metastore section is used as is
        self.status_page = f"{m.addresses[0]}/ui"
        if self.local_metastore:
            remote = ["--set", "metastore.mode=remote", "--set", f'metastore.addresses=["{http}"]']
            self.services.append(Service("metastore", ["--set", f"metastore.tokens_file={self.tokens_file}",
                                                       "metastore", "serve"], f"{http}/metrics"))
            self.status_page = f"{http}/ui"
        elif m.mode != "remote":
            raise ConfigError("run.services does not start the metastore here, so metastore.mode must be "
                              "'remote' with metastore.addresses naming the metastore nodes")
        base = run.metrics_base_port
        ports = iter(range(base, base + 1000)) if base else iter(free_port, None)
        for group in run.ingest_groups if "ingest" in run.services else []:
            for i in range(run.ingest_processes):  # one holds each free shard, the others wait as standbys
                port = next(ports)
                name = f"ingest-{group}" + (f"-{i}" if i else "")
                self.services.append(self._child(name, "ingest", [group], [
                    *remote, "--set", f"ingest.metrics_port={port}", "ingest", "--group", group], port,
                    background=group == "backup"))
        for i in range(run.compaction_workers if "compaction" in run.services else 0):
            port = next(ports)
            self.services.append(self._child(f"compact-{i}", "compactor", [], [
                *remote, "--set", f"compaction.metrics_port={port}", "compact"], port, background=True))

    def _child(self, name: str, role: str, groups: list[str], args: list[str], port: int,
               background: bool = False) -> Service:
        metrics = f"http://127.0.0.1:{port}/metrics"
        if not self.local_metastore:  # the remote metastore's tokens: the configured token (metastore.token_file)
            return Service(name, args, metrics, background=background)
        token_file = self.run_dir / f"{name}.token"
        entry = auth.TokenEntry(name=f"run-{name}", role=role, groups=groups,  # type: ignore[arg-type]
                                sha256="0" * 64)
        return Service(name, ["--set", f"metastore.token_file={token_file}", *args], metrics, entry,
                       background=background)

    def issue_tokens(self) -> None:
        """A fresh token per child (0600 files), and the metastore's tokens file: the children's digests plus the
        configured tokens file's entries."""
        for service in self.services:
            if service.token is not None:
                token = auth.new_token()
                register_secrets([token])
                auth.write_private(self.run_dir / f"{service.name}.token", token + "\n")
                service.token = service.token.model_copy(update={"sha256": auth.digest(token)})
        self.sync_tokens(force=True)

    def sync_tokens(self, force: bool = False) -> None:
        """Rewrite the metastore's tokens file when the configured one changed (the metastore re-reads it), so
        tokens issued or revoked while `shale run` runs take effect as they would without it."""
        configured = Path(self.config.metastore.tokens_file) if self.config.metastore.tokens_file else None
        stamp = None
        if configured is not None:
            st = configured.stat()
            stamp = (st.st_mtime_ns, st.st_size)
        if not force and stamp == self._configured_stamp:
            return
        entries = auth.load_tokens(configured) if configured is not None else []
        entries += [s.token for s in self.services if s.token is not None]
        auth.write_private(self.tokens_file, "".join(auth.format_entry(e) + "\n" for e in entries))
        self._configured_stamp = stamp

    def _environment(self) -> dict[str, str]:
        # A token the operator exported for their own CLI must not replace a child's own, narrower one.
        own = ("SHALE_METASTORE__TOKEN", "SHALE_METASTORE__TOKEN_FILE") if self.local_metastore else ()
        env = {k: v for k, v in os.environ.items() if k not in own}
        return {**env, **self.secret_env}

    def _start(self, service: Service) -> None:
        nice = ["nice", "-n", str(BACKGROUND_NICE)] if service.background else []
        command = [*nice, sys.executable, "-m", "shale.cli", *self.base_args, *service.args]
        service.process = ManagedProcess(service.name, command, self.log_dir / f"{service.name}.log",
                                         env=self._environment())
        service.process.start()
        if service.background:
            lower_autogroup_priority(service.process.pid, BACKGROUND_NICE)
        self._write_manifest()
        log.info("started", extra={"service": service.name, "pid": service.process.pid, "log":
                                   str(service.process.log_path)})

    def _write_manifest(self) -> None:
        """``<log dir>/deployment.json``: each service's pid, metrics endpoint and log (for operators and tests)."""
        manifest = {"status_page": self.status_page, "services": {
            s.name: {"pid": s.process.pid if s.process else None, "metrics": s.metrics,
                     "log": str(self.log_dir / f"{s.name}.log")} for s in self.services}}
        (self.log_dir / "deployment.json").write_text(json.dumps(manifest, indent=2))

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self.local_metastore:
            self.issue_tokens()
        health = self.status_page.removesuffix("/ui") + "/healthz"
        for service in [s for s in self.services if not s.background]:
            self._start(service)
        metastore = next((s for s in self.services if s.name == "metastore"), None)
        if metastore is not None:  # started: the deployment is up once it serves
            assert metastore.process is not None
            with httpx.Client(timeout=1, verify=tls_verify(self.config.metastore.tls_ca_file)) as http:
                metastore.process.wait_ready(lambda: http.get(health).status_code == 200, 60, "serving HTTP")

    def start_background(self) -> None:
        """The background services, once a foreground ingest process holds its lease (not if stopped meanwhile)."""
        background = [s for s in self.services if s.background]
        if not background:
            return
        started = time.monotonic()
        why = self.wait_for_foreground_lease(FOREGROUND_WAIT)
        log.info("starting the background services", extra={
            "services": [s.name for s in background], "after": why,
            "waited_seconds": round(time.monotonic() - started, 1)})
        if why == "stopped":
            return
        for service in background:
            self._start(service)

    def wait_for_foreground_lease(self, timeout: float, poll: float = 0.25) -> str:
        """Wait until a foreground ingest process holds its lease (``shale_ingest_lease_held`` 1 on its metrics
        endpoint): "lease"; or until none is left ("none": none configured, or all exited), the deployment was
        stopped ("stopped"), or ``timeout`` passed ("timeout")."""
        ingest = [s for s in self.services if s.name.startswith("ingest-") and not s.background]
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=1) as http:
            while any(s.process is not None and s.process.alive() for s in ingest):
                for service in ingest:
                    try:
                        if lease_held(http.get(service.metrics).text):
                            return "lease"
                    except httpx.HTTPError:
                        pass  # not serving metrics yet
                if time.monotonic() > deadline:
                    return "timeout"
                if self.stop.wait(poll):
                    return "stopped"
        return "none"

    def supervise(self, poll: float = 1.0) -> None:
        """Restart processes that die, until stopped; keep the metastore's tokens file in step."""
        while not self.stop.wait(poll):
            try:
                if self.local_metastore:
                    self.sync_tokens()
            except (OSError, ShaleError) as exc:
                log.error("could not re-read metastore.tokens_file; the tokens loaded before stay",
                          extra={"error": str(exc)})
            for service in self.services:
                process = service.process
                if process is None or process.alive():
                    continue
                code = process.popen.returncode if process.popen else None
                log.error("process exited; restarting", extra={"service": service.name, "code": code,
                                                               "restarts": service.restarts + 1})
                if self.stop.wait(self.config.run.restart_delay):
                    return
                service.restarts += 1
                self._start(service)

    def shutdown(self, grace: float = 30.0) -> None:
        self.stop.set()
        for service in reversed(self.services):
            if service.process is not None:
                service.process.stop(timeout=grace)
                log.info("stopped", extra={"service": service.name})


def lease_held(metrics: str) -> bool:
    """Whether an ingest process's metrics (Prometheus text) say it holds its shard's lease."""
    return any(sample.name == "shale_ingest_lease_held" and sample.value == 1
               for family in text_string_to_metric_families(metrics) for sample in family.samples)


def run_deployment(config: ShaleConfig, base_args: list[str], log_dir: Path,
                   secret_env: Mapping[str, str] | None = None) -> Deployment:
    deployment = Deployment(config, base_args, log_dir, secret_env or {})

    def on_signal(signum: int, _: object) -> None:
        log.info("shutting down", extra={"signal": signum})
        deployment.stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        deployment.start()
        print(f"status page: {deployment.status_page}", flush=True)
        for service in deployment.services:
            print(f"{service.name}: metrics {service.metrics}, log {log_dir / (service.name + '.log')}", flush=True)
        deployment.start_background()
        deployment.supervise()
    finally:
        deployment.shutdown()
    return deployment

