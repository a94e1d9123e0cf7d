"""`shale compact --until-idle` says why it stopped: the blocks that wait and what closes their job."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shale.cli.compact_cmd import idle_reason
from shale.config import CompactionConfig

queues = st.dictionaries(st.builds(lambda tenant, level: f"{tenant}/L{level}",
                                   st.sampled_from(["acme", "globex", "a/b"]), st.integers(0, 4)),
                         st.integers(1, 10_000), max_size=6)


@given(queues, st.lists(st.integers(2, 50), min_size=1, max_size=3))
def test_every_waiting_queue_and_what_closes_its_job_is_named(queue: dict[str, int], counts: list[int]) -> None:
    config = CompactionConfig(blocks_per_job=counts)
    reason = idle_reason(queue, config)
    if not queue:
        assert reason == "no block waits for compaction"
        return
    assert reason.startswith(f"{sum(queue.values())} blocks wait for a job")
    for name, count in queue.items():
        level = int(name.rsplit("/L", 1)[1])
        assert f"{name}: {count}" in reason
        assert f"level {level} at {counts[min(level, len(counts) - 1)]}" in reason
    assert "compaction.max_age (3600 s" in reason


def test_six_of_twenty_blocks_say_what_the_group_waits_for() -> None:
    reason = idle_reason({"acme/L0": 6}, CompactionConfig())
    assert reason.startswith("6 blocks wait for a job (acme/L0: 6); a queue closes a job at its block count (level 0 "
                             "at 20 blocks")
