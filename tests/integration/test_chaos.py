"""Chaos: a whole `shale run` deployment while a transactional producer (one transaction in five aborted) writes;
the metastore, each ingest group and the compaction worker are killed with SIGKILL at random moments (`shale run`
restarts them). Afterwards every committed record is stored exactly once in each group (read from the bucket),
no aborted record is stored, and `shale bucket verify` is clean."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from tests.integration.kafka_world import TransactionalProducer, create_topic, stored
from tests.waiting import eventually

from shale.config import BucketConfig, load_config
from shale.dev import connector_conf
from shale.kafka import offset_bounds
from shale.metastore import MetastoreClient
from shale.objstore import open_bucket
from shale.process import ManagedProcess, free_port

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("metastore", "ingest-backup", "ingest-partition", "compact-0")


def _config(tmp: Path, bootstrap: str, bucket: BucketConfig, topic: str, port: int) -> Path:
    path = tmp / "shale.toml"
    path.write_text(f"""
[bucket]
url = "{bucket.url}"
endpoint = "{bucket.endpoint}"
access_key_id = "{bucket.access_key_id}"
secret_access_key = "{bucket.secret_access_key.get_secret_value()}"
allow_http = true
[block]
sync_delay = "5s"
delete_delay = "10s"
[bucket_index]
max_stale_period = "10s"
[kafka]
bootstrap_servers = "{bootstrap}"
[metastore]
listen = "127.0.0.1:{port}"
data_dir = "{tmp / 'metastore'}"
client_deadline = "5s"
request_timeout = "3s"
maintenance_interval = "2s"
dlq_interval = "2s"
bucket_scan_interval = "5s"
[spark]
master = "local[1]"
conf = {{"spark.jars" = "{connector_conf()["spark.jars"]}"}}
[ingest]
topics = ["{topic}"]
trigger_interval = "1s"
backup_trigger_interval = "1s"
max_records_per_batch = 500
[[ingest.parsers]]
parser = "json"
options = {{time_field = "ts", time_format = "epoch_s", label_fields = ["level"]}}
[compaction]
# A level-0 block holds every partition a task read, so a group that stored the whole run in one batch (the
# kills over, or a slow start) would leave one block to compact: batches of at most 500 records make about nine.
blocks_per_job = [2, 2]
poll_interval = "0.5s"
lease_duration = "5s"
[run]
metrics_base_port = 0
restart_delay = "1s"
""")
    path.chmod(0o600)
    return path


def test_chaos_while_a_transactional_producer_writes(kafka, minio_bucket, tmp_path: Path) -> None:
    topic = f"ledger-{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap_servers, topic, 3)
    port = free_port()
    file = _config(tmp_path, kafka.bootstrap_servers, minio_bucket, topic, port)
    config = load_config(file, env={})
    run = ManagedProcess("shale-run", [sys.executable, "-m", "shale.cli", "--config", str(file), "run",
                                       "--log-dir", str(tmp_path / "logs")], tmp_path / "run.log", cwd=ROOT)
    manifest = tmp_path / "logs" / "deployment.json"
    producer = TransactionalProducer(kafka.bootstrap_servers, topic, transactions=150, size=30, pause=0.05)
    run.start()
    try:
        eventually(lambda: manifest.exists() and all(
            json.loads(manifest.read_text())["services"].get(s, {}).get("pid") for s in SERVICES), 120,
            "the deployment to start")
        token = eventually(lambda: (tmp_path / "metastore" / "admin.token").read_text().strip(), 60, "the token")
        client = MetastoreClient([f"http://127.0.0.1:{port}"], deadline=30, token=token)
        thread = producer.start()
        rng = random.Random(11)
        killed: list[str] = []
        for victim in [*SERVICES, *rng.sample(SERVICES, 3)]:  # each one at least once, at random moments
            time.sleep(rng.uniform(3, 10))
            pid = json.loads(manifest.read_text())["services"][victim]["pid"]
            try:
                os.killpg(pid, signal.SIGKILL)
                killed.append(victim)
            except ProcessLookupError:
                pass  # it was already being restarted
            assert run.alive(), run.log_path.read_text()[-3000:]
        assert set(killed) == set(SERVICES)
        producer.stop.set()
        thread.join(timeout=300)
        assert producer.error is None, producer.error
        ends = offset_bounds(config.kafka, [(topic, p) for p in range(3)])

        def caught_up() -> bool:
            committed = {(o.group, o.partition): o.committed_end for o in client.offsets() if o.topic == topic}
            return all(committed.get((g, p)) == ends[(topic, p)][1] for g in ("backup", "partition") for p in range(3))

        eventually(caught_up, 600, lambda: f"both groups to commit every offset: {client.offsets()} vs {ends}")

        def verified() -> bool:
            done = subprocess.run([sys.executable, "-m", "shale.cli", "--config", str(file), "bucket", "verify"],
                                  capture_output=True, text=True, cwd=ROOT, check=False)
            return done.returncode == 0

        eventually(lambda: any(m.level > 0 for m in client.query_blocks(client.tenants(), 0, 2**62)), 300,
                   "a compaction to complete")
        eventually(verified, 300, "`shale bucket verify` to be clean (orphans of the crashes marked)")
        bucket = open_bucket(config.bucket)
        for group in ("backup", "partition"):
            records = stored(client, bucket, group, topic)
            assert set(records) == producer.committed, group
            assert max(records.values()) == 1, group
            assert not set(records) & producer.aborted
    finally:
        producer.stop.set()
        run.stop(timeout=60)
