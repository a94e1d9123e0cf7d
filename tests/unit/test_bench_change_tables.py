"""The change-tables benchmark's bookkeeping: a sample is readable at the end of the first read of the latest table
that shows its probe key at its sequence number or later (a later update of the key supersedes it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench.change_tables import Reader
from hypothesis import given
from hypothesis import strategies as st


def test_a_sample_is_readable_at_the_first_read_showing_it_or_a_later_update() -> None:
    reader = Reader(Path("unused.toml"))
    reader.reads = [(1_000.0, {}, 0, 0.5), (2_000.0, {"probe-0": 3}, 10, 0.5), (5_000.0, {"probe-0": 9,
                                                                                             "probe-1": 4}, 12, 0.5)]
    samples = [("probe-0", 2, 900), ("probe-0", 3, 1_500), ("probe-0", 5, 1_600), ("probe-1", 4, 4_000)]
    assert reader.latencies(samples) == [1_100, 500, 3_400, 1_000]
    with pytest.raises(RuntimeError, match="probe-1 at 5 was never readable"):
        reader.latencies([("probe-1", 5, 4_100)])


@given(st.lists(st.dictionaries(st.sampled_from(["probe-0", "probe-1"]), st.integers(0, 20)), min_size=1,
                max_size=8), st.sampled_from(["probe-0", "probe-1"]), st.integers(1, 20))
def test_a_latency_is_never_before_the_first_read_that_shows_the_sample(views: list[dict[str, int]], key: str,
                                                                       seq: int) -> None:
    reader = Reader(Path("unused.toml"))
    reader.reads = [(1_000.0 * (i + 1), view, 0, 0.1) for i, view in enumerate(views)]
    first = next((i for i, view in enumerate(views) if view.get(key, 0) >= seq), None)
    if first is None:
        with pytest.raises(RuntimeError):
            reader.latencies([(key, seq, 0)])
    else:
        assert reader.latencies([(key, seq, 0)]) == [1_000.0 * (first + 1)]
