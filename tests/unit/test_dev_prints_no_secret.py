"""`shale dev up` (and `--env`) never print a secret (issue 59, point 6): the bucket's secret key stays in a file
of the stack's folder that only its owner reads, and the printed `export` line reads it from there, so that
`eval "$(shale dev up --env)"` still sets it and a terminal, a screen share or a CI log never shows it."""

from __future__ import annotations

import json
import stat
import subprocess
from dataclasses import asdict
from pathlib import Path

import pytest
from click.testing import CliRunner

from shale.cli import cli
from shale.dev import DevStack
from shale.dev.stack import SECRET_ENV, StackState

SECRET = "a-secret-nobody-may-see-0123456789"
NO_PID = 2**22 + 1  # above Linux's largest pid_max: no process has it (never 0 or 1, which address groups)


def _state() -> StackState:
    return StackState(kafka_pid=NO_PID, kafka_bootstrap="127.0.0.1:9092", minio_pid=NO_PID, minio_endpoint="http://127.0.0.1:9000",
                      bucket="shale", access_key="shale-dev", secret_key=SECRET)


def _stack(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "state.json").write_text(json.dumps(asdict(_state())))
    return folder


def test_up_env_prints_where_the_secret_is_and_eval_still_sets_it(tmp_path: Path) -> None:
    folder = _stack(tmp_path / "dev")
    done = CliRunner().invoke(cli, ["dev", "up", "--env", "--dir", str(folder)])
    assert done.exit_code == 0, done.output
    assert SECRET not in done.output
    secret_file = DevStack(folder).secret_file("SHALE_BUCKET__SECRET_ACCESS_KEY")
    assert str(secret_file.resolve()) in done.output
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    # The shell that evaluates the exports gets the secret all the same.
    shell = subprocess.run(["bash", "-c", done.output + '\nprintf %s "$SHALE_BUCKET__SECRET_ACCESS_KEY"'],
                           capture_output=True, text=True, check=True)
    assert shell.stdout == SECRET


def test_up_prints_no_secret_after_starting_the_stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "dev"

    def up(self: DevStack, *_: object) -> tuple[StackState, list[str]]:
        folder.mkdir(parents=True, exist_ok=True)
        return _state(), ["started kafka and minio"]

    monkeypatch.setattr(DevStack, "up", up)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    done = CliRunner().invoke(cli, ["dev", "up", "--dir", str(folder)])
    assert done.exit_code == 0, done.output
    assert SECRET not in done.output
    assert "SHALE_BUCKET__SECRET_ACCESS_KEY=" in done.output  # named, with where to read it


def test_every_secret_of_the_stack_is_kept_out_of_the_exports(tmp_path: Path) -> None:
    state = _state()
    stack = DevStack(tmp_path)
    lines = stack.exports(state)
    secrets = {key: value for key, value in state.env().items() if key in SECRET_ENV}
    assert secrets, "the bucket's secret key is one"
    for key in state.env():
        if "SECRET" in key or "PASSWORD" in key or "TOKEN" in key:
            assert key in SECRET_ENV, f"{key} looks like a secret: add it to SECRET_ENV"
    for value in secrets.values():
        assert all(value not in line for line in lines)


def test_down_removes_the_secret_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Nothing may be signalled here: the state's pids are made up (see test_process_guard.py for why it matters).
    monkeypatch.setattr("shale.dev.stack.pid_alive", lambda pid: False)
    monkeypatch.setattr("shale.dev.stack.stop_process_group", _never)
    folder = _stack(tmp_path / "dev")
    stack = DevStack(folder)
    stack.exports(_state())
    assert stack.secret_file("SHALE_BUCKET__SECRET_ACCESS_KEY").exists()
    assert stack.down() == []
    assert not stack.secret_file("SHALE_BUCKET__SECRET_ACCESS_KEY").exists()


def _never(pid: int, timeout: float = 0) -> None:
    raise AssertionError(f"a unit test asked to stop process group {pid}")
