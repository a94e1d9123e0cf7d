"""The peer benchmark's report: each goal of issue 32 is stated met or missed from the figures, never assumed."""

from __future__ import annotations

from typing import Any

from bench.peers_report import _goals
from hypothesis import given
from hypothesis import strategies as st


def _figures(dup_shale: int | None, dup_sink: int | None) -> dict[str, Any]:
    figures: dict[str, Any] = {
        "records": 1_000_000, "seconds_to_last_commit_shale": 80.0, "seconds_to_last_commit_iceberg_kc": 40.0,
        "records_per_s_once_started_shale": 9_000, "records_per_s_once_started_iceberg_kc": 8_000,
        "iceberg_kc_lowest_working_interval_ms": 1_000, "p99_ms_iceberg_kc_lowest": 19_000,
        "p99_ms_shale": 31_000, "p99_ms_shale_low_latency": 5_000, "missing_shale": 0, "missing_iceberg_kc": 0}
    if dup_shale is not None and dup_sink is not None:
        figures |= {"duplicates_shale": dup_shale, "duplicates_iceberg_kc": dup_sink}
    return figures


@given(throughput=st.floats(0.01, 10), p99=st.floats(0.01, 10), p99_low=st.floats(0.01, 10),
       dup_shale=st.integers(0, 3), dup_sink=st.integers(0, 3))
def test_each_goal_is_met_exactly_when_its_figures_say_so(throughput: float, p99: float, p99_low: float,
                                                         dup_shale: int, dup_sink: int) -> None:
    ratios = {"throughput_vs_iceberg_kc": throughput, "throughput_once_started_vs_iceberg_kc": 1.1,
              "p99_freshness_vs_iceberg_kc_lowest": p99, "p99_freshness_low_latency_vs_iceberg_kc_lowest": p99_low}
    speed, freshness, duplicates = _goals(_figures(dup_shale, dup_sink), ratios)
    verdict = "**met**." if throughput >= 2 else "**missed**."
    assert speed.endswith(f"{verdict} Once started: 1.1x (9,000 against 8,000 records/s).")
    defaults, low = freshness.split("; on the low-latency profile")
    assert defaults.endswith("**met**" if p99 <= 0.5 else "**missed**")
    assert low.endswith("**met**." if p99_low <= 0.5 else "**missed**.")
    assert ("**met**" in duplicates) == (dup_shale == 0)
    assert ("neither has any" in duplicates) == (dup_shale == dup_sink == 0)


def test_duplicates_unread_by_spark_are_not_measured_not_met() -> None:
    ratios = {"throughput_vs_iceberg_kc": 3.0, "throughput_once_started_vs_iceberg_kc": 3.0,
              "p99_freshness_vs_iceberg_kc_lowest": 0.1, "p99_freshness_low_latency_vs_iceberg_kc_lowest": 0.1}
    *_, duplicates = _goals(_figures(None, None), ratios)
    assert "**not measured**" in duplicates
    assert "**met**" not in duplicates
