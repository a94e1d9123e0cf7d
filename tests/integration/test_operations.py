"""Operating Shale: `shale run` starts a whole deployment from one config; every process's metrics endpoint
serves every documented metric and the counters move; headless Chromium renders the status page (signing in
with a reader token through its login form) with the tenants, the level chart and the job table matching the API;
the alert rules, evaluated by promtool on the scraped metrics, fire in a stalled-compaction and a stale-index
scenario (and not before); no configured secret appears in a log, in `shale config show` or on a command line;
SIGTERM leaves no process behind."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import httpx
from tests.integration.browser import Browser
from tests.integration.ingest_helpers import create_topic, produce_json
from tests.promtool import alerts_mismatch
from tests.waiting import eventually

from shale.config import BucketConfig
from shale.dev import connector_conf
from shale.launcher import BACKGROUND_NICE
from shale.metastore import MetastoreClient
from shale.metastore.api import auth
from shale.process import ManagedProcess, free_port, pid_alive

ROOT = Path(__file__).resolve().parents[2]


def _documented() -> list[tuple[str, str, bool]]:
    rows = []
    for line in (ROOT / "docs/METRICS.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].startswith("`shale_"):
            rows.append((cells[0].strip("`"), cells[3].split()[0], "moves" in cells[4]))
    return rows


KAFKA_PASSWORD = "kafka-password-" + uuid.uuid4().hex  # configured, unused by the plaintext test broker
SPARK_SECRET = "spark-secret-" + uuid.uuid4().hex
CLUSTER_SECRET = "cluster-secret-" + uuid.uuid4().hex  # given through the environment


def _config(tmp: Path, bootstrap: str, bucket: BucketConfig, topic: str, port: int, tokens: Path) -> Path:
    jars = connector_conf()["spark.jars"]
    text = f"""
[bucket]
url = "{bucket.url}"
endpoint = "{bucket.endpoint}"
access_key_id = "{bucket.access_key_id}"
secret_access_key = "{bucket.secret_access_key.get_secret_value()}"
allow_http = true
[block]
sync_delay = "5s"
delete_delay = "10s"
[kafka]
bootstrap_servers = "{bootstrap}"
sasl_password = "{KAFKA_PASSWORD}"
[metastore]
listen = "127.0.0.1:{port}"
data_dir = "{tmp / 'metastore'}"
tokens_file = "{tokens}"
maintenance_interval = "2s"
dlq_interval = "2s"
bucket_scan_interval = "5s"
[spark]
master = "local[1]"
[spark.conf]
"spark.hadoop.fs.s3a.secret.key" = "{SPARK_SECRET}"
"spark.jars" = "{jars}"
[ingest]
topics = ["{topic}"]
trigger_interval = "2s"
backup_trigger_interval = "2s"
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
max_stale_period = "10s"
[run]
metrics_base_port = 0
"""
    path = tmp / "shale.toml"
    path.write_text(text)
    return path


def _scrape(url: str) -> str:
    return httpx.get(url, timeout=10).text


def _index_age(text: str) -> float:
    """The default tenant's bucket index age in a scrape (-1 when not there)."""
    found = re.search(r'^shale_bucket_index_age_seconds{tenant="default"} (\S+)$', text, re.M)
    return float(found.group(1)) if found else -1.0


def _types(text: str) -> set[str]:
    return set(re.findall(r"^# TYPE (\S+) ", text, re.M))


def _total(text: str, name: str) -> float:
    return sum(float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}(?:_sum|_total)?(?:{{[^}}]*}})? (\S+)$",
                                                       text, re.M))


def test_a_whole_deployment_is_observable_and_stops_cleanly(kafka, minio_bucket, tmp_path: Path,
                                                            output_dir: Path) -> None:
    topic = f"ops-{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap_servers, topic, 2)
    port = free_port()
    # An operator's reader token for the browser, in the configured tokens file (`shale run` adds its own).
    browser_token = auth.new_token()
    tokens = tmp_path / "tokens.toml"
    auth.write_private(tokens, auth.format_entry(auth.TokenEntry(
        name="browser", role="reader", tenants=["*"], sha256=auth.digest(browser_token))))
    config = _config(tmp_path, kafka.bootstrap_servers, minio_bucket, topic, port, tokens)
    logs = tmp_path / "logs"
    run = ManagedProcess("shale-run", [sys.executable, "-m", "shale.cli", "--config", str(config), "--log-format",
                                       "json", "run", "--log-dir", str(logs)], tmp_path / "run.log", cwd=ROOT,
                         env={**os.environ, "SHALE_METASTORE__SECRET": CLUSTER_SECRET})
    run.start()
    manifest_file = logs / "deployment.json"
    try:
        eventually(lambda: manifest_file.exists() and len(json.loads(manifest_file.read_text())["services"]) == 4
              and all(s["pid"] for s in json.loads(manifest_file.read_text())["services"].values()), 90,
              "the deployment to start")
        manifest = json.loads(manifest_file.read_text())
        services = manifest["services"]
        # The backup group and the compactor yield the CPU to the partition group (what queries read). A background
        # service is started through `nice`, which lowers its priority before it runs Shale: the manifest names its
        # pid a moment before (the fresh-clone run of 2026-12-02 read 0 there once), so the test waits for it.

        def priorities() -> dict[str, int]:
            return {name: os.getpriority(os.PRIO_PROCESS, s["pid"]) for name, s in services.items()}

        def lowered() -> bool:
            nice = priorities()
            return nice["compact-0"] == nice["ingest-backup"] == nice["ingest-partition"] + BACKGROUND_NICE

        eventually(lowered, 10, lambda: f"the background services' priority to be lowered: {priorities()}")
        nice = priorities()
        assert nice["metastore"] == nice["ingest-partition"]
        # Each service is a session of its own: where the kernel groups a session's processes for the scheduler,
        # the background services' whole groups yield (a process's nice value weighs only within its group).
        if Path("/proc/self/autogroup").exists():
            group_nice = {name: int(Path(f"/proc/{s['pid']}/autogroup").read_text().split()[-1])
                          for name, s in services.items()}
            assert group_nice["ingest-backup"] == group_nice["compact-0"] == BACKGROUND_NICE
            assert group_nice["metastore"] == group_nice["ingest-partition"] == 0
        # ... and start once the partition group holds its lease (three Spark applications starting together on
        # two cores each took 2-3 times as long as one alone).
        [started] = [json.loads(line) for line in (tmp_path / "run.log").read_text().splitlines()
                     if '"starting the background services"' in line]
        assert started["after"] == "lease"
        assert started["services"] == ["ingest-backup", "compact-0"]
        admin_token = (tmp_path / "metastore" / "admin.token").read_text().strip()
        client = MetastoreClient([f"http://127.0.0.1:{port}"], deadline=30, token=admin_token)
        assert httpx.get(f"http://127.0.0.1:{port}/v1/status", timeout=10).status_code == 401
        eventually(lambda: all(_ok(s["metrics"]) for s in services.values()), 120, "every metrics endpoint")
        before = {name: _scrape(s["metrics"]) for name, s in services.items()}

        for n in range(3):  # three arrivals in separate batches, so each group commits several blocks
            produce_json(kafka.bootstrap_servers, topic, 600, start=n * 600, seed=n)
            eventually(lambda n=n: sum(o.committed_end for o in client.offsets()) == 2 * 600 * (n + 1), 240,
                  "both groups to commit")
        eventually(lambda: any(m.level > 0 for m in client.query_blocks(["default"], 0, 2**62)), 180,
              lambda: f"a compaction to complete: jobs {client.compaction_jobs()} queue {client.compaction_queue()}")
        after = {name: _scrape(s["metrics"]) for name, s in services.items()}

        # Every documented metric is served where documented, and the moving ones moved.
        process_of = {"metastore": "metastore", "ingest": "ingest-partition", "compaction": "compact-0",
                      "all": "metastore"}  # ingest drivers read nothing themselves: their Spark tasks do
        for name, where, moves in _documented():
            if where == "restore":
                continue  # a restore's own metrics, checked by test_restore.py
            scraped = after[process_of[where]]
            assert name in _types(scraped), f"{name} missing from {process_of[where]}"
            if moves:
                assert _total(scraped, name) != _total(before[process_of[where]], name), f"{name} did not move"

        # No configured secret on any command line of the deployment (checked while it runs, Spark JVMs included).
        secrets = _secrets(tmp_path, browser_token, admin_token, minio_bucket)
        shale_pids = _descendants(run.pid)
        assert len(shale_pids) > len(services)
        for pid in shale_pids:
            cmdline = _cmdline(pid)
            assert not [name for name, value in secrets.items() if value in cmdline], (pid, cmdline[:300])
        shown = subprocess.run([sys.executable, "-m", "shale.cli", "--config", str(config), "config", "show"],
                               capture_output=True, text=True, timeout=60, check=True, cwd=ROOT,
                               env={**os.environ, "SHALE_METASTORE__SECRET": CLUSTER_SECRET})
        assert not [name for name, value in secrets.items() if value in shown.stdout + shown.stderr]
        assert json.loads(shown.stdout)["metastore"]["secret"] == "***"

        # Freeze the compaction worker, then look at the status page in a real browser. The page needs a reader
        # token, typed once into its login form; the browser then holds a session cookie only.
        worker = services["compact-0"]["pid"]
        os.kill(worker, signal.SIGSTOP)
        entry = httpx.get(f"http://127.0.0.1:{port}/ui", timeout=10)
        assert entry.status_code == 303
        assert entry.headers["location"] == "/ui/login"
        with Browser(tmp_path / "chrome") as chrome:
            chrome.log_in(f"http://127.0.0.1:{port}", browser_token)
            dom = chrome.dom()
            chrome.screenshot(output_dir / "status.png")
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

        # Alert rules, evaluated by promtool on the metastore's scraped metrics (one scrape a minute in promtool's
        # time): while compaction works (before -> after) nothing fires.
        # The second scrape is taken once the compaction's change is indexed (the writer writes a change within its
        # 1 s debounce and a look): `after` may be taken later than that, and on a slow machine the index had aged
        # past 80 % of the test's 10 s limit by then, with nothing left to index (pending, though healthy).
        def freshly_indexed() -> str:
            text = _scrape(services["metastore"]["metrics"])
            return text if 0 <= _index_age(text) < 4 else ""

        indexed = eventually(freshly_indexed, 60, "a scrape right after a bucket index write")
        calm = alerts_mismatch(tmp_path / "rules-calm", [before["metastore"], indexed], 1,
                               {"ShaleCompactionStalled": [], "ShaleBucketIndexStale": [], "ShaleRaftNoLeader": []})
        assert not calm, calm
        # With the worker frozen and new blocks queued, the stalled-compaction alert fires once that state has
        # lasted its 30 minutes (the scrape held for 31).
        produce_json(kafka.bootstrap_servers, topic, 600, start=1800, seed=7)
        eventually(lambda: sum(o.committed_end for o in client.offsets()) == 2 * 2400, 180, "the last arrivals")
        stalled = alerts_mismatch(tmp_path / "rules-stalled", [_scrape(services["metastore"]["metrics"])], 31,
                                  {"ShaleCompactionStalled": [{"alertstate": "firing", "severity": "warning"}]},
                                  hold=31)
        assert not stalled, stalled

        def stale_index() -> str:
            return alerts_mismatch(tmp_path / "rules-stale", [_scrape(services["metastore"]["metrics"])], 1,
                                   {"ShaleBucketIndexStale": [{"alertstate": "firing", "severity": "critical",
                                                               "tenant": "default"}]}, hold=1)

        # Once the last arrivals and deletions are indexed nothing changes any more, and the tenant's bucket index
        # ages past 80 % of its 10 s limit (block.delete_delay may be no shorter; how soon depends on when the
        # delete delays of the last blocks end).
        eventually(lambda: not stale_index(), 120, lambda: f"the stale-index alert on tenant default: {stale_index()}")
        os.kill(worker, signal.SIGCONT)
    finally:
        pids = [s["pid"] for s in json.loads(manifest_file.read_text())["services"].values()] \
            if manifest_file.exists() else []
        run.stop(timeout=60)
    assert run.popen is not None
    assert run.popen.returncode is not None
    assert not [p for p in pids if pid_alive(p)], "a process of the deployment survived SIGTERM"
    # No configured secret in any log the deployment wrote.
    logged = [tmp_path / "run.log", *sorted(logs.glob("*"))]
    assert len(logged) > len(pids)
    for path in logged:
        text = path.read_text(errors="replace")
        leaked = [name for name, value in secrets.items() if value in text]
        assert not leaked, f"{leaked} in {path}"


def _secrets(tmp: Path, browser: str, admin: str, bucket: BucketConfig) -> dict[str, str]:
    """Every secret this deployment was configured with or issued."""
    found = {"bucket key": bucket.secret_access_key.get_secret_value(), "kafka password": KAFKA_PASSWORD,
             "spark secret": SPARK_SECRET, "cluster secret": CLUSTER_SECRET, "browser token": browser,
             "admin token": admin}
    for path in (tmp / "metastore" / "run").glob("*.token"):
        found[f"token {path.stem}"] = path.read_text().strip()
    assert len(found) >= 9, found.keys()  # both ingest groups and the worker have tokens of their own
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""  # exited meanwhile


def _descendants(root: int) -> set[int]:
    """``root`` and every process below it (the services, their Spark JVMs and Python workers)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        found.add(pid)
        todo += children.get(pid, [])
    return found


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
