"""CPU seconds of process trees, from /proc: what a system started (its processes, their children, and children
that exited meanwhile) used between two snapshots.

A process's ``utime + stime`` counts its own threads; when a child exits and its parent waits for it, the child's
time moves into the parent's ``cutime + cstime``. So a tree's CPU at one moment is the sum, over its live members,
of both: a Spark Python worker that came and went between two snapshots is still counted, through the daemon
that reaped it. Not so for a child of a process that ignores SIGCHLD: the kernel reaps it at once and its time
goes nowhere. PySpark's daemon does (``signal(SIGCHLD, SIG_IGN)``), and Spark stops Python workers idle for a
minute, so a ``Window`` samples /proc every half second and adds, for each member that vanished under such a
parent, what it had used when last seen (its last half second is lost). A member reaped by a process outside the
tree (an orphan adopted by init) is lost too; Shale's services, Spark and the peers wait for their children.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

SIGCHLD_MASK = 1 << (17 - 1)
"""SIGCHLD (17 on Linux) in ``/proc/<pid>/status``'s ``SigIgn`` bit mask."""


@dataclass(frozen=True)
class Proc:
    parent: int
    command: str
    """The command line, cut at 300 characters."""
    own: float
    """CPU seconds of the process's own threads so far."""
    reaped: float
    """CPU seconds of its children that exited and were waited for (``cutime + cstime``)."""


@dataclass(frozen=True)
class Snapshot:
    at: float
    """``time.monotonic()`` when taken."""
    processes: Mapping[int, Proc]
    busy: float
    """CPU seconds the whole machine spent busy so far (user, nice, system, irq, softirq)."""
    ignore_children: frozenset[int] = frozenset()
    """Processes that ignore SIGCHLD: their children's time is not added to theirs."""


def parse_stat(text: str, tick: int) -> tuple[int, float, float]:
    """(parent pid, own CPU seconds, reaped children's CPU seconds) of one ``/proc/<pid>/stat`` line; the command
    name may hold spaces and parentheses, so the fields are counted from its last ``)``."""
    fields = text.rsplit(")", 1)[1].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / tick, (int(fields[13]) + int(fields[14])) / tick


def snapshot(proc: Path = Path("/proc")) -> Snapshot:
    tick = os.sysconf("SC_CLK_TCK")
    processes = {}
    ignoring: set[int] = set()
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent, own, reaped = parse_stat((entry / "stat").read_text(), tick)
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:300]
        except OSError:
            continue  # exited meanwhile
        processes[int(entry.name)] = Proc(parent, command, own, reaped)
        try:
            status = (entry / "status").read_text()
            ignored = int(status.split("SigIgn:", 1)[1].split(None, 1)[0], 16)
        except (OSError, IndexError, ValueError):
            continue
        if ignored & SIGCHLD_MASK:
            ignoring.add(int(entry.name))
    user, nice, system, _idle, _iowait, irq, softirq = (
        int(v) for v in (proc / "stat").read_text().split("\n", 1)[0].split()[1:8])
    return Snapshot(time.monotonic(), processes, (user + nice + system + irq + softirq) / tick, frozenset(ignoring))


def members(parents: Mapping[int, int], roots: Iterable[int], exclude: Iterable[int] = ()) -> set[int]:
    """The roots and every descendant, but not the trees of ``exclude`` (a root's child that another system owns,
    like the broker started by the benchmark process)."""
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    cut = set(exclude)
    found: set[int] = set()
    todo = [r for r in roots if r in parents and r not in cut]
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        found.add(pid)
        todo += [c for c in children.get(pid, ()) if c not in cut]
    return found


def tree_cpu(snap: Snapshot, roots: Iterable[int], exclude: Iterable[int] = ()) -> float:
    """CPU seconds so far of the trees of ``roots``: their live members' own and reaped children's."""
    tree = members({pid: p.parent for pid, p in snap.processes.items()}, roots, exclude)
    return sum(snap.processes[pid].own + snap.processes[pid].reaped for pid in tree)


def used(before: Snapshot, after: Snapshot, roots: Iterable[int], exclude: Iterable[int] = ()) -> float:
    """CPU seconds the trees of ``roots`` used between the snapshots."""
    roots, exclude = list(roots), list(exclude)
    return tree_cpu(after, roots, exclude) - tree_cpu(before, roots, exclude)


@dataclass
class Window:
    """Snapshots from ``before`` to ``after`` with samples between (``sampled``)."""

    before: Snapshot
    samples: list[Snapshot] = field(default_factory=list)
    after: Snapshot | None = None

    def used(self, roots: Iterable[int], exclude: Iterable[int] = (),
             key: Callable[[Proc], str] = lambda _: "") -> dict[str, float]:
        """CPU seconds the trees of ``roots`` used in the window, by ``key`` of each process: ``used`` between
        ``before`` and ``after``, plus each member that vanished under a parent ignoring SIGCHLD, as last seen."""
        assert self.after is not None, "the window is still open"
        roots, exclude = list(roots), list(exclude)
        out: dict[str, float] = {}

        def add(snap: Snapshot, sign: float) -> None:
            for pid in members({p: s.parent for p, s in snap.processes.items()}, roots, exclude):
                p = snap.processes[pid]
                out[key(p)] = out.get(key(p), 0.0) + sign * (p.own + p.reaped)

        add(self.after, 1.0)
        add(self.before, -1.0)
        last_seen: dict[int, Snapshot] = {}
        for snap in self.samples:
            for pid in snap.processes:
                last_seen[pid] = snap
        for pid, snap in last_seen.items():
            p = snap.processes[pid]
            if pid in self.after.processes or p.parent not in snap.ignore_children or \
                    pid not in members({q: s.parent for q, s in snap.processes.items()}, roots, exclude):
                continue
            was = self.before.processes.get(pid)
            out[key(p)] = out.get(key(p), 0.0) + p.own + p.reaped - (was.own + was.reaped if was else 0.0)
        return out

    def total(self, roots: Iterable[int], exclude: Iterable[int] = ()) -> float:
        return sum(self.used(roots, exclude).values())


@contextmanager
def sampled(interval: float = 0.5) -> Iterator[Window]:
    """A ``Window`` open for the ``with`` block, /proc sampled every ``interval`` seconds by a thread."""
    window = Window(snapshot())
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(interval):
            window.samples.append(snapshot())

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield window
    finally:
        stop.set()
        thread.join()
        window.after = snapshot()
        window.samples.append(window.after)
