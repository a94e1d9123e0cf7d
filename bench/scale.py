"""Flat cost as topics grow (issue 40): what Shale and the Apache Iceberg Kafka Connect sink write, how fresh and how
fast they are, on a topic of 8 partitions and on one of 256, in one run on the same broker and MinIO.

Everything is the peers benchmark's (``bench/peers.py``; the sink run by ``bench/connect.py``): its records (JSON
of about 130 bytes), its producer (the freshness benchmark's, ``bench/freshness.py``: 20,000 records/s round-robin
over the partitions, one sample per partition every 100 ms after the warm-up), its windows (``PEERS_FRESH_WARMUP``
30 s + ``PEERS_FRESH_DURATION`` 60 s of producing), its full topics (``PEERS_RECORDS``, one million records) and
its way of finding the sink's lowest working commit interval (``peers.lowest_working_interval``: the lowest of
1, 2, 5 and 10 s at which the sink committed a full topic with no failed commit), found on each topic. Shale runs
as ``shale run`` on defaults (both ingest groups, the metastore and a compaction worker), each phase a fresh
deployment, topic and bucket prefix. ``SCALE_PARTITIONS`` (default ``8,256,2048``) sets the partition counts: the
first is the reference every other is compared with; issue 40's targets are on 256, and 2,048 (issue 55) is as many
as one broker on this machine holds beside the sink's and Shale's topics of the same count.

For each partition count, in this order:

* Full topic: the topic filled first; the sink at its lowest working interval, then Shale with its Iceberg
  publishing on (as the peers benchmark runs it), each from process start to the last record committed (the sink:
  its table's ``total-records``; Shale: the partition group's committed offsets, and both groups').
  ``l0_objects_full_topic_shale_N`` is every level-0 object Shale's two groups wrote for it.
* Steady load: the sink at that interval, Shale on defaults, and Shale on the low-latency profile
  (``bench.freshness.LOW_LATENCY``: only the partition group, trigger 0 s), each on its own topic of N partitions
  for the warm-up and the window. p99 is from a sample's ``produce()`` to the first 250 ms poll that returns it:
  Shale through the metastore source (``shale query`` Python API), the sink through pyiceberg on its catalog;
  Kafka's own consumer (confluent-kafka, assigned every partition) on the same topic is the floor.
  ``objects_per_hour_l0_shale_N`` counts the level-0 objects (data objects and meta.json, both groups) in the
  bucket, and ``entries_per_hour_shale_N`` the level-0 block entries in the metastore (those still there and those
  compaction replaced: the level-0 sources of compacted blocks), written from the producer's start until every
  sample was visible through the metastore and the bucket index, scaled to an hour as x 3600 / (warm-up + window):
  what an hour of this load writes when the deployment keeps up, and more than that per hour of producing when it
  falls behind (the drain's batches are counted, not its time). The sink's ``objects_per_hour_iceberg_kc_N``
  counts every object it wrote (data files, manifests, manifest lists, table metadata) the same way. Shale's
  compactor runs during the run; the count does not wait for it to finish. The cost page's forecast is checked
  against a steady window by ``bench/cost.py``.

A phase that fails (the sink finding no working commit interval, a sample of Shale's not visible within 10
minutes) is reported in the notes and leaves its figures out; the others stand. The broker has a 2 GiB heap (the
other benchmarks' 768 MiB), as it holds four topics of each partition count.
"""

from __future__ import annotations

import os
import signal
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from bench import freshness as fr
from bench import peers
from bench.common import progress, write_result
from bench.services import kafka_broker, minio_bucket
from shale.config import BucketConfig

COUNTS = tuple(int(n) for n in os.environ.get("SCALE_PARTITIONS", "8,256,2048").split(","))
"""The partition counts compared: the first is the reference every other is compared with."""


def measure_count(root: Path, bootstrap: str, bucket: BucketConfig, n: int) -> dict[str, Any]:
    """Every phase on topics of ``n`` partitions: the full topic (the sink's lowest working interval found on it),
    then the steady load on the sink, Shale on defaults and Shale on the low-latency profile."""
    def sub(name: str) -> BucketConfig:
        return bucket.model_copy(update={"url": f"{bucket.url}/{name}-{n}"})

    out: dict[str, Any] = {"loadavg": [os.getloadavg()[0]], "errors": {}, "tried": []}

    def phase(key: str, what: str, measure: Callable[[], Any]) -> None:
        """One phase's result in ``out[key]``; one that fails is reported, not hidden: the others stand."""
        progress(f"{n} partitions: {what}")
        try:
            out[key] = measure()
        except RuntimeError as exc:
            out["errors"][key] = str(exc)[:2000]
            progress(f"{n} partitions: {what} failed: {exc}")
        out["loadavg"].append(os.getloadavg()[0])

    topic = f"scale-full-{n}"
    progress(f"{n} partitions: filling {topic} with {peers.RECORDS:,} records")
    ends = peers.fill_topic(bootstrap, topic, peers.RECORDS, n)
    try:
        out["kc_full"], out["tried"] = peers.lowest_working_interval(root, bootstrap, bucket, topic, ends)
    except RuntimeError as exc:  # no interval worked: the sink's steady load is not run
        out["errors"]["kc_full"] = str(exc)[:2000]
    out["loadavg"].append(os.getloadavg()[0])
    phase("shale_full", "Shale on defaults on the full topic",
          lambda: peers.shale_full_topic(root / f"shale-full-{n}", bootstrap, sub("shale-full"), topic, ends,
                                         kill=False))
    if "kc_full" in out:
        interval = out["kc_full"]["interval"]
        phase("kc_fresh", f"steady load, the sink at {interval} ms",
              lambda: peers.kc_freshness(root / f"kc-fresh-{n}", bootstrap, sub("kc-fresh"), interval, partitions=n))
    for key, profile in (("shale_fresh", {}), ("shale_fresh_low", cast(dict[str, dict[str, Any]], fr.LOW_LATENCY))):
        name = f"scale-{key.replace('_', '-')}-{n}"
        phase(key, f"steady load, Shale ({key})",
              lambda name=name, profile=profile, key=key: peers.shale_freshness(
                  name, profile, root / name, bootstrap, sub(key), n, settle=False))
    return out


def figures_of(n: int, out: dict[str, Any]) -> dict[str, Any]:
    """One partition count's figures, named ``..._N``: those of the phases that ran."""
    per_hour = 3600 / (peers.FRESH_WARMUP + peers.FRESH_DURATION)
    figures: dict[str, Any] = {}
    if kc := out.get("kc_full"):
        figures |= {f"iceberg_kc_lowest_working_interval_ms_{n}": kc["interval"],
                    f"seconds_to_last_commit_iceberg_kc_{n}": round(kc["seconds"], 1),
                    f"records_per_s_iceberg_kc_{n}": round(peers.RECORDS / kc["seconds"])}
    if sh := out.get("shale_full"):
        figures |= {f"seconds_to_last_commit_shale_{n}": round(sh["seconds"], 1),
                    f"seconds_to_last_commit_both_groups_shale_{n}": round(sh["all_groups_s"], 1),
                    f"records_per_s_shale_{n}": round(peers.RECORDS / sh["seconds"]),
                    f"l0_objects_full_topic_shale_{n}": sh["objects"]["l0_objects"]}
    if kc_fresh := out.get("kc_fresh"):
        sink = kc_fresh["books"]["sink"].summary()
        figures |= {f"objects_per_hour_iceberg_kc_{n}": round(kc_fresh["objects"] * per_hour),
                    f"p50_ms_iceberg_kc_{n}": sink["p50"], f"p99_ms_iceberg_kc_{n}": sink["p99"],
                    f"p99_ms_kafka_consumer_iceberg_kc_run_{n}": kc_fresh["books"]["kafka"].summary()["p99"]}
    for key, suffix in (("shale_fresh", ""), ("shale_fresh_low", "_low_latency")):
        if key not in out:
            continue
        run: fr.ProfileResult = out[key]
        meta = run.books["metastore"].summary()
        figures |= {f"p50_ms_shale{suffix}_{n}": meta["p50"], f"p99_ms_shale{suffix}_{n}": meta["p99"],
                    f"max_ms_shale{suffix}_{n}": meta["max"],
                    f"p99_ms_kafka_consumer{suffix}_{n}": run.books["kafka"].summary()["p99"],
                    f"objects_per_hour_l0_shale{suffix}_{n}": round(run.written["l0_objects"] * per_hour),
                    f"blocks_per_hour_l0_shale{suffix}_{n}": round(run.written["l0_blocks"] * per_hour),
                    f"entries_per_hour_shale{suffix}_{n}": round(run.written["l0_entries"] * per_hour),
                    f"produce_records_per_s{suffix}_{n}": round(run.produced["sent"] / run.produced["elapsed"])}
    return figures


def ratios_of(f: dict[str, Any]) -> dict[str, float]:
    """Each partition count against the smallest (objects and entries per hour), and against the sink (objects, p99,
    a full topic's throughput); a ratio whose figures are missing is left out."""
    small = COUNTS[0]
    pairs = (
            *((f"objects_{n}_vs_{small}", f"objects_per_hour_l0_shale_{n}", f"objects_per_hour_l0_shale_{small}")
              for n in COUNTS[1:]),
            *((f"entries_{n}_vs_{small}", f"entries_per_hour_shale_{n}", f"entries_per_hour_shale_{small}")
              for n in COUNTS[1:]),
            *((f"objects_vs_iceberg_kc_{n}", f"objects_per_hour_l0_shale_{n}", f"objects_per_hour_iceberg_kc_{n}")
              for n in COUNTS),
            *((f"p99_vs_iceberg_kc_{n}", f"p99_ms_shale_{n}", f"p99_ms_iceberg_kc_{n}") for n in COUNTS),
            *((f"p99_low_latency_vs_iceberg_kc_{n}", f"p99_ms_shale_low_latency_{n}", f"p99_ms_iceberg_kc_{n}")
              for n in COUNTS),
            *((f"p99_vs_kafka_consumer_{n}", f"p99_ms_shale_{n}", f"p99_ms_kafka_consumer_{n}") for n in COUNTS),
            *((f"throughput_vs_iceberg_kc_{n}", f"seconds_to_last_commit_iceberg_kc_{n}",
               f"seconds_to_last_commit_shale_{n}") for n in COUNTS))
    return {name: round(f[a] / f[b], 3) for name, a, b in pairs if a in f and b in f}


def _notes(runs: dict[int, dict[str, Any]]) -> str:
    notes = [__doc__ or "", "In this run:", ""]
    for n, out in runs.items():
        busy = {"the sink": out.get("kc_full", {}).get("load", {}).get("busy_cores"),
                "Shale": out.get("shale_full", {}).get("load", {}).get("busy_cores")}
        notes.append(f"* {n} partitions: commit intervals tried for the sink: {'; '.join(out['tried']) or 'none'}. "
                     f"1-minute load average at the phases' ends {', '.join(f'{v:.1f}' for v in out['loadavg'])}. "
                     f"Cores busy on the machine in the full-topic runs: "
                     f"{', '.join(f'{k} {v}' for k, v in busy.items() if v is not None)}; in the sink's steady "
                     f"window {out.get('kc_fresh', {}).get('busy_cores')}.")
        for key in ("shale_fresh", "shale_fresh_low"):
            if key in out:
                r: fr.ProfileResult = out[key]
                notes.append(f"  * {key}: written from the producer's start to the last sample visible {r.written}; "
                             f"{r.breakdown['batches']:.0f} partition-group batches of "
                             f"{r.breakdown['records']:,.0f} records on average in the window, each a gap of "
                             f"{r.breakdown['gap_s']:.2f} s before it (the plan {r.breakdown['plan_s']:.2f} s), Spark "
                             f"batch {r.breakdown['spark_s']:.2f} s, commit step {r.breakdown['commit_s']:.2f} s "
                             f"(the metastore's commit {r.breakdown['metastore_commit_s']:.2f} s); a reader's poll "
                             f"{', '.join(f'{k} {v:.3f} s' for k, v in r.poll_s.items())}; cores by process "
                             f"{r.cores}.")
        notes += [f"  * {key} failed: {error[:600]}" for key, error in out["errors"].items()]
    return "\n".join(notes)


def run() -> dict[str, Any]:
    signal.signal(signal.SIGTERM, peers._stopped)  # stopped: clean up every service it started
    figures: dict[str, Any] = {"records": peers.RECORDS, "rate_records_per_s": peers.FRESH_RATE,
                               "steady_seconds": peers.FRESH_WARMUP + peers.FRESH_DURATION}
    runs: dict[int, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="shale-bench-scale-") as tmp, kafka_broker(heap="2g") as broker, \
            minio_bucket() as bucket:
        for n in COUNTS:
            runs[n] = measure_count(Path(tmp), broker.bootstrap_servers, bucket, n)
            figures |= figures_of(n, runs[n])
            progress(f"{n} partitions: {figures}")
    ratios = ratios_of(figures)
    baseline = {k: v for k, v in figures.items() if "iceberg_kc" in k or "kafka_consumer" in k}
    return write_result("scale", figures, baseline, ratios, _notes(runs))
