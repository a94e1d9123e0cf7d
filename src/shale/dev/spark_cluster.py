"""A real Spark standalone cluster on loopback, from the pyspark package: one master and N workers, each its own JVM.

The master listens on 127.0.0.1; worker ``i`` on 127.0.0.``i+2`` (every 127.x address is loopback on Linux), so
that Spark sees one host per worker, as on separate machines: speculative attempts, which Spark never starts on a
host already running the task, and executor loss behave as on a real cluster. Each worker offers bounded cores
and memory, keeps its executors' work directories under the cluster folder, and binds with ``SPARK_LOCAL_IP`` (no
loopback-hostname warning). Ready when the master's ``/json/`` status lists every worker ALIVE.

``kill9_worker`` kills a worker with its executors and their Python workers, as losing the machine would.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shale.dev.fetch import spark_connector_jars
from shale.errors import ServiceStartError
from shale.process import ManagedProcess, free_port

READY_TIMEOUT_S = 90.0
MASTER_HOST = "127.0.0.1"
DAEMON_MEMORY = "256m"  # the master's and workers' own heap; executors get the worker's --memory


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def worker_host(i: int) -> str:
    return f"127.0.0.{i + 2}"


def connector_conf() -> dict[str, str]:
    """``spark.jars`` with the cached Kafka connector jars (fetched if missing): for tests, benchmarks and the demo,
    which must not resolve packages from Maven Central at every start."""
    return {"spark.jars": ",".join(str(p) for p in spark_connector_jars())}


def driver_conf() -> dict[str, str]:
    """A driver on this machine, reachable by the cluster's executors on loopback."""
    return {"spark.driver.host": MASTER_HOST, "spark.driver.bindAddress": MASTER_HOST}


def _parent(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[1])  # the name field may hold spaces; fields after it do not


def _pgid(pid: int) -> int:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return 0


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            children.setdefault(_parent(int(entry.name)), []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - loopback URL we built
        return json.loads(response.read())


@dataclass
class SparkStandalone:
    """A master and ``workers`` workers with ``cores`` cores and ``memory`` each, run from ``home`` (a Spark
    distribution's folder; default: the installed pyspark's, the driver's own Spark)."""

    directory: Path
    home: Path | None = None
    workers: int = 2
    cores: int = 1
    memory: str = "1g"
    port: int = 0
    ui_port: int = 0
    master: ManagedProcess | None = None
    worker_processes: list[ManagedProcess | None] = field(default_factory=list)

    @property
    def master_url(self) -> str:
        return f"spark://{MASTER_HOST}:{self.port}"

    @property
    def ui_url(self) -> str:
        return f"http://{MASTER_HOST}:{self.ui_port}"

    def _env(self, host: str) -> dict[str, str]:
        env = dict(os.environ, SPARK_HOME=str(self.home or spark_home()), SPARK_LOCAL_IP=host,
                   SPARK_DAEMON_MEMORY=DAEMON_MEMORY, SPARK_LOG_DIR=str(self.directory / "logs"),
                   SPARK_NO_DAEMONIZE="1")
        for name in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SHALE_FAILPOINTS", "SHALE_FAILPOINT_DIR"):
            env.pop(name, None)  # executors get these from each application, never from the worker's environment
        return env

    def _spark_class(self) -> str:
        return str((self.home or spark_home()) / "bin" / "spark-class")

    def start(self, timeout: float = READY_TIMEOUT_S) -> SparkStandalone:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port(MASTER_HOST)
        self.ui_port = self.ui_port or free_port(MASTER_HOST)
        command = [self._spark_class(), "org.apache.spark.deploy.master.Master", "--host", MASTER_HOST,
                   "--port", str(self.port), "--webui-port", str(self.ui_port)]
        self.master = ManagedProcess("spark-master", command, self.directory / "master.log", env=self._env(MASTER_HOST))
        self.master.start()
        self.master.wait_ready(lambda: self.status().get("status") == "ALIVE", timeout, "ALIVE (GET /json/)")
        self.worker_processes = [None] * self.workers
        try:
            for i in range(self.workers):
                self.start_worker(i, wait=False)
            self.wait_workers(timeout)
        except ServiceStartError:
            self.stop()
            raise
        return self

    def start_worker(self, i: int, wait: bool = True, timeout: float = READY_TIMEOUT_S) -> None:
        host = worker_host(i)
        command = [self._spark_class(), "org.apache.spark.deploy.worker.Worker", "--host", host,
                   "--webui-port", str(free_port(host)), "--cores", str(self.cores), "--memory", self.memory,
                   "--work-dir", str(self.directory / f"worker{i}"), self.master_url]
        process = ManagedProcess(f"spark-worker-{i}", command, self.directory / f"worker{i}.log", env=self._env(host))
        process.start()
        self.worker_processes[i] = process
        if wait:
            self.wait_workers(timeout)

    def status(self) -> dict[str, Any]:
        """The master's status document (``/json/``): workers, their state, cores, running applications."""
        result: dict[str, Any] = _get_json(f"{self.ui_url}/json/")
        return result

    def alive_hosts(self) -> set[str]:
        try:
            workers = self.status().get("workers", [])
        except OSError:
            return set()
        return {w["host"] for w in workers if w.get("state") == "ALIVE"}

    def wait_workers(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Wait until every running worker process is registered with the master and ALIVE."""
        deadline = time.monotonic() + timeout
        while True:
            expected = {worker_host(i) for i, p in enumerate(self.worker_processes) if p is not None}
            for process in self.worker_processes:
                if process is not None and not process.alive():
                    code = process.popen.returncode if process.popen else "?"
                    raise process.start_error(f"exited with status {code} before it registered with the master at "
                                              f"{self.master_url}")
            if expected <= self.alive_hosts():
                return
            if time.monotonic() > deadline:
                names = ", ".join(p.name for p in self.worker_processes if p is not None)
                raise ServiceStartError(f"spark workers ({names}) did not register with the master at "
                                        f"{self.master_url} within {timeout:.0f}s; master log: "
                                        f"{self.directory / 'master.log'}, worker logs: {self.directory}/worker*.log")
            time.sleep(0.25)

    def worker_of(self, pid: int) -> int | None:
        """The worker that ``pid`` (an executor, or one of its Python workers) descends from."""
        roots = {p.pid: i for i, p in enumerate(self.worker_processes) if p is not None and p.alive()}
        while pid > 1:
            if pid in roots:
                return roots[pid]
            pid = _parent(pid)
        return None

    def kill9_worker(self, i: int) -> None:
        """SIGKILL worker ``i``, its executors and their Python workers at once: the machine is lost. (PySpark's
        daemon puts the Python workers in a process group of their own, so each group is killed.)"""
        process = self.worker_processes[i]
        if process is not None and process.alive():
            groups = {process.pid} | {g for p in _descendants(process.pid) if (g := _pgid(p))}
            for group in groups:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(group, signal.SIGKILL)
            process.kill9()
        self.worker_processes[i] = None

    def ensure_workers(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Restart workers that are not running (after a fault test) and wait until all are registered."""
        for i, process in enumerate(self.worker_processes):
            if process is None or not process.alive():
                self.start_worker(i, wait=False)
        self.wait_workers(timeout)

    def processes(self) -> list[ManagedProcess]:
        return [p for p in [self.master, *self.worker_processes] if p is not None]

    def stop(self) -> None:
        for process in reversed(self.processes()):
            process.stop()
