"""What every benchmark shares: the machine description, CPU seconds per process, and writing results to
bench/results/ and docs/BENCHMARKS.md."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.targets import evaluated, rewrite

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
DOC = ROOT / "docs" / "BENCHMARKS.md"


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT, check=False).stdout.strip()
    return (f"{cpu}, {os.cpu_count()} cores, {mem_gib:.0f} GiB RAM, {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}, commit {commit or 'unknown'}")


def progress(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


@contextmanager
def timed() -> Iterator[list[float]]:
    """``with timed() as t: ...`` then ``t[0]`` is the elapsed seconds."""
    out: list[float] = []
    start = time.perf_counter()
    yield out
    out.append(time.perf_counter() - start)


def write_result(name: str, figures: dict[str, float], baseline: dict[str, float], ratios: dict[str, float],
                 notes: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write the result (``details``: more of what the run saw, kept in the JSON only) and its docs section."""
    result: dict[str, Any] = {"name": name, "machine": machine(),
                              "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                              "figures": figures, "baseline": baseline, "ratios": ratios}
    result["targets"] = evaluated(name, result)
    result.update(details or {})
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    _update_doc(name, result, notes)
    DOC.write_text(rewrite(DOC))
    return result


def _table(values: dict[str, float]) -> str:
    return "\n".join(f"| `{k}` | {v:,.4g} |" if isinstance(v, float) else f"| `{k}` | {v:,} |"
                     for k, v in values.items())


def _update_doc(name: str, result: dict[str, Any], notes: str) -> None:
    section = (
        f"<!-- bench:{name} -->\n## {name}\n\n{notes.strip()}\n\n"
        f"Run {result['date']} on {result['machine']}.\n\n"
        f"| figure | value |\n| --- | --- |\n{_table(result['figures'])}\n\n"
        f"| baseline | value |\n| --- | --- |\n{_table(result['baseline'])}\n\n"
        f"| ratio | value |\n| --- | --- |\n{_table(result['ratios'])}\n"
        f"<!-- /bench:{name} -->"
    )
    text = DOC.read_text()
    pattern = re.compile(rf"<!-- bench:{name} -->.*?<!-- /bench:{name} -->", re.S)
    text = pattern.sub(lambda _: section, text) if pattern.search(text) else text.rstrip() + "\n\n" + section + "\n"
    DOC.write_text(text)


@dataclass
class CpuSnapshot:
    at: float
    processes: dict[int, tuple[int, int, str, float]]
    """pid -> (parent pid, session id, command line start, CPU seconds so far)"""
    busy: float
    """CPU seconds the whole machine spent busy so far (user, nice, system, irq, softirq)."""
    steal: float
    """CPU seconds the hypervisor gave to other machines while this one wanted them."""


def cpu_snapshot() -> CpuSnapshot:
    """Every process's session, command line and CPU seconds, and the machine's, from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    processes = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:300]
        except OSError:
            continue  # exited meanwhile
        processes[int(entry.name)] = (int(fields[1]), int(fields[3]), command,
                                      (int(fields[11]) + int(fields[12])) / tick)
    user, nice, system, _idle, _iowait, irq, softirq, steal = (
        int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9])
    return CpuSnapshot(time.monotonic(), processes, (user + nice + system + irq + softirq) / tick, steal / tick)
