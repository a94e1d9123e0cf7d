"""docs/QUICKSTART.md is run as written (issue 29): every `sh` block, in order, in one bash shell, against a real
development stack (Kafka and MinIO started by the quickstart's own `shale dev up`), and the output it promises is
checked. A command that changes breaks this test, not a newcomer's first hour."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "docs" / "QUICKSTART.md"


def blocks() -> list[str]:
    return re.findall(r"^```sh\n(.*?)^```", QUICKSTART.read_text(), re.DOTALL | re.MULTILINE)


def test_the_quickstart_has_the_first_hour_in_it() -> None:
    script = "\n".join(blocks())
    for step in ("shale dev up --env", "shale config check", "shale ingest --group partition --available-now",
                 "shale verify", "shale query", "shale query --tenant default --latest", "shale dev down"):
        assert step in script, step


def test_every_quickstart_command_runs_as_written(tmp_path: Path) -> None:
    # A newcomer's shell: no Shale settings of this test process, the virtual environment on PATH.
    env = {k: v for k, v in os.environ.items()
           if not (k.startswith("SHALE_") and "__" in k) and k not in ("SHALE_CONFIG", "SHALE_DEV_DIR")}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}", XDG_STATE_HOME=str(tmp_path / "state"))
    # Each block echoes a marker first, so that the output can be split by block.
    script = "\n".join(f"echo '=== block {i}'\n{block}" for i, block in enumerate(blocks()))
    try:
        done = subprocess.run(["bash", "-eu", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=1500, check=False)
    finally:
        subprocess.run([sys.executable, "-m", "shale.cli", "dev", "down", "--dir", str(tmp_path / ".shale" / "dev")],
                       env=env, cwd=tmp_path, capture_output=True, check=False, timeout=120)
    (tmp_path / "transcript.txt").write_text(f"{done.stdout}\n--- stderr ---\n{done.stderr}")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-6000:]
    out = done.stdout
    assert "kafka  running" in out
    assert "configuration is valid" in out
    assert "ingest.parsers.options.time_format" in out
    assert "ingest.parsers.0.options.time_format = 'isoo8601'" in done.stderr
    assert ": NOT YET" in out
    assert re.search(r"^logs\.app\s+200\s+1\s+1x invalid JSON", out, re.MULTILINE), out
    assert re.search(r"backup generation 1 topic logs\.app: 201 stored.*: OK$", out, re.MULTILINE), out
    assert re.search(r"partition generation 1 topic logs\.app: 201 stored.*1 quarantined.*: QUARANTINED$", out,
                     re.MULTILINE), out
    assert "showing 5 of 100 rows (--limit N shows more)" in out
    assert re.search(r'"event_time": "\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z"', out), out
    assert "BLOCK" in out
    assert "python rows 200" in out
    assert "duckdb [('INFO', 100), ('WARN', 100)]" in out
    assert "spark rows 200" in out
    # The change table: one row per key as it is now (c1's second record, c2 deleted by its tombstone).
    for row in (r"│ c1\s+│ Ada\s+│ pro\s+│", r"│ c3\s+│ Cy\s+│ team\s+│"):
        assert re.search(row, out), out
    assert not re.search(r"│ c2\s", out), out
    assert "latest duckdb [('Ada', 'pro'), ('Cy', 'team')]" in out
    assert "latest spark [('Ada', 'pro'), ('Cy', 'team')]" in out
    assert "stopped: kafka, minio" in out
