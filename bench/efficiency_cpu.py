"""CPU seconds of process trees, from /proc: what a system started (its processes, their children, and children
that exited meanwhile) used between two snapshots.

A process's ``utime + stime`` counts its own threads; when a child exits and its parent waits for it, the child's
time moves into the parent's ``cutime + cstime``. So a tree's CPU at one moment is the sum, over its live members,
of both: a Spark Python worker that came and went between two snapshots is still counted, through the daemon
that reaped it. Only a member reaped by a process outside the tree (an orphan adopted by init) is lost; Shale's
services, Spark and the peers wait for their children.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path


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


def parse_stat(text: str, tick: int) -> tuple[int, float, float]:
    """(parent pid, own CPU seconds, reaped children's CPU seconds) of one ``/proc/<pid>/stat`` line; the command
    name may hold spaces and parentheses, so the fields are counted from its last ``)``."""
    fields = text.rsplit(")", 1)[1].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / tick, (int(fields[13]) + int(fields[14])) / tick


def snapshot(proc: Path = Path("/proc")) -> Snapshot:
    tick = os.sysconf("SC_CLK_TCK")
    processes = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent, own, reaped = parse_stat((entry / "stat").read_text(), tick)
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:300]
        except OSError:
            continue  # exited meanwhile
        processes[int(entry.name)] = Proc(parent, command, own, reaped)
    user, nice, system, _idle, _iowait, irq, softirq = (
        int(v) for v in (proc / "stat").read_text().split("\n", 1)[0].split()[1:8])
    return Snapshot(time.monotonic(), processes, (user + nice + system + irq + softirq) / tick)


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
