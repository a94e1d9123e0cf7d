"""``python -m bench spark_versions``: the benchmarks a Spark upgrade could move, before against after in one run.

"Before" is another checkout of Shale on the older Spark, with its own virtual environment (``SHALE_BENCH_BEFORE``:
its folder; e.g. a clone of the commit before the upgrade, after ``make venv``); "after" is this checkout. Each
benchmark of ``SHALE_BENCH_SPARK`` (default ``ingest compaction cluster iceberg``) runs in each, one after the other
on the same machine and the same cached services (each in a process of its own, ``python -m bench <name>``), and
its figures are compared, after over before. Each checkout writes its own ``bench/results/<name>.json``; this one's
is then the benchmark's committed result on the new Spark. ``SHALE_BENCH_SPARK_RUN=0`` runs nothing and compares the
results the two checkouts last wrote (a run cut short after some pairs: each pair's results are already written)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.common import ROOT, progress, write_result

DEFAULT = ("ingest", "compaction", "cluster", "iceberg")


def _pyspark(checkout: Path) -> str:
    python = checkout / ".venv" / "bin" / "python"
    return subprocess.run([str(python), "-c", "import pyspark; print(pyspark.__version__)"], capture_output=True,
                          text=True, check=True).stdout.strip()


def _run(checkout: Path, name: str, run: bool) -> dict[str, Any]:
    python = checkout / ".venv" / "bin" / "python"
    if run:
        progress(f"{name} in {checkout} (pyspark {_pyspark(checkout)})")
        subprocess.run([str(python), "-m", "bench", name], cwd=checkout, check=True)
    result: dict[str, Any] = json.loads((checkout / "bench" / "results" / f"{name}.json").read_text())
    return result


def run() -> dict[str, Any]:
    before_root = Path(os.environ["SHALE_BENCH_BEFORE"]).resolve()
    names = os.environ.get("SHALE_BENCH_SPARK", " ".join(DEFAULT)).split()
    versions = {"before": _pyspark(before_root), "after": _pyspark(ROOT)}
    if versions["before"] == versions["after"]:
        sys.exit(f"both checkouts run pyspark {versions['after']}: nothing to compare")
    figures: dict[str, float] = {}
    baseline: dict[str, float] = {}
    ratios: dict[str, float] = {}
    runs: dict[str, dict[str, Any]] = {}
    for name in names:
        run = os.environ.get("SHALE_BENCH_SPARK_RUN", "1") != "0"
        before, after = _run(before_root, name, run), _run(ROOT, name, run)
        runs[name] = {"before": {"date": before["date"], "machine": before["machine"], "figures": before["figures"]},
                      "after": {"date": after["date"], "machine": after["machine"], "figures": after["figures"]}}
        for key, value in after["figures"].items():
            old = before["figures"].get(key)
            if isinstance(value, int | float) and isinstance(old, int | float):
                figures[f"{name}.{key}"] = value
                baseline[f"{name}.{key}"] = old
                if old:
                    ratios[f"{name}.{key}"] = round(value / old, 3)
    notes = (f"The benchmarks a Spark upgrade could move, run on pyspark {versions['before']} (baseline, another "
             f"checkout) and {versions['after']} (figures), each benchmark's two runs one after the other on the same "
             "machine (`bench/spark_versions.py`; each figure is one run's, so a few percent either way is this "
             "machine's spread). A ratio is after over before: above 1 is more of that figure (for seconds and "
             "bytes, more is worse). Each run's date is in the result's `runs`.")
    return write_result("spark_versions", figures, baseline, ratios, notes,
                        details={"pyspark": versions, "runs": runs})
