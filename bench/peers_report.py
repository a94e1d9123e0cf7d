"""The peer benchmark's figures, ratios and notes (``bench/peers.py`` measures; this writes what it measured and
states each goal of issue 32 as met or missed with its figures)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench.common import write_result

SYSTEMS = {"shale": "Shale", "iceberg_kc": "the sink"}
_PREFIX = {"shale": "shale", "iceberg_kc": "kc"}


@dataclass
class Setup:
    records: int
    fresh_rate: int
    fresh_seconds: float
    """Warm-up plus measured window of a freshness run: the producing time objects are counted over."""
    doc: str


def _steady(run: dict[str, Any], records: int) -> float:
    """Records per second once started: from the worker's "Kafka Connect started" or the partition group's
    "ingest started" (its driver warmed, its lease taken) to the last record committed."""
    return float(records / run["after_start_s"])


def _spark(out: dict[str, Any], system: str, field: str, runs: tuple[str, ...] = ("full", "crash")) -> int | None:
    """A Spark SQL count summed over runs; None if Spark could not read one of the tables."""
    checks = [out["spark"][f"{_PREFIX[system]}_{r}"] for r in runs]
    return None if any("error" in c for c in checks) else sum(int(c[field]) for c in checks)


def write_report(out: dict[str, Any], tried: list[str], setup: Setup) -> dict[str, Any]:
    kc, sh, kcc, shc = out["kc_full"], out["shale_full"], out["kc_crash"], out["shale_crash"]
    shale_meta = out["shale_fresh"].books["metastore"].summary()
    shale_low = out["shale_fresh_low"].books["metastore"].summary()
    low = out["kc_fresh_low"]["books"]["sink"].summary()
    per_hour = 3600 / setup.fresh_seconds
    records = setup.records
    figures: dict[str, Any] = {
        "records": records,
        "records_per_s_shale": round(records / sh["seconds"]),
        "records_per_s_iceberg_kc": round(records / kc["seconds"]),
        "seconds_to_last_commit_shale": round(sh["seconds"], 1),
        "seconds_to_last_commit_both_groups_shale": round(sh["all_groups_s"], 1),
        "seconds_to_last_commit_iceberg_kc": round(kc["seconds"], 1),
        "seconds_to_first_commit_shale": round(sh["first_commit_s"], 1),
        "seconds_to_first_commit_iceberg_kc": round(kc["first_commit_s"], 1),
        "records_per_s_once_started_shale": round(_steady(sh, records)),
        "records_per_s_once_started_iceberg_kc": round(_steady(kc, records)),
        "machine_busy_cores_shale_run": sh["load"]["busy_cores"],
        "machine_busy_cores_iceberg_kc_run": kc["load"]["busy_cores"],
        "iceberg_kc_lowest_working_interval_ms": kc["interval"],
        "p50_ms_shale": shale_meta["p50"], "p99_ms_shale": shale_meta["p99"],
        "p50_ms_shale_low_latency": shale_low["p50"], "p99_ms_shale_low_latency": shale_low["p99"],
        "p50_ms_iceberg_kc_lowest": low["p50"], "p99_ms_iceberg_kc_lowest": low["p99"],
    }
    for system in SYSTEMS:  # through Spark SQL's Iceberg runtime: the figures
        for field, name in (("duplicates", "duplicates"), ("missing", "missing"), ("mismatched", "mismatched_rows"),
                            ("unexpected", "unexpected_rows")):
            value = _spark(out, system, field)
            if value is not None:
                figures[f"{name}_{system}"] = value
        crash = _spark(out, system, "duplicates", ("crash",))
        if crash is not None:
            figures[f"duplicates_{system}_crash"] = crash
    figures |= {  # the other readers of the same data
        "duplicates_shale_query_api": shc["check"]["duplicates"] + sh["check"]["duplicates"],
        "missing_shale_query_api": shc["check"]["missing"] + sh["check"]["missing"],
        "duplicates_dropped_by_query_shale": shc["dropped"] + sh["dropped"],
        "duplicates_iceberg_kc_pyiceberg": kcc["check"]["duplicates"] + kc["check"]["duplicates"],
        "missing_iceberg_kc_pyiceberg": kcc["check"]["missing"] + kc["check"]["missing"],
        "objects_per_hour_shale_l0": round(out["shale_fresh"].objects["l0_objects"] * per_hour),
        "objects_per_hour_shale_after_compaction": round(out["shale_fresh"].after["live_objects"] * per_hour),
        "objects_per_hour_shale_low_latency_l0": round(out["shale_fresh_low"].objects["l0_objects"] * per_hour),
        "objects_per_hour_shale_low_latency_after_compaction":
            round(out["shale_fresh_low"].after["live_objects"] * per_hour),
        "objects_per_hour_iceberg_kc_lowest": round(out["kc_fresh_low"]["objects"] * per_hour),
        "fresh_rate_records_per_s": setup.fresh_rate,
    }
    if "kc_fresh_default" in out:
        default = out["kc_fresh_default"]["books"]["sink"].summary()
        figures |= {"p50_ms_iceberg_kc_default": default["p50"], "p99_ms_iceberg_kc_default": default["p99"],
                    "objects_per_hour_iceberg_kc_default": round(out["kc_fresh_default"]["objects"] * per_hour)}
    reference = figures.get("p99_ms_iceberg_kc_default", low["p99"])
    baseline = {"records_per_s_iceberg_kc": figures["records_per_s_iceberg_kc"],
                "p99_ms_iceberg_kc_default": reference, "p99_ms_iceberg_kc_lowest": low["p99"]}
    ratios = {"throughput_vs_iceberg_kc": round(kc["seconds"] / sh["seconds"], 2),
              "throughput_once_started_vs_iceberg_kc": round(_steady(sh, records) / _steady(kc, records), 2),
              "p99_freshness_vs_iceberg_kc": round(shale_meta["p99"] / reference, 3),
              "p99_freshness_vs_iceberg_kc_lowest": round(shale_meta["p99"] / low["p99"], 3),
              "p99_freshness_low_latency_vs_iceberg_kc_lowest": round(shale_low["p99"] / low["p99"], 3)}
    notes = "\n".join([setup.doc, "In this run:", "", *_goals(figures, ratios), *_run_notes(out, tried)])
    return write_result("peers", figures, baseline, ratios, notes)


def _met(ok: bool) -> str:
    return "**met**" if ok else "**missed**"


def _goals(f: dict[str, Any], r: dict[str, float]) -> list[str]:
    """Each goal of issue 32, met or missed, with its figures."""
    lines = [f"* Goal, throughput at least 2x the sink's (to the last record committed, {f['records']:,} records, "
             f"from process start): {r['throughput_vs_iceberg_kc']}x ({f['seconds_to_last_commit_shale']} s "
             f"against {f['seconds_to_last_commit_iceberg_kc']} s): {_met(r['throughput_vs_iceberg_kc'] >= 2)}. "
             f"Once started: {r['throughput_once_started_vs_iceberg_kc']}x "
             f"({f['records_per_s_once_started_shale']:,} against {f['records_per_s_once_started_iceberg_kc']:,} "
             "records/s).",
             f"* Goal, p99 freshness at most half the sink's at its lowest working interval "
             f"({f['iceberg_kc_lowest_working_interval_ms']} ms: p99 {f['p99_ms_iceberg_kc_lowest'] / 1000:.1f} s): "
             f"Shale on defaults {r['p99_freshness_vs_iceberg_kc_lowest']}x (p99 {f['p99_ms_shale'] / 1000:.1f} s): "
             f"{_met(r['p99_freshness_vs_iceberg_kc_lowest'] <= 0.5)}; on the low-latency profile "
             f"{r['p99_freshness_low_latency_vs_iceberg_kc_lowest']}x "
             f"(p99 {f['p99_ms_shale_low_latency'] / 1000:.1f} s): "
             f"{_met(r['p99_freshness_low_latency_vs_iceberg_kc_lowest'] <= 0.5)}."]
    if "duplicates_shale" in f and "duplicates_iceberg_kc" in f:
        shale, sink = f["duplicates_shale"], f["duplicates_iceberg_kc"]
        verdict = _met(shale == 0) + (" (neither has any)" if shale == sink == 0 else "")
        lines.append(f"* Goal, no duplicates where the sink has some (both tables through Spark SQL's Iceberg "
                     f"runtime, full topic and crash run): Shale {shale}, the sink {sink}: {verdict}. Missing: "
                     f"Shale {f.get('missing_shale')}, the sink {f.get('missing_iceberg_kc')}.")
    else:
        lines.append("* Goal, no duplicates: **not measured** through Spark SQL (a table could not be read; see "
                     "below); the other readers' figures stand.")
    return lines


def _run_notes(out: dict[str, Any], tried: list[str]) -> list[str]:
    kc, sh, kcc, shc = out["kc_full"], out["shale_full"], out["kc_crash"], out["shale_crash"]
    spark = out["spark"]
    lines = [f"* Commit intervals tried for the sink: {'; '.join(tried)}.",
             f"* Full topic, through Spark SQL (Iceberg runtime): the sink {spark['kc_full']}; Shale "
             f"{spark['shale_full']}. Through the other readers: the sink (pyiceberg) {kc['check']} in "
             f"{kc['snapshots']} snapshots; Shale (the `shale query` Python API) {sh['check']}, {sh['dropped']} "
             "duplicate rows dropped by the query.",
             f"* Crash: the sink killed at {kcc['killed_at']:,} committed records, Shale at {shc['killed_at']:,}. "
             f"Through Spark SQL: the sink {spark['kc_crash']}; Shale {spark['shale_crash']}. Other readers: the sink "
             f"(pyiceberg) {kcc['check']}; Shale (query API) {shc['check']}, {shc['dropped']} dropped by the query.",
             f"* Load: the 1-minute load average (2 cores; the benchmark's own processes count) was "
             f"{min(out['loadavg']):.1f}-{max(out['loadavg']):.1f} at the phases' ends; what else ran shows as "
             f"'other' and 'steal' below. Cores busy on the whole machine: full-topic runs, the sink "
             f"{kc['load']['busy_cores']}, Shale {sh['load']['busy_cores']}; crash runs, the sink "
             f"{kcc['load']['busy_cores']}, Shale {shc['load']['busy_cores']}; the sink's freshness window "
             f"{out['kc_fresh_low']['busy_cores']} ({out['kc_fresh_low']['steal_cores']} stolen); Shale's freshness "
             f"windows by process, defaults {out['shale_fresh'].cores}, low latency {out['shale_fresh_low'].cores}."]
    if "kc_fresh_default_error" in out:
        lines.append(f"* The sink at its default interval failed: {out['kc_fresh_default_error'][:500]}")
    return lines
