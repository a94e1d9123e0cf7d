"""`shale dev up | status | down` start real processes, report them, and leave none behind."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from shale.cli import cli
from shale.process import pid_alive


def test_dev_up_status_down(tmp_path: Path) -> None:
    runner = CliRunner()
    directory = str(tmp_path / "dev")
    up = runner.invoke(cli, ["dev", "up", "--dir", directory])
    assert up.exit_code == 0, up.output
    assert "kafka bootstrap servers: 127.0.0.1:" in up.output
    assert "s3 endpoint:             http://127.0.0.1:" in up.output
    state = json.loads((tmp_path / "dev" / "state.json").read_text())
    try:
        status = runner.invoke(cli, ["dev", "status", "--dir", directory])
        assert status.exit_code == 0, status.output
        assert "kafka  running" in status.output
        assert "minio  running" in status.output
        again = runner.invoke(cli, ["dev", "up", "--dir", directory])  # idempotent: same processes
        assert again.exit_code == 0
        assert json.loads((tmp_path / "dev" / "state.json").read_text()) == state
    finally:
        down = runner.invoke(cli, ["dev", "down", "--dir", directory])
    assert down.exit_code == 0
    assert "stopped: kafka, minio" in down.output
    assert not pid_alive(state["kafka_pid"])
    assert not pid_alive(state["minio_pid"])
    status = runner.invoke(cli, ["dev", "status", "--dir", directory])
    assert status.exit_code == 3
    assert "kafka  stopped" in status.output
