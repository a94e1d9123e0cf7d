"""The cost forecast (``shale.cost``, ``shale config cost``): the cost page's worked example on defaults, and what
each input does to it, as properties; ``bench/cost.py`` checks it against a run."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from shale.cli import cli
from shale.config import ShaleConfig
from shale.cost import WORKER_RESIDENT, CostLine, Load, forecast, total
from shale.ingest import chunk_bytes

DEFAULTS = ShaleConfig()


def line(lines: list[CostLine], kind: str) -> CostLine:
    return next(x for x in lines if x.kind.startswith(kind))


def test_the_cost_pages_example_on_defaults() -> None:
    """docs/OPERATING.md: one tenant and one topic of 8 partitions on 2 cores per group: the partition group writes
    720 x 2 x 1 x 2 = 2,880 level-0 objects an hour, the backup group 480, 840 deltas; compaction reads 1,680
    source objects in 84 jobs and writes 168 objects at level 1."""
    lines = forecast(DEFAULTS, Load(rate=20_000, record_bytes=125, partitions=8, cores=2))
    assert line(lines, "level-0 block (partition").objects == 2_880
    assert line(lines, "level-0 block (backup").objects == 480
    assert line(lines, "level-0 block (partition").get == 1_440  # meta.json looked for first, once a block
    level1 = line(lines, "compaction output (level 1)")
    assert level1.objects == pytest.approx(168)
    assert level1.get == pytest.approx(1_680 + 84)  # every source data object, and each job's meta.json
    jobs = 84 + 8.4 + 0.84  # levels 1, 2 and 3 (compaction.max_level)
    assert line(lines, "bucket-index delta").put == pytest.approx(840 + jobs)  # and a compaction report's each
    assert line(lines, "bucket index").put == 360  # one look every 5 s, a write every two looks
    assert line(lines, "deletion mark").put == pytest.approx(1_680 + 84 + 8.4)  # every replaced block's mark
    assert not any(x.kind.startswith("Iceberg") for x in lines)


@given(rate=st.floats(1, 10**6), size=st.integers(1, 10**5), partitions=st.integers(1, 10**4),
       cores=st.integers(1, 64), behind=st.floats(0, 600), group=st.sampled_from(["partition", "backup"]))
def test_a_group_behind_its_trigger_writes_in_proportion_to_its_batch_time(
        rate: float, size: int, partitions: int, cores: int, behind: float, group: str) -> None:
    """A batch time within the trigger changes nothing; a longer one divides the group's level-0 blocks by it (as
    long as a task's records fit one chunk)."""
    load = Load(rate, size, partitions, cores)
    trigger = DEFAULTS.ingest.trigger_interval if group == "partition" else DEFAULTS.ingest.backup_trigger_interval
    kept_up = line(forecast(DEFAULTS, load), f"level-0 block ({group}")
    slowed = line(forecast(DEFAULTS, load, {group: behind}), f"level-0 block ({group}")
    chunk = chunk_bytes(DEFAULTS.ingest.max_task_bytes, WORKER_RESIDENT, group)
    chunks = math.ceil(rate * size * max(trigger, behind) / min(partitions, cores) / chunk)
    if behind <= trigger:
        assert slowed == kept_up
    elif chunks <= 1:
        assert slowed.objects == pytest.approx(kept_up.objects * trigger / behind)


@given(partitions=st.integers(1, 10**4), cores=st.integers(1, 64))
def test_tasks_stop_at_the_cores(partitions: int, cores: int) -> None:
    """k = min(partitions, cores): more partitions than cores add no objects (the scale benchmark's flat counts)."""
    lines = forecast(DEFAULTS, Load(1_000, 100, partitions, cores))
    more = forecast(DEFAULTS, Load(1_000, 100, partitions + cores, cores))
    assert (line(lines, "level-0").objects == line(more, "level-0").objects) == (partitions >= cores)


def test_a_task_over_its_chunk_writes_more_blocks() -> None:
    """100 MB a second over 2 tasks: a backup task reads 1.5 GB a 30 s batch, far over its chunk, so its blocks are
    split; a quarantine adds a dataset to partition-group blocks only."""
    small = forecast(DEFAULTS, Load(1_000, 1_000, 8, 2))
    big = forecast(DEFAULTS, Load(100_000, 1_000, 8, 2))
    assert line(big, "level-0 block (backup").objects > 10 * line(small, "level-0 block (backup").objects
    bad = forecast(DEFAULTS, Load(1_000, 1_000, 8, 2, quarantine=True))
    assert line(bad, "level-0 block (partition").objects == 1.5 * line(small, "level-0 block (partition").objects
    assert line(bad, "level-0 block (backup").objects == line(small, "level-0 block (backup").objects


def test_iceberg_publishing_adds_snapshots() -> None:
    config = DEFAULTS.model_copy(update={"iceberg": DEFAULTS.iceberg.model_copy(update={"enabled": True})})
    lines = forecast(config, Load(20_000, 125, 8, 2))
    partition_jobs = 720 * 2 / 20 + 720 * 2 / 20 / 10 + 720 * 2 / 20 / 100
    assert line(lines, "Iceberg").objects == pytest.approx(3 * (720 + partition_jobs))


def test_a_zero_trigger_needs_a_batch_time() -> None:
    config = ShaleConfig.model_validate({"ingest": {"trigger_interval": "0s"}})
    with pytest.raises(ValueError, match="--batch-seconds partition=SECONDS"):
        forecast(config, Load(1, 1, 1, 1))
    assert line(forecast(config, Load(1, 1, 1, 1), {"partition": 2.0}), "level-0 block (partition").objects == 3_600


def test_the_command_prints_every_kind_and_their_total() -> None:
    runner = CliRunner()
    result = runner.invoke(cli, ["config", "cost", "--rate", "20000", "--record-bytes", "125", "--partitions", "8",
                                 "--cores", "2", "--json"])
    assert result.exit_code == 0, result.output
    lines = json.loads(result.output)
    assert lines[-1]["kind"] == "total"
    assert lines[-1]["put"] == pytest.approx(sum(x["put"] for x in lines[:-1]), abs=1)
    assert lines[0] == {"kind": "level-0 block (backup group)", "objects": 480, "put": 480, "get": 240, "list": 0,
                        "delete": 0}
    text = runner.invoke(cli, ["config", "cost", "--rate", "20000", "--partitions", "8", "--cores", "2"]).output
    assert "level-0 block (partition group)" in text
    assert "2,880" in text
    bad = runner.invoke(cli, ["config", "cost", "--rate", "1", "--partitions", "8", "--batch-seconds", "ingest=3"])
    assert bad.exit_code == 2
    assert "not an ingest group" in bad.output
    assert total([]).put == 0
