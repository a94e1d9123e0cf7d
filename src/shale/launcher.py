"""``shale run``: a whole single-machine deployment from one configuration, supervised.

Processes, in start order: the metastore (``shale metastore serve``, which also serves the status page), one
``shale ingest`` per configured group, and the compaction workers. The others reach the metastore over HTTP.
``run.services`` selects which of them this machine runs (docs/DEPLOY.md): a machine without the metastore uses
the configuration's remote metastore nodes.
Each runs in its own process group; one that dies is restarted after ``run.restart_delay``. SIGTERM or SIGINT
stops everything in reverse order (SIGTERM, then SIGKILL after a grace period) and leaves no process behind.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from shale.config import ShaleConfig
from shale.errors import ConfigError
from shale.process import ManagedProcess, free_port

log = logging.getLogger(__name__)


@dataclass
class Service:
    name: str
    args: list[str]
    metrics: str
    process: ManagedProcess | None = None
    restarts: int = 0


@dataclass
class Deployment:
    config: ShaleConfig
    base_args: list[str]
    log_dir: Path
    services: list[Service] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        run, m = self.config.run, self.config.metastore
        remote: list[str] = []  # without a local metastore, the configuration's metastore section is used as is
        self.status_page = f"{m.addresses[0]}/ui"
        if "metastore" in run.services:
            http = f"http://{m.listen}"
            remote = ["--set", "metastore.mode=remote", "--set", f'metastore.addresses=["{http}"]']
            self.services.append(Service("metastore", ["metastore", "serve"], f"{http}/metrics"))
            self.status_page = f"{http}/ui"
        elif m.mode != "remote":
            raise ConfigError("run.services does not start the metastore here, so metastore.mode must be "
                              "'remote' with metastore.addresses naming the metastore nodes")
        base = run.metrics_base_port
        ports = iter(range(base, base + 1000)) if base else iter(free_port, None)
        for group in run.ingest_groups if "ingest" in run.services else []:
            port = next(ports)
            self.services.append(Service(f"ingest-{group}", [*remote, "--set", f"ingest.metrics_port={port}",
                                                             "ingest", "--group", group],
                                         f"http://127.0.0.1:{port}/metrics"))
        for i in range(run.compaction_workers if "compaction" in run.services else 0):
            port = next(ports)
            self.services.append(Service(f"compact-{i}", [*remote, "--set", f"compaction.metrics_port={port}",
                                                          "compact"], f"http://127.0.0.1:{port}/metrics"))

    def _start(self, service: Service) -> None:
        command = [sys.executable, "-m", "shale.cli", *self.base_args, *service.args]
        service.process = ManagedProcess(service.name, command, self.log_dir / f"{service.name}.log")
        service.process.start()
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
        health = f"http://{self.config.metastore.listen}/healthz"
        for service in self.services:
            self._start(service)
            if service.name == "metastore":  # the others need it: wait until it serves
                assert service.process is not None
                service.process.wait_ready(lambda: httpx.get(health, timeout=1).status_code == 200, 60,
                                           "serving HTTP")

    def supervise(self, poll: float = 1.0) -> None:
        """Restart processes that die, until stopped."""
        while not self.stop.wait(poll):
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


def run_deployment(config: ShaleConfig, base_args: list[str], log_dir: Path) -> Deployment:
    deployment = Deployment(config, base_args, log_dir)

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
        deployment.supervise()
    finally:
        deployment.shutdown()
    return deployment

