"""`shale dev up | status | down` start real processes (Kafka, MinIO, a Spark master and a worker), report them,
hand out a configuration that runs a Shale Spark application on the cluster, and leave no process behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from shale.cli import cli
from shale.config import load_config
from shale.dev import DevStack
from shale.process import pid_alive

ROOT = Path(__file__).resolve().parents[2]


def test_dev_up_status_down(tmp_path: Path) -> None:
    runner = CliRunner()
    directory = str(tmp_path / "dev")
    up = runner.invoke(cli, ["dev", "up", "--dir", directory, "--spark-workers", "1"])
    assert up.exit_code == 0, up.output
    assert "kafka bootstrap servers: 127.0.0.1:" in up.output
    assert "s3 endpoint:             http://127.0.0.1:" in up.output
    assert "spark master:            spark://127.0.0.1:" in up.output
    state = json.loads((tmp_path / "dev" / "state.json").read_text())
    pids = [state["kafka_pid"], state["minio_pid"], *state["spark_pids"]]
    assert len(pids) == 4
    try:
        status = runner.invoke(cli, ["dev", "status", "--dir", directory])
        assert status.exit_code == 0, status.output
        states = {line.split()[0]: line.split()[1] for line in status.output.splitlines()}
        assert states == {"kafka": "running", "minio": "running", "spark-master": "running",
                          "spark-worker-0": "running"}
        again = runner.invoke(cli, ["dev", "up", "--dir", directory, "--spark-workers", "1"])  # same processes
        assert again.exit_code == 0
        assert json.loads((tmp_path / "dev" / "state.json").read_text()) == state

        # The configuration handed out runs a Shale Spark application on the cluster.
        stack_state = DevStack(tmp_path / "dev").load()
        assert stack_state is not None
        env = stack_state.env()
        config = load_config(None, env=env)
        assert config.spark.master == state["spark_master"]
        assert config.spark.conf["spark.jars"].count(".jar") == 4
        assert config.bucket.endpoint == state["minio_endpoint"]
        compact = subprocess.run(
            [sys.executable, "-m", "shale.cli", "--set", f"metastore.data_dir={tmp_path / 'ms'}", "compact",
             "--until-idle"], env={**os.environ, **env}, cwd=tmp_path, capture_output=True, text=True,
            timeout=300, check=False)
        assert compact.returncode == 0, compact.stderr[-3000:]
        assert "finished 0 jobs" in compact.stderr
        assert "resolves to a loopback address" not in compact.stderr
        apps = (tmp_path / "dev" / "spark" / "worker0").iterdir()
        assert any(app.name.startswith("app-") for app in apps)  # it ran executors on the worker
    finally:
        down = runner.invoke(cli, ["dev", "down", "--dir", directory])
    assert down.exit_code == 0
    assert "stopped: kafka, minio, spark-master, spark-worker-0" in down.output
    assert not any(pid_alive(pid) for pid in pids)
    status = runner.invoke(cli, ["dev", "status", "--dir", directory])
    assert status.exit_code == 3
    assert "kafka  stopped" in status.output
