"""Starting, watching and stopping service processes: ``shale run``'s supervised processes and the development
services (Kafka, MinIO, Spark standalone, metastore nodes).

Each process runs in its own session, so stopping it stops its whole process group (a JVM's children included).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from shale.errors import ServiceStartError

_log = logging.getLogger(__name__)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that is free right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_open(port: int, host: str = "127.0.0.1", timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def log_tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log written)"


def pid_alive(pid: int) -> bool:
    if pid <= 1:  # kill(0) and kill(-1) address a group, not a process; 1 is init, never one of ours
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0); reap it if it is ours.
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        return True


def stop_process_group(pid: int, timeout: float = 15.0) -> None:
    """SIGTERM the process group led by ``pid``, then SIGKILL what is left after ``timeout``.

    Refuses ``pid`` 1 or less (ValueError) before signalling anything: ``killpg(1, sig)`` is ``kill(-1, sig)``,
    which signals every process the caller may signal (for root, the whole machine), and ``killpg(0, sig)`` the
    caller's own group. A pid read from a damaged or hand-written state file must never do that."""
    if pid <= 1:
        raise ValueError(f"refusing to stop process group {pid}: not a process group Shale started")
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not pid_alive(pid):
                return
            time.sleep(0.1)


@dataclass
class ManagedProcess:
    """One service process in its own session (so that ``down`` can kill everything it started)."""

    name: str
    command: Sequence[str]
    log_path: Path
    env: Mapping[str, str] | None = None
    cwd: Path | None = None
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        assert self.popen is not None, "process not started"
        return self.popen.pid

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.popen = subprocess.Popen(
                list(self.command),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=dict(self.env) if self.env is not None else None,
                cwd=self.cwd,
                start_new_session=True,
            )

    def wait_ready(self, check: Callable[[], bool], timeout: float, what: str) -> None:
        """Poll ``check`` until it is true; on timeout or early exit raise ``ServiceStartError``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen is not None and self.popen.poll() is not None:
                raise self.start_error(f"exited with status {self.popen.returncode} before it was {what}")
            try:
                if check():
                    return
            except Exception as exc:  # readiness probes fail in many ways until the service is up
                _log.debug("%s not ready yet: %s", self.name, exc)
            time.sleep(0.25)
        self.stop()
        raise self.start_error(f"was not {what} within {timeout:.0f}s")

    def start_error(self, problem: str) -> ServiceStartError:
        return ServiceStartError(
            f"{self.name} {problem}.\ncommand: {' '.join(self.command)}\n"
            f"log ({self.log_path}), last lines:\n{log_tail(self.log_path)}"
        )

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill9(self) -> None:
        """SIGKILL the whole process group at once: the fault-injection tests' crash."""
        if self.popen is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait()

    def stop(self, timeout: float = 15.0) -> None:
        if self.popen is None:
            return
        stop_process_group(self.popen.pid, timeout)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=timeout)
