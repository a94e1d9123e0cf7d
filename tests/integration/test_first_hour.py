"""The first hour of a new user (issue 29), against real Kafka, MinIO and Spark: checks that never say OK wrongly,
ingest output that says what went to quarantine."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest
from tests.integration.ingest_helpers import ROOT, create_topic, produce_json, write_config
from tests.waiting import eventually


def shale(config: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shale.cli", "--config", str(config), *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=timeout, check=False)


def test_verify_refuses_an_unknown_topic_and_never_calls_pending_records_ok(kafka, minio_bucket,
                                                                            tmp_path: Path) -> None:
    topic = f"logs.{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap_servers, topic, 2)
    produce_json(kafka.bootstrap_servers, topic, 200)
    config = write_config(tmp_path, kafka.bootstrap_servers, minio_bucket, [topic])
    unknown = shale(config, "verify", "--group", "backup", "--topic", "logs.nope")
    assert unknown.returncode == 2, unknown.stdout + unknown.stderr
    assert "topic 'logs.nope' does not exist in Kafka" in unknown.stderr
    assert "OK" not in unknown.stdout
    pending = shale(config, "verify", "--group", "backup", "--topic", topic)
    assert pending.returncode == 3, pending.stdout + pending.stderr
    summary = pending.stdout.strip().splitlines()[-1]
    assert "0 stored, 0 missing" in summary
    assert "200 not yet ingested" in summary
    assert summary.endswith(": NOT YET")


def test_a_wholly_quarantined_topic_is_loud_in_ingest_and_in_verify(kafka, minio_bucket, tmp_path: Path) -> None:
    bad, good = (f"logs.{name}{uuid.uuid4().hex[:6]}" for name in ("bad", "good"))
    for topic in (bad, good):
        create_topic(kafka.bootstrap_servers, topic, 1)
    produce_json(kafka.bootstrap_servers, bad, 20, invalid_every=1)
    produce_json(kafka.bootstrap_servers, good, 30)
    config = write_config(tmp_path, kafka.bootstrap_servers, minio_bucket, [bad, good])
    ingest = shale(config, "ingest", "--group", "partition", "--available-now")
    (tmp_path / "ingest.stderr").write_text(ingest.stderr)
    assert ingest.returncode == 4, ingest.stderr[-5000:]  # a topic of which every record went to quarantine
    assert f"every record of {bad} went to quarantine in this run" in ingest.stderr
    rows = {line.split()[0]: line for line in ingest.stdout.splitlines() if line.strip()}
    assert rows["topic"].split()[:3] == ["topic", "stored", "quarantined"]
    assert rows[bad].split()[1:5] == ["0", "20", "<<", "WARNING"]
    assert "20x invalid JSON" in rows[bad]
    assert rows[good].split()[1:4] == ["30", "0", "-"]
    assert "all records of this topic went to quarantine" in ingest.stderr
    # Spark's and librdkafka's known, deliberate noise stays off the console, in Spark's log file.
    for noise in ("NativeCodeLoader", "BGQUEUE", "Purging"):
        assert noise not in ingest.stderr, noise
    (spark_log,) = re.findall(r"Spark's log \(its known warnings included\) file=(\S+)", ingest.stderr)
    assert "Unable to load native-hadoop library" in Path(spark_log).read_text()
    quarantined = shale(config, "verify", "--group", "partition", "--topic", bad)
    assert quarantined.returncode == 4, quarantined.stdout + quarantined.stderr
    assert quarantined.stdout.strip().endswith(": QUARANTINED")
    ok = shale(config, "verify", "--group", "partition", "--topic", good)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.strip().endswith(": OK")


def test_metastore_serve_stops_promptly_on_sigterm_and_says_so(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "shale.cli", "--set", f"metastore.data_dir={tmp_path}/data", "--set",
             f"metastore.listen=127.0.0.1:{port}", "--set", f"bucket.url=file://{tmp_path}/bucket", "metastore",
             "serve"], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        with httpx.Client() as browser:  # a keep-alive connection stays open, as a status page's browser keeps one
            def healthy() -> bool:
                try:
                    return browser.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
                except httpx.TransportError:
                    return False

            eventually(healthy, 120, log.read_text)
            # The operating guide's way into the status page: the admin token pasted into the login form.
            readme = (ROOT / "docs" / "OPERATING.md").read_text()
            assert 'curl -H "Authorization: Bearer $(cat .shale/metastore/admin.token)"' in readme
            token = (tmp_path / "data" / "admin.token").read_text().strip()
            base = f"http://127.0.0.1:{port}"
            assert browser.get(f"{base}/ui").headers.get("location", "").endswith("/ui/login")
            login = browser.post(f"{base}/ui/login", data={"token": token}, headers={"origin": base})
            assert login.status_code == 303, login.text
            page = browser.get(f"{base}/ui")  # the session cookie the form set
            assert page.status_code == 200
            assert "text/html" in page.headers["content-type"]
            assert browser.get(f"{base}/v1/ui/status", headers={"authorization": f"Bearer {token}"}).status_code == 200
            process.send_signal(signal.SIGTERM)
            code = process.wait(timeout=15)
    finally:
        if process.poll() is None:
            process.kill()
    text = log.read_text()
    assert code == 0, text
    assert "metastore stopping signal=SIGTERM" in text
    assert text.rstrip().endswith("metastore stopped")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_the_first_signal_stops_ingest_after_its_batch_without_a_traceback(kafka, minio_bucket, tmp_path: Path,
                                                                          sig: signal.Signals) -> None:
    topic = f"logs.{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap_servers, topic, 2)
    produce_json(kafka.bootstrap_servers, topic, 300)
    config = write_config(tmp_path, kafka.bootstrap_servers, minio_bucket, [topic])
    log = tmp_path / "ingest.log"
    with log.open("w") as out:
        process = subprocess.Popen([sys.executable, "-m", "shale.cli", "--config", str(config), "ingest", "--group",
                                    "backup"], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
    try:
        eventually(lambda: "batch committed" in log.read_text(), 300, log.read_text)
        os.killpg(process.pid, sig)  # as Ctrl-C does: to the whole process group (Spark's JVM and workers too)
        code = process.wait(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
    text = log.read_text()
    assert code == 128 + sig, text[-5000:]
    assert f"ingest backup: stopping at the next safe point ({sig.name})" in text
    assert "ingest backup: stopped after its last committed batch" in text
    assert "Traceback" not in text
    assert "Py4J" not in text
    assert "Aborted" not in text
    verified = shale(config, "verify", "--group", "backup", "--topic", topic)
    assert verified.returncode == 0, verified.stdout + verified.stderr  # every record stored once
