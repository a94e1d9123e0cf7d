"""The scale benchmark's report: each ratio is its two figures' quotient, present only when both were measured (the
targets are judged from the ratios by bench/targets.py, as every benchmark's)."""

from __future__ import annotations

from typing import Any

from bench.scale import ratios_of
from hypothesis import given
from hypothesis import strategies as st

FIGURES = ("objects_per_hour_l0_shale_{n}", "entries_per_hour_shale_{n}", "objects_per_hour_iceberg_kc_{n}",
           "p99_ms_shale_{n}", "p99_ms_shale_low_latency_{n}", "p99_ms_iceberg_kc_{n}",
           "seconds_to_last_commit_shale_{n}", "seconds_to_last_commit_iceberg_kc_{n}", "p99_ms_kafka_consumer_{n}")


@given(values=st.dictionaries(st.sampled_from([f.format(n=n) for f in FIGURES for n in (8, 256, 2048)]),
                              st.integers(1, 10**6)))
def test_a_ratio_is_the_quotient_of_two_measured_figures(values: dict[str, Any]) -> None:
    ratios = ratios_of(values)
    expected = {"objects_256_vs_8": ("objects_per_hour_l0_shale_256", "objects_per_hour_l0_shale_8"),
                "entries_256_vs_8": ("entries_per_hour_shale_256", "entries_per_hour_shale_8"),
                "objects_2048_vs_8": ("objects_per_hour_l0_shale_2048", "objects_per_hour_l0_shale_8"),
                "entries_2048_vs_8": ("entries_per_hour_shale_2048", "entries_per_hour_shale_8"),
                "p99_vs_kafka_consumer_2048": ("p99_ms_shale_2048", "p99_ms_kafka_consumer_2048"),
                "p99_vs_iceberg_kc_2048": ("p99_ms_shale_2048", "p99_ms_iceberg_kc_2048"),
                "objects_vs_iceberg_kc_256": ("objects_per_hour_l0_shale_256", "objects_per_hour_iceberg_kc_256"),
                "p99_vs_iceberg_kc_256": ("p99_ms_shale_256", "p99_ms_iceberg_kc_256"),
                "p99_low_latency_vs_iceberg_kc_8": ("p99_ms_shale_low_latency_8", "p99_ms_iceberg_kc_8"),
                "throughput_vs_iceberg_kc_256": ("seconds_to_last_commit_iceberg_kc_256",
                                                 "seconds_to_last_commit_shale_256"),
                "throughput_vs_iceberg_kc_8": ("seconds_to_last_commit_iceberg_kc_8",
                                               "seconds_to_last_commit_shale_8")}
    for name, (a, b) in expected.items():
        if a in values and b in values:
            assert ratios[name] == round(values[a] / values[b], 3)
        else:
            assert name not in ratios

