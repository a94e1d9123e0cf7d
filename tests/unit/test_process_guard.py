"""``stop_process_group`` never signals a group Shale cannot have started. ``os.killpg(1, sig)`` is
``kill(-1, sig)``: every process the caller may signal, for root the whole machine; ``killpg(0, sig)`` is the
caller's own group. On 2026-12-02 a unit test's made-up dev-stack state with pid 1, stopped by ``DevStack.down``,
did exactly that on the shared test machine. Here ``os.killpg`` and ``os.kill`` are replaced before anything runs,
so these tests can signal nothing whatever the code does."""

from __future__ import annotations

import os

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from shale import process


@pytest.fixture
def no_signals(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "killpg", lambda pid, sig: sent.append((pid, sig)))
    monkeypatch.setattr(os, "kill", lambda pid, sig: sent.append((pid, sig)))
    return sent


@example(1)  # kill(-1): every process on the machine
@example(0)  # the caller's own group
@given(st.integers(max_value=1))
def test_a_group_at_or_below_1_is_refused_before_any_signal(pid: int) -> None:
    # Patched by hand, not by a fixture: hypothesis runs the body many times within one test.
    calls: list[int] = []
    real_killpg, real_kill = os.killpg, os.kill
    try:
        os.killpg = lambda p, s: calls.append(p)  # type: ignore[assignment]
        os.kill = lambda p, s: calls.append(p)  # type: ignore[assignment]
        with pytest.raises(ValueError, match="refusing to stop process group"):
            process.stop_process_group(pid, timeout=0)
    finally:
        os.killpg, os.kill = real_killpg, real_kill  # type: ignore[assignment]
    assert calls == []


@pytest.mark.parametrize("pid", [-1, 0, 1])
def test_no_pid_at_or_below_1_is_alive(pid: int, no_signals: list[tuple[int, int]]) -> None:
    assert not process.pid_alive(pid)
    assert no_signals == []
