"""What every benchmark shares: the machine description, and writing results to bench/results/ and
docs/BENCHMARKS.md."""

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
from pathlib import Path
from typing import Any

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
                 notes: str) -> dict[str, Any]:
    result = {"name": name, "machine": machine(), "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
              "figures": figures, "baseline": baseline, "ratios": ratios}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    _update_doc(name, result, notes)
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
