"""The first SIGINT or SIGTERM asks a long command to stop at its next safe point (one line, exit 128 + signal);
a second stops it at once, with no traceback; a SparkContext's own SIGINT handler does not stay installed."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

PROGRAM = """
import signal, sys, time
from shale.signals import Stopper
stopper = Stopper("demo").install()
print("ready", flush=True)
while not stopper.event.is_set():
    time.sleep(0.01)
print("safe point", flush=True)
if sys.argv[1] == "twice":
    time.sleep(60)  # a long step: the second signal must not wait for it
sys.exit(stopper.exit_code)
"""


def _start(mode: str) -> subprocess.Popen[str]:
    process = subprocess.Popen([sys.executable, "-c", PROGRAM, mode], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None
    assert process.stdout.readline() == "ready\n"
    return process


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_the_first_signal_stops_at_the_next_safe_point(sig: signal.Signals, code: int) -> None:
    process = _start("once")
    process.send_signal(sig)
    out, err = process.communicate(timeout=30)
    assert process.returncode == code
    assert out == "safe point\n"
    assert err == f"demo: stopping at the next safe point ({sig.name}); send it again to stop at once\n"


def test_a_second_signal_stops_at_once_without_a_traceback() -> None:
    process = _start("twice")
    process.send_signal(signal.SIGINT)
    assert process.stdout is not None
    assert process.stdout.readline() == "safe point\n"
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=30)  # the 60 s step would outlast it
    assert process.returncode == 130
    assert "Traceback" not in err
    assert err.endswith("demo: stopped at once (SIGINT again)\n")


def test_keep_handler_puts_the_previous_handler_back() -> None:
    from shale.signals import keep_handler

    def mine(*_: object) -> None: ...

    before = signal.signal(signal.SIGINT, mine)
    try:
        with keep_handler():
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # as SparkContext's start does with its own
        assert signal.getsignal(signal.SIGINT) is mine
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_ctrl_c_no_command_handles_is_one_line_and_130() -> None:
    import click
    from click.testing import CliRunner

    from shale.cli.common import shale_errors

    @click.command()
    @shale_errors
    def verify() -> None:
        raise KeyboardInterrupt

    result = CliRunner().invoke(verify, [])
    assert result.exit_code == 130
    assert result.output == "shale verify: interrupted\n"
