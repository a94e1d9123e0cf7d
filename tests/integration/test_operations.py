"""Operating Shale: `shale run` starts a whole deployment from one config; every process's metrics endpoint
serves every documented metric and the counters move; headless Chromium renders the status page with the
tenants, the level chart and the job table matching the API; the alert rules fire in a stalled-compaction and a
stale-index scenario (and not before); SIGTERM leaves no process behind."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import httpx
import yaml
from tests.integration.ingest_helpers import create_topic, produce_json
from tests.promql_eval import SeriesStore, evaluate

from shale.config import BucketConfig
from shale.dev import connector_conf
from shale.metastore import MetastoreClient
from shale.process import ManagedProcess, free_port, pid_alive

ROOT = Path(__file__).resolve().parents[2]
RULES = {r["alert"]: r["expr"] for r in yaml.safe_load(
    (ROOT / "deploy/prometheus/shale-alerts.yml").read_text())["groups"][0]["rules"]}


def _documented() -> list[tuple[str, str, bool]]:
    rows = []
    for line in (ROOT / "docs/METRICS.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].startswith("`shale_"):
            rows.append((cells[0].strip("`"), cells[3].split()[0], "moves" in cells[4]))
    return rows


def _config(tmp: Path, bootstrap: str, bucket: BucketConfig, topic: str, port: int) -> Path:
    jars = connector_conf()["spark.jars"]
    text = f"""
[bucket]
url = "{bucket.url}"
endpoint = "{bucket.endpoint}"
access_key_id = "{bucket.access_key_id}"
secret_access_key = "{bucket.secret_access_key}"
allow_http = true
[block]
sync_delay = "5s"
delete_delay = "10s"
[kafka]
bootstrap_servers = "{bootstrap}"
[metastore]
listen = "127.0.0.1:{port}"
data_dir = "{tmp / 'metastore'}"
maintenance_interval = "2s"
dlq_interval = "2s"
bucket_scan_interval = "5s"
[spark]
master = "local[1]"
conf = {{"spark.jars" = "{jars}"}}
[ingest]
topics = ["{topic}"]
checkpoint_dir = "{tmp / 'checkpoints'}"
trigger_interval = "2s"
[[ingest.parsers]]
parser = "json"
options = {{time_field = "ts", time_format = "epoch_s", label_fields = ["level"]}}
[compaction]
blocks_per_job = [2, 2]
poll_interval = "0.5s"
lease_duration = "5s"
[bucket_index]
debounce = "1s"
rewrite_interval = "1h"
max_stale_period = "30s"
[run]
metrics_base_port = 0
"""
    path = tmp / "shale.toml"
    path.write_text(text)
    return path


def _scrape(url: str) -> str:
    return httpx.get(url, timeout=10).text


def _types(text: str) -> set[str]:
    return set(re.findall(r"^# TYPE (\S+) ", text, re.M))


def _total(text: str, name: str) -> float:
    return sum(float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}(?:_sum|_total)?(?:{{[^}}]*}})? (\S+)$",
                                                       text, re.M))


def _wait(condition, timeout: float, what) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what() if callable(what) else what}"
        time.sleep(0.5)


def test_a_whole_deployment_is_observable_and_stops_cleanly(kafka, minio_bucket, tmp_path: Path,
                                                            output_dir: Path) -> None:
    topic = f"ops-{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap_servers, topic, 2)
    port = free_port()
    config = _config(tmp_path, kafka.bootstrap_servers, minio_bucket, topic, port)
    logs = tmp_path / "logs"
    run = ManagedProcess("shale-run", [sys.executable, "-m", "shale.cli", "--config", str(config), "--log-format",
                                       "json", "run", "--log-dir", str(logs)], tmp_path / "run.log", cwd=ROOT)
    run.start()
    manifest_file = logs / "deployment.json"
    try:
        _wait(lambda: manifest_file.exists() and len(json.loads(manifest_file.read_text())["services"]) == 4
              and all(s["pid"] for s in json.loads(manifest_file.read_text())["services"].values()), 90,
              "the deployment to start")
        manifest = json.loads(manifest_file.read_text())
        services = manifest["services"]
        client = MetastoreClient([f"http://127.0.0.1:{port}"], deadline=30)
        _wait(lambda: all(_ok(s["metrics"]) for s in services.values()), 120, "every metrics endpoint")
        before = {name: _scrape(s["metrics"]) for name, s in services.items()}

        for n in range(3):  # three arrivals in separate batches, so each group commits several blocks
            produce_json(kafka.bootstrap_servers, topic, 600, start=n * 600, seed=n)
            _wait(lambda n=n: sum(o.committed_end for o in client.offsets()) == 2 * 600 * (n + 1), 240,
                  "both groups to commit")
        _wait(lambda: any(m.level > 0 for m in client.query_blocks(["default"], 0, 2**62)), 180,
              lambda: f"a compaction to complete: jobs {client.compaction_jobs()} queue {client.compaction_queue()}")
        after = {name: _scrape(s["metrics"]) for name, s in services.items()}

        # Every documented metric is served where documented, and the moving ones moved.
        process_of = {"metastore": "metastore", "ingest": "ingest-partition", "compaction": "compact-0",
                      "all": "metastore"}  # ingest drivers read nothing themselves: their Spark tasks do
        for name, where, moves in _documented():
            scraped = after[process_of[where]]
            assert name in _types(scraped), f"{name} missing from {process_of[where]}"
            if moves:
                assert _total(scraped, name) != _total(before[process_of[where]], name), f"{name} did not move"

        # Freeze the compaction worker, then look at the status page in a real browser.
        worker = services["compact-0"]["pid"]
        os.kill(worker, signal.SIGSTOP)
        page = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                               "--no-first-run", "--disable-background-networking", "--disable-component-update",
                               "--disable-sync", f"--user-data-dir={tmp_path / 'chrome'}", "--dump-dom",
                               f"http://127.0.0.1:{port}/ui"], capture_output=True, text=True, timeout=120, check=True)
        dom = page.stdout
        subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                        "--disable-background-networking", "--disable-component-update", "--disable-sync",
                        f"--user-data-dir={tmp_path / 'chrome2'}", "--window-size=1280,2200",
                        f"--screenshot={output_dir / 'status.png'}", f"http://127.0.0.1:{port}/ui"],
                       capture_output=True, timeout=120, check=True)
        assert (output_dir / "status.png").stat().st_size > 10_000
        assert re.search(r'<table id="tenants">.*?<td class="l">default</td>', dom, re.S)
        live = Counter(m.level for m in client.query_blocks(["default"], 0, 2**62))
        drawn: Counter[int] = Counter()
        for level, blocks in re.findall(r'data-level="(\d+)" data-blocks="(\d+)"', dom):
            drawn[int(level)] += int(blocks)
        assert drawn == live
        job_rows = re.findall(r'<table id="jobs">.*?</table>', dom, re.S)[0]
        shown = set(re.findall(r'<tr><td class="l">([^<]+)</td>', job_rows))
        assert shown == {j["name"] for j in client.compaction_jobs()}

        # Alert rules: stalled compaction (worker frozen, new blocks queued) and a stale bucket index.
        calm = SeriesStore()
        calm.scrape(before["metastore"], 0)
        calm.scrape(after["metastore"], 60)
        assert not evaluate(RULES["ShaleCompactionStalled"], calm, 60)
        assert not evaluate(RULES["ShaleBucketIndexStale"], calm, 60)
        assert not evaluate(RULES["ShaleRaftNoLeader"], calm, 60)
        produce_json(kafka.bootstrap_servers, topic, 600, start=1800, seed=7)
        _wait(lambda: sum(o.committed_end for o in client.offsets()) == 2 * 2400, 180, "the last arrivals")
        stalled = SeriesStore()
        stalled.scrape(_scrape(services["metastore"]["metrics"]), 0)
        time.sleep(3)
        stalled.scrape(_scrape(services["metastore"]["metrics"]), 60)
        assert evaluate(RULES["ShaleCompactionStalled"], stalled, 60)

        def stale_tenants() -> set[str]:
            stale = SeriesStore()
            stale.scrape(_scrape(services["metastore"]["metrics"]), 0)
            return {dict(k)["tenant"] for k in evaluate(RULES["ShaleBucketIndexStale"], stale, 0)}

        # Once the last arrivals and deletions are indexed nothing changes any more, and the tenant's bucket index
        # ages past 80 % of its 30 s limit (how soon depends on when the delete delays of the last blocks end).
        _wait(lambda: stale_tenants() == {"default"}, 120, "the stale-index alert on tenant default")
        os.kill(worker, signal.SIGCONT)
    finally:
        pids = [s["pid"] for s in json.loads(manifest_file.read_text())["services"].values()] \
            if manifest_file.exists() else []
        run.stop(timeout=60)
    assert run.popen is not None
    assert run.popen.returncode is not None
    assert not [p for p in pids if pid_alive(p)], "a process of the deployment survived SIGTERM"


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
