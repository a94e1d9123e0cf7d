"""The freshness benchmark's bookkeeping: nearest-rank percentiles and first sightings of samples."""

from __future__ import annotations

import pytest
from bench.freshness import Visibility, percentile


def test_nearest_rank_percentiles() -> None:
    values = [float(v) for v in range(100, 0, -1)]  # 1..100, unordered
    assert percentile(values, 50) == 50
    assert percentile(values, 99) == 99
    assert percentile(values, 100) == 100
    assert percentile([7.0], 99) == 7
    assert percentile([1.0, 2.0], 50) == 1  # the smallest value with at least half at or below it
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)


def test_only_the_first_sighting_of_a_sample_counts() -> None:
    book = Visibility()
    book.saw((0, 10), produced_ms=1_000, now_ms=3_500)
    book.saw((0, 10), produced_ms=1_000, now_ms=9_000)  # seen again by a later poll: ignored
    book.saw((1, 4), produced_ms=2_000, now_ms=2_250)
    assert len(book) == 2
    assert book.first_ms == {(0, 10): 3_500, (1, 4): 2_250}
    assert book.missing({(0, 10), (1, 4), (2, 0)}) == {(2, 0)}
    assert book.summary() == {"p50": 250, "p99": 2_500, "max": 2_500}
