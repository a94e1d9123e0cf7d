"""Where a Python process tree's time goes: py-spy samples of it (``py-spy record --subprocesses --format raw``,
every Python process under the pid: an ingest service's driver and its Spark Python workers), summed by the
function each sample was in (self time) and by the functions it was under (inclusive time), as shares of every
sample. The JVMs in the tree are not sampled (py-spy reads Python stacks only): the /proc split of the same
tree's CPU between JVMs and Python processes (``bench.efficiency``) says how much that leaves out."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

_FRAME = re.compile(r"^(?P<name>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")
_PROCESS = re.compile(r'^process \d+:".*?";', re.S)
"""The leading frame ``--subprocesses`` adds: the process's command line, quoted, which may hold ``;`` and line
ends."""


def py_spy() -> str:
    """The py-spy binary beside this interpreter (the dev dependencies install it), or on the path."""
    beside = Path(sys.executable).with_name("py-spy")
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if not found:
        raise RuntimeError("py-spy is not installed: pip install py-spy (a dev dependency of shale)")
    return found


def start_recording(pid: int, out: Path, rate: int = 50) -> subprocess.Popen[bytes]:
    """py-spy sampling ``pid`` and its Python descendants ``rate`` times a second until it is sent SIGINT (then
    it writes ``out``). ``--nonblocking``: the sampled processes are not paused for each sample."""
    command = [py_spy(), "record", "--pid", str(pid), "--subprocesses", "--nonblocking", "--format", "raw",
               "--rate", str(rate), "--output", str(out)]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def function_of(frame: str) -> str:
    """``name (path/to/module.py:123)`` as ``name (module.py under its package)``: the line dropped, the path cut
    to its last two parts, so one function's samples from several lines and processes add up."""
    match = _FRAME.match(frame.strip())
    if not match:
        return frame.strip()
    parts = match["file"].replace("\\", "/").split("/")
    return f"{match['name']} ({'/'.join(parts[-2:])})"


@dataclass(frozen=True)
class Profile:
    samples: int
    self_share: list[tuple[str, float]]
    """Functions by the share of samples that were in them (not in a function they called), highest first."""
    inclusive_share: list[tuple[str, float]]
    """Functions by the share of samples that were in them or under them, highest first."""


def _records(raw: str) -> list[str]:
    """py-spy's raw lines (``stack count``), a command line's line ends joined back into its record."""
    out: list[str] = []
    pending = ""
    for line in raw.splitlines():
        pending = f"{pending}\n{line}" if pending else line
        if re.search(r" \d+$", line):
            out.append(pending)
            pending = ""
    return out


def summarize(raw: str, top: int = 15) -> Profile:
    """The top functions of py-spy's raw output (one line per distinct stack: ``frame;frame;... count``, the
    outermost frame first; with ``--subprocesses`` a ``process ...`` frame and a thread frame lead)."""
    own: Counter[str] = Counter()
    under: Counter[str] = Counter()
    samples = 0
    for record in _records(raw):
        stack, _, count = record.rpartition(" ")
        stack = _PROCESS.sub("", stack)
        frames = [function_of(f) for f in stack.split(";") if f.endswith(")")]
        if not frames:
            continue
        samples += int(count)
        own[frames[-1]] += int(count)
        for name in set(frames):
            under[name] += int(count)

    def shares(counter: Counter[str]) -> list[tuple[str, float]]:
        return [(name, round(n / samples, 4)) for name, n in counter.most_common(top)]

    return Profile(samples, shares(own), shares(under)) if samples else Profile(0, [], [])
