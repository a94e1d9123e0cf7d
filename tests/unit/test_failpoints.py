"""Failpoint actions: disabled costs nothing; ``sleep-once`` and ``pause-once`` act in the first process only;
a bad action is an error naming the allowed ones."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest
from tests.waiting import eventually

from shale.failpoints import failpoint, paused, paused_pid


def _reach(name: str) -> None:
    failpoint(name)


def test_disabled_failpoints_return_at_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SHALE_FAILPOINTS", "other")
    monkeypatch.setenv("SHALE_FAILPOINT_DIR", str(tmp_path))
    failpoint("ingest.task")
    assert paused(tmp_path, "ingest.task") == []


def test_sleep_once_acts_in_the_first_caller_only(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SHALE_FAILPOINTS", "a, ingest.task=sleep-once:0.01")
    monkeypatch.setenv("SHALE_FAILPOINT_DIR", str(tmp_path))
    failpoint("ingest.task")
    failpoint("ingest.task")
    (first,) = paused(tmp_path, "ingest.task")
    assert paused_pid(first) > 0


def test_pause_once_stops_one_process_and_lets_the_others_pass(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    monkeypatch.setenv("SHALE_FAILPOINTS", "compaction.merge=pause-once")
    monkeypatch.setenv("SHALE_FAILPOINT_DIR", str(tmp_path))
    context = multiprocessing.get_context("fork")
    first = context.Process(target=_reach, args=("compaction.merge",))
    first.start()
    eventually(lambda: paused(tmp_path, "compaction.merge"), 30, "the first process to pause")
    second = context.Process(target=_reach, args=("compaction.merge",))
    second.start()
    second.join(timeout=30)
    assert second.exitcode == 0  # it passed
    assert first.is_alive()  # still paused
    assert [paused_pid(p) for p in paused(tmp_path, "compaction.merge")] == [first.pid]
    first.kill()
    first.join()


def test_an_unknown_action_is_an_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SHALE_FAILPOINTS", "x=explode")
    monkeypatch.setenv("SHALE_FAILPOINT_DIR", str(tmp_path))
    with pytest.raises(RuntimeError, match="unknown action 'explode'"):
        failpoint("x")
