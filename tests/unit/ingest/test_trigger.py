"""The time policy of a caught-up group: the next plan comes the group's trigger interval after the last one started,
at once when the batch took longer (a clock is faked; nothing sleeps). The partition group's is
``ingest.trigger_interval``, the backup group's ``ingest.backup_trigger_interval``."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from shale.config import load_config
from shale.ingest.job import IngestJob
from shale.ingest.plan import BatchPlan, PartitionRange


class _Recorded(threading.Event):
    """Records every wait instead of waiting, and stops the loop after ``limit`` of them."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout if timeout is not None else -1.0)
        if len(self.waits) >= self.limit:
            self.set()
        return self.is_set()


@pytest.mark.parametrize(("group", "batch_seconds", "expected_wait"), [
    ("backup", 1.5, 3.0), ("backup", 4.5, 0.0), ("backup", 12.0, 0.0), ("partition", 1.5, 1.5)])
def test_a_caught_up_group_plans_again_one_interval_after_its_last_plan(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, group: str, batch_seconds: float,
        expected_wait: float) -> None:
    config = load_config(env={}, overrides=[
        "bucket.url=memory://", f"metastore.data_dir={tmp_path}", "ingest.topic_pattern=app",
        "ingest.backup_trigger_interval=5s", "ingest.trigger_interval=3.5s",
        'ingest.parsers=[{topic_pattern = "app", parser = "json"}]'])
    job = IngestJob(config, group)
    now = [1000.0]
    monkeypatch.setattr("shale.ingest.job.time.monotonic", lambda: now[0])

    def plan(targets: object = None) -> BatchPlan:
        now[0] += 0.5  # planning takes time too: it counts against the interval
        return BatchPlan(0, [PartitionRange("app", 0, "id", 0, 10)])  # caught up: no lag left after it

    def batch(_: BatchPlan) -> str:
        now[0] += batch_seconds
        return "committed"

    job._warm = lambda: None  # type: ignore[method-assign]  # no Spark application in a unit test
    job.plan = plan  # type: ignore[method-assign]
    job.run_batch = batch  # type: ignore[method-assign]
    stop = _Recorded(limit=3)
    job.run(stop=stop)
    assert stop.waits == [pytest.approx(expected_wait)] * 3


def test_a_failing_batch_waits_a_growing_delay_even_when_batches_run_back_to_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches back to back (trigger 0 s, the low-latency profile) must not turn a failing bucket or Spark into a
    tight loop of failed batches: the retry delay starts at a second and doubles."""
    config = load_config(env={}, overrides=["bucket.url=memory://", f"metastore.data_dir={tmp_path}",
                                            "ingest.topic_pattern=app", "ingest.trigger_interval=0s"])
    job = IngestJob(config, "backup")
    monkeypatch.setattr("shale.ingest.job.time.monotonic", lambda: 1000.0)

    def batch(_: BatchPlan) -> str:
        raise OSError("the bucket is down")

    job._warm = lambda: None  # type: ignore[method-assign]
    job.plan = lambda targets=None: BatchPlan(0, [PartitionRange("app", 0, "id", 0, 10)])  # type: ignore[method-assign]
    job.run_batch = batch  # type: ignore[method-assign]
    stop = _Recorded(limit=4)
    job.run(stop=stop)
    assert stop.waits == [2.0, 4.0, 8.0, 16.0]
