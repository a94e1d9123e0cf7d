"""`shale dev up | status | down` start real processes (Kafka, MinIO, a Spark master and a worker), report them,
hand out a configuration that runs a Shale Spark application on the cluster, and leave no process behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from shale.cli import cli
from shale.config import load_config
from shale.dev import DevStack
from shale.process import pid_alive

ROOT = Path(__file__).resolve().parents[2]


def test_dev_up_status_down(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # where `up` notes the stack it started last
    monkeypatch.delenv("SHALE_DEV_DIR", raising=False)
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
        assert status.output.splitlines()[0] == f"dev stack in {tmp_path / 'dev'}"
        states = {line.split()[0]: line.split()[1] for line in status.output.splitlines()[1:]}
        assert states == {"kafka": "running", "minio": "running", "spark-master": "running",
                          "spark-worker-0": "running"}
        again = runner.invoke(cli, ["dev", "up", "--dir", directory, "--spark-workers", "1"])  # same processes
        assert again.exit_code == 0
        assert json.loads((tmp_path / "dev" / "state.json").read_text()) == state
        assert "kafka and minio: running" in again.output
        assert "spark cluster: running (1 workers)" in again.output
        plain = runner.invoke(cli, ["dev", "up", "--dir", directory])  # asking for less drops nothing
        assert plain.exit_code == 0
        assert json.loads((tmp_path / "dev" / "state.json").read_text()) == state

        # `--env` prints only exports (eval-able), and `status` run elsewhere finds the stack without --dir.
        exported = subprocess.run(
            ["bash", "-c", f'eval "$({sys.executable} -m shale.cli dev up --dir {directory} --env)" '
                           '&& echo "$SHALE_DEV_DIR" && echo "$SHALE_KAFKA__BOOTSTRAP_SERVERS"'],
            env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}, capture_output=True, text=True,
            cwd=tmp_path, timeout=300, check=True)
        assert exported.stdout.splitlines() == [str(tmp_path / "dev"), state["kafka_bootstrap"]]
        (tmp_path / "elsewhere").mkdir()
        monkeypatch.chdir(tmp_path / "elsewhere")
        found = runner.invoke(cli, ["dev", "status"])  # through the note `up` left
        assert found.exit_code == 0, found.output
        assert found.output.splitlines()[0] == f"dev stack in {tmp_path / 'dev'}"

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
        assert "no block waits for compaction" in compact.stderr  # it says why it did nothing
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
    assert f"no dev stack found; looked in {tmp_path / 'dev'}" in status.output


def test_dev_up_with_a_schema_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("SHALE_DEV_DIR", raising=False)
    runner = CliRunner()
    directory = str(tmp_path / "dev")
    nothing = runner.invoke(cli, ["dev", "up", "--dir", directory, "--env"])  # --env starts nothing
    assert nothing.exit_code == 3
    assert "no dev stack found" in nothing.output
    assert DevStack(Path(directory)).load() is None
    first = runner.invoke(cli, ["dev", "up", "--dir", directory])
    assert first.exit_code == 0, first.output
    before = DevStack(Path(directory)).load()
    assert before is not None
    up = runner.invoke(cli, ["dev", "up", "--dir", directory, "--schema-registry"])  # added to the running stack
    assert up.exit_code == 0, up.output
    state = DevStack(Path(directory)).load()
    assert state is not None
    try:
        assert "kafka and minio: running" in up.output
        assert f"schema registry: added ({state.registry_url})" in up.output
        assert (state.kafka_pid, state.kafka_bootstrap, state.minio_endpoint) == (
            before.kafka_pid, before.kafka_bootstrap, before.minio_endpoint)
        exports = runner.invoke(cli, ["dev", "up", "--dir", directory, "--env"])
        assert exports.exit_code == 0
        assert f"export SHALE_INGEST__SCHEMA_REGISTRY__URL={state.registry_url}" in exports.output
        assert DevStack(Path(directory)).load() == state
        assert state.registry_url.endswith("/apis/ccompat/v7")
        assert f"schema registry:         {state.registry_url}" in up.output
        config = load_config(None, env=state.env())
        assert config.ingest.schema_registry.url == state.registry_url
        status = runner.invoke(cli, ["dev", "status", "--dir", directory])
        assert status.exit_code == 0, status.output
        assert "schema-registry running" in status.output
    finally:
        down = runner.invoke(cli, ["dev", "down", "--dir", directory])
    assert "schema-registry" in down.output
    assert not pid_alive(state.registry_pid)


def test_dev_up_with_an_iceberg_catalog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--iceberg-catalog` adds Apache Iceberg's REST catalog on loopback, and the exports point Shale's [iceberg] at
    it: a catalog opened from that configuration creates a namespace and lists it."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("SHALE_DEV_DIR", raising=False)
    runner = CliRunner()
    directory = str(tmp_path / "dev")
    up = runner.invoke(cli, ["dev", "up", "--dir", directory, "--iceberg-catalog"])
    assert up.exit_code == 0, up.output
    state = DevStack(Path(directory)).load()
    assert state is not None
    try:
        assert f"iceberg rest catalog: added ({state.catalog_url})" in up.output
        assert state.catalog_url.startswith("http://127.0.0.1:")
        exports = runner.invoke(cli, ["dev", "up", "--dir", directory, "--env"])
        assert f"export SHALE_ICEBERG__CATALOG_URI={state.catalog_url}" in exports.output
        from shale.iceberg import open_catalog

        catalog = open_catalog(load_config(None, env=state.env()))
        catalog.create_namespace("acme")
        assert ("acme",) in catalog.list_namespaces()
        status = runner.invoke(cli, ["dev", "status", "--dir", directory])
        assert "iceberg-catalog running" in status.output, status.output
    finally:
        down = runner.invoke(cli, ["dev", "down", "--dir", directory])
    assert "iceberg-catalog" in down.output
    assert not pid_alive(state.catalog_pid)
