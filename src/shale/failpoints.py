"""Failpoints: named places where a fault-injection test can stop or slow a real process at a dangerous moment.

Disabled unless ``SHALE_FAILPOINTS`` is set together with ``SHALE_FAILPOINT_DIR``. ``SHALE_FAILPOINTS`` is a
comma-separated list of ``name`` or ``name=action``:

* ``pause`` (the default): every process that reaches the failpoint writes ``<dir>/<name>.<pid>.paused`` and
  then blocks forever, so that the test can ``kill -9`` it exactly there.
* ``pause-once``: only the first process to reach it pauses (it claims ``<dir>/<name>.claimed`` with an exclusive
  create; every process sharing the directory sees the claim); the others pass. In a Spark job this stops one
  task: the test kills that task's executor, and Spark's rerun of the task passes the failpoint.
* ``sleep-once:SECONDS``: the first process to reach it writes its pause file, sleeps, then goes on: one slow
  task, for speculative execution.

Cost when disabled: one environment lookup.

Spark tasks read the variables in their executor's environment. ``executor_conf`` forwards the driver's to the
executors as ``spark.executorEnv.*`` (``shale.spark.spark_session`` adds it), so a failpoint enabled for a Shale
command also holds in the tasks it runs on a cluster. The directory must be one the executors can write: on one
machine (the tests' standalone cluster) it is the same folder.

The failpoints, where they are reached, and what a crash there tests:

* ``block.before-meta`` (block writer, in Spark tasks): a block's data objects are uploaded, its meta.json not yet.
* ``ingest.task`` (the ingest Spark task, first thing, before it reads a record or writes an object): a task of
  an ingest batch, mid-batch; with ``pause-once`` the test kills the executor running it, with ``sleep-once`` the
  task is slow and speculation starts a second attempt.
* ``ingest.before-commit`` / ``ingest.after-commit`` (the ingest driver): the batch's blocks are complete and the
  commit not sent / the commit is durable.
* ``compaction.merge`` (the compaction Spark task, when a merge starts, before it reads a source).
* ``erasure.rewrite`` / ``erasure.write`` (the compaction Spark task running an erase job): before it reads its
  source / after it filtered the rows, before the new block's first object is written.
* ``compaction.before-report`` (the compaction worker's driver): a merge finished, its success not yet reported.
* ``reprocess.after-round`` (the reprocess driver): a round is committed.
* ``restore.mid-transaction`` (the restore Spark task): after a committed transaction of this run, half of the
  next one is sent and not committed.
* ``restore.before-commit`` (the restore Spark task): after a committed transaction of this run, the next one's
  records and progress record are delivered to the broker and the transaction is not committed.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

ENV_NAMES = "SHALE_FAILPOINTS"
ENV_DIR = "SHALE_FAILPOINT_DIR"
ACTIONS = ("pause", "pause-once", "sleep-once")


def _enabled() -> dict[str, str]:
    out: dict[str, str] = {}
    for item in os.environ.get(ENV_NAMES, "").split(","):
        name, _, action = item.strip().partition("=")
        if name:
            out[name] = action.strip() or "pause"
    return out


def _claim(directory: Path, name: str) -> bool:
    """True for the first caller across every process sharing ``directory``."""
    try:
        os.close(os.open(directory / f"{name}.claimed", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def failpoint(name: str) -> None:
    """Act on the failpoint ``name`` if it is enabled (see the module docstring); otherwise return at once."""
    action = _enabled().get(name)
    if action is None:
        return
    directory = os.environ.get(ENV_DIR)
    if not directory:
        raise RuntimeError(f"failpoint {name} is enabled but {ENV_DIR} is not set")
    kind, _, argument = action.partition(":")
    if kind not in ACTIONS:
        raise RuntimeError(f"failpoint {name}: unknown action {action!r}; use one of {', '.join(ACTIONS)}")
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    if kind != "pause" and not _claim(folder, name):
        return
    Path(folder, f"{name}.{os.getpid()}.paused").write_text(str(time.time()))
    if kind == "sleep-once":
        time.sleep(float(argument or "0"))
        return
    while True:
        time.sleep(3600)


def paused(directory: Path, name: str) -> list[Path]:
    """The pause files of ``name`` written so far (for tests waiting for a process to reach it)."""
    return sorted(directory.glob(f"{name}.*.paused"))


def paused_pid(path: Path) -> int:
    """The process id a pause file names (``<name>.<pid>.paused``)."""
    return int(path.name.rsplit(".", 2)[1])


def executor_conf() -> dict[str, str]:
    """Spark settings that give executors the driver's failpoints (empty when none are enabled)."""
    return {f"spark.executorEnv.{key}": os.environ[key] for key in (ENV_NAMES, ENV_DIR) if os.environ.get(key)}
