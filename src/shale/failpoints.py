"""Failpoints: named places where a fault-injection test can stop a real process at a dangerous moment.

Disabled unless ``SHALE_FAILPOINTS`` is set (a comma-separated list of names) together with
``SHALE_FAILPOINT_DIR``. When a listed failpoint is reached, the process writes ``<dir>/<name>.<pid>.paused``
and then blocks forever, so that the test can ``kill -9`` it exactly there. Cost when disabled: one dict lookup.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def _enabled() -> frozenset[str]:
    names = os.environ.get("SHALE_FAILPOINTS", "")
    return frozenset(n.strip() for n in names.split(",") if n.strip())


def failpoint(name: str) -> None:
    """Pause here forever if the failpoint ``name`` is enabled (the test then kills the process)."""
    if name not in _enabled():
        return
    directory = os.environ.get("SHALE_FAILPOINT_DIR")
    if not directory:
        raise RuntimeError(f"failpoint {name} is enabled but SHALE_FAILPOINT_DIR is not set")
    Path(directory).mkdir(parents=True, exist_ok=True)
    Path(directory, f"{name}.{os.getpid()}.paused").write_text(str(time.time()))
    while True:
        time.sleep(3600)


def paused(directory: Path, name: str) -> list[Path]:
    """The pause files of ``name`` written so far (for tests waiting for a process to reach it)."""
    return sorted(directory.glob(f"{name}.*.paused"))
