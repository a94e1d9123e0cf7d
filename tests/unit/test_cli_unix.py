"""The CLI behaves as Unix users expect (issue 29, cases 5 and 6): a closed pipe ends it quietly by SIGPIPE, and the
global options are accepted after the subcommand too."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from shale.cli import cli, hoist_global_options
from shale.objstore import open_bucket_url


def test_a_closed_pipe_ends_the_command_quietly_by_sigpipe() -> None:
    # The reader closes the pipe before the command writes (as `head` does after its lines): the command must die
    # of SIGPIPE as cat or grep would, with nothing on stderr (no traceback, no abort, no exit status 1 or 134).
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5); from shale.cli import main; "
                                "main(['config', 'explain', '--markdown'])"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout is not None
    process.stdout.close()
    _, err = process.communicate(timeout=60)
    assert process.returncode == -signal.SIGPIPE, err.decode()
    assert err == b""


def test_global_options_after_the_subcommand_apply() -> None:
    runner = CliRunner()
    bad = runner.invoke(cli, ["config", "check", "--set", "kafka.bootstrap_servers=nohost"])
    assert bad.exit_code == 1, bad.output
    assert "kafka.bootstrap_servers = 'nohost'" in bad.output
    ok = runner.invoke(cli, ["config", "show", "--set=bucket.url=memory://after", "--log-format", "json"])
    assert ok.exit_code == 0, ok.output
    assert '"url": "memory://after"' in ok.output


def test_hoisting_keeps_order_and_stops_at_the_separator() -> None:
    assert hoist_global_options(["query", "--tenant", "a", "--set", "x=1", "--config", "c.toml", "{}"]) == [
        "--set", "x=1", "--config", "c.toml", "query", "--tenant", "a", "{}"]
    assert hoist_global_options(["--set", "a=1", "run", "--", "--set", "b=2"]) == [
        "--set", "a=1", "run", "--", "--set", "b=2"]
    assert hoist_global_options(["config", "check"]) == ["config", "check"]


def test_a_broken_connection_is_not_taken_for_a_closed_pipe(tmp_path: Path) -> None:
    # EPIPE from a socket (a service that went away) while standard output is fine must not end the command quietly.
    script = ("import click, shale.cli as c\n"
              "@click.command()\n"
              "def boom():\n"
              "    raise BrokenPipeError(32, 'Broken pipe (a socket)')\n"
              "c.LazyGroup.get_command = lambda self, ctx, name: boom\n"
              "c.main(['boom'])\n")
    with (tmp_path / "out").open("w") as out:
        done = subprocess.run([sys.executable, "-c", script], stdout=out, stderr=subprocess.PIPE, timeout=60,
                              check=False)
    assert done.returncode != -signal.SIGPIPE
    assert done.returncode != 0


def test_the_command_name_is_found_past_global_options() -> None:
    from shale.cli import _command_name

    assert _command_name(["--config", "c.toml", "--set", "x=1", "query", "--tenant", "a"]) == "query"
    assert _command_name(["--log-format", "json", "query"]) == "query"
    assert _command_name(["-h"]) is None
    assert _command_name(["ingest", "query"]) == "ingest"


def test_a_query_ends_with_its_exit_status_and_every_line_of_its_output(tmp_path: Path) -> None:
    """``shale query`` skips native teardown at exit (QUICK_EXIT): its answer, its status and its errors are
    still all there."""
    from tests.factories import write_backup_block

    from shale.config import load_config
    from shale.metastore import AddBlocks, open_metastore

    sets = ["--set", f"bucket.url=file://{tmp_path}/bucket", "--set", f"metastore.data_dir={tmp_path}/ms"]
    config = load_config(env={}, overrides=[s for s in sets if s != "--set"])
    block = write_backup_block(open_bucket_url(f"file://{tmp_path}/bucket"), "acme", "app", 0, 0, 3000)
    assert open_metastore(config).submit(AddBlocks(blocks=[block])).ok
    query = [sys.executable, "-m", "shale.cli", *sets, "query", "--tenant", "acme", "--group", "backup",
             "--from", "0", "--to", "2100-01-01", "--format", "json"]
    done = subprocess.run([*query, '{topic="app"}'], check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 3000
    bad = subprocess.run([*query, '{topic=~"("}'], check=False, capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0
    assert bad.stdout == ""
    assert "Error" in bad.stderr or "error" in bad.stderr
