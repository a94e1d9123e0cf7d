"""The cost forecast against a run (issue 59): what ``shale config cost`` (``shale.cost.forecast``, the formulas of
docs/OPERATING.md's "What the bucket costs") says a deployment writes and asks of the bucket an hour, against what
``shale run`` on defaults did, at several partition counts.

For each count in ``COST_PARTITIONS`` (default ``8,256,2048``): a fresh deployment and topic, the freshness
benchmark's producer (JSON records of about 130 bytes, ``COST_RATE`` records/s, default 20,000, round-robin over
the partitions), ``COST_WARMUP`` s (30) of producing before a window of ``COST_WINDOW`` s (240: a group behind its
trigger runs batches of 40 s at 2,048 partitions, and a window counts whole batches). At the window's two ends the
benchmark counts the level-0 objects in the bucket (data objects and meta.json of both groups) and reads
``shale_objstore_requests_total`` from every service's metrics endpoint (the metastore, both ingest drivers with
their Spark tasks' requests, the compaction worker); the differences, scaled to an hour, are the measured
figures. The forecast is given the same load (rate, the records' mean size as Kafka holds them, partitions, the
Spark cores of a group's application) and, for a group whose batches took longer than its trigger in the window,
their mean time from its log (plan, Spark job and commit), as ``--batch-seconds`` gives it: a group that is behind
runs fewer, larger batches, and the forecast's trigger-based count would not apply.

``objects_vs_forecast_N`` is level-0 objects measured against forecast; ``ingest_puts_vs_forecast_N`` and
``ingest_gets_vs_forecast_N`` the ingest drivers' requests (level-0 blocks and bucket-index deltas) against the
forecast of those lines; ``index_puts_vs_forecast_N`` the metastore's bucket-index writes. Compaction's requests in
a four-minute window are a few jobs' (a job closes at 20 level-0 blocks), reported but not compared.
``kept_up_N`` says whether both groups' batches fitted their triggers."""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
from tests.producing import CheckedProducer

from bench import freshness as fr
from bench import peers
from bench.common import progress, write_result
from bench.services import kafka_broker, minio_bucket
from shale.config import BucketConfig
from shale.cost import CostLine, Load, batches_per_hour, forecast
from shale.metastore import MetastoreClient

COUNTS = tuple(int(n) for n in os.environ.get("COST_PARTITIONS", "8,256,2048").split(","))
RATE = int(os.environ.get("COST_RATE", "20000"))
WARMUP = float(os.environ.get("COST_WARMUP", "30"))
WINDOW = float(os.environ.get("COST_WINDOW", "240"))
RECORD_BYTES = len(b'{"ts": 1764806400000, "level": "INFO", "msg": "%s"}' % (b"x" * 80))
"""The producer's records as Kafka holds them: no key, no headers, this value (``fr.produce_steadily``)."""


def requests_by_service(work: Path, peaks: dict[str, float] | None = None) -> dict[str, dict[str, float]]:
    """``shale_objstore_requests_total`` of every service of the deployment, by operation (both ``by`` values and
    every outcome summed); with ``peaks``, each ingest group's last batch's task peak memory put in it."""
    services = json.loads((work / "logs" / "deployment.json").read_text())["services"]
    out: dict[str, dict[str, float]] = {}
    for name, service in services.items():
        counted = out.setdefault(name, {})
        text = httpx.get(service["metrics"], timeout=10).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "shale_objstore_requests_total":
                    op = sample.labels["operation"]
                    counted[op] = counted.get(op, 0.0) + sample.value
                elif sample.name == "shale_ingest_task_peak_rss_bytes" and peaks is not None:
                    peaks[sample.labels["group"]] = sample.value
    return out


def batches_in(log: Path, start: float, end: float) -> list[dict[str, Any]]:
    """The group's committed batches whose commit fell in [start, end] (epoch seconds), from its JSON log."""
    return [e for e in fr.log_entries(log)
            if e.get("msg") == "batch committed" and start <= e["at"] <= end]


def measure(root: Path, bootstrap: str, bucket: BucketConfig, n: int) -> dict[str, Any]:
    """One deployment on a fresh topic of ``n`` partitions under the steady load; what the window measured and the
    forecast for it."""
    name = f"cost-{n}"
    work = root / name
    topic, port, file, secret, config, store = fr._prepare(name, {}, bootstrap, bucket, work, n)
    groups = config.run.ingest_groups
    with fr.deployment(file, work, secret, 1 + len(groups) + config.run.compaction_workers) as run:
        token = (work / "metastore" / "admin.token").read_text().strip()
        client = MetastoreClient([f"http://127.0.0.1:{port}"], deadline=30, token=token)
        warm = CheckedProducer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        for i in range(fr.WARMUP_RECORDS):  # every group started and committing before the load
            warm.produce(topic, b'{"ts": %d, "level": "INFO", "msg": "warm-up"}' % (time.time() * 1000),
                         partition=i % n)
        warm.flush()
        fr._wait(lambda: sum(o.committed_end for o in client.offsets() if o.topic == topic)
                 == len(groups) * fr.WARMUP_RECORDS, 300, "every group to commit the warm-up records", run)
        fr.RATE, fr.WARMUP, fr.DURATION = RATE, WARMUP, WINDOW + 5
        producer = fr._start_producer(bootstrap, topic, WARMUP, WINDOW + 5, RATE, partitions=n)
        time.sleep(WARMUP)
        began, objects_before, before = time.time(), fr.count_objects(store), requests_by_service(work)
        time.sleep(WINDOW)
        peaks: dict[str, float] = {}
        ended, objects_after, after = time.time(), fr.count_objects(store), requests_by_service(work, peaks)
        produced = fr._producer_report(producer)
    seconds = ended - began
    per_hour = 3600 / seconds
    requests = {svc: {op: (n_ - before.get(svc, {}).get(op, 0.0)) * per_hour for op, n_ in ops.items()}
                for svc, ops in after.items()}
    batches = {g: batches_in(work / "logs" / f"ingest-{g}.log", began, ended) for g in groups}
    batch_seconds = {g: sum(b["plan_seconds"] + b["seconds"] for b in bs) / len(bs) for g, bs in batches.items() if bs}
    trigger = {"partition": config.ingest.trigger_interval, "backup": config.ingest.backup_trigger_interval}
    behind = {g: s for g, s in batch_seconds.items() if s > trigger[g]}
    load = Load(rate=produced["sent"] / produced["elapsed"], record_bytes=RECORD_BYTES, partitions=n,
                cores=os.cpu_count() or 1)
    lines = forecast(config, load, behind)
    commits = sum(batches_per_hour(config, g, behind) for g in groups)  # a bucket-index delta each (one tenant)
    return {"commits_forecast": commits, "seconds": seconds, "produced": produced, "requests": requests,
            "behind": behind, "batches": {g: len(bs) for g, bs in batches.items()}, "batch_seconds": batch_seconds,
            "blocks_per_batch": {g: sum(b["blocks"] for b in bs) / len(bs) for g, bs in batches.items() if bs},
            "records_per_batch": {g: sum(b["records"] for b in bs) / len(bs) for g, bs in batches.items() if bs},
            "task_peak_rss_mib": {g: round(v / 2**20) for g, v in peaks.items()},
            "blocks_per_batch_forecast": {g: _sum(lines, f"level-0 block ({g}", "objects") / 2
                                          / batches_per_hour(config, g, behind) for g in groups},
            "l0_objects": (objects_after["l0_objects"] - objects_before["l0_objects"]) * per_hour,
            "forecast": [line.as_dict() for line in lines], "lines": lines}


def _sum(lines: list[CostLine], prefix: str, field: str) -> float:
    return sum(getattr(line, field) for line in lines if line.kind.startswith(prefix))


def figures_of(n: int, out: dict[str, Any]) -> dict[str, Any]:
    lines: list[CostLine] = out["lines"]
    ingest = {op: sum(v.get(op, 0.0) for svc, v in out["requests"].items() if svc.startswith("ingest"))
              for op in ("put", "get", "list")}
    compaction = {op: sum(v.get(op, 0.0) for svc, v in out["requests"].items() if svc.startswith("compact"))
                  for op in ("put", "get")}
    index = out["requests"].get("metastore", {})
    return {
        f"objects_per_hour_l0_{n}": round(out["l0_objects"]),
        f"objects_per_hour_l0_forecast_{n}": round(_sum(lines, "level-0", "objects")),
        f"ingest_puts_per_hour_{n}": round(ingest["put"]),
        f"ingest_puts_per_hour_forecast_{n}": round(_sum(lines, "level-0", "put") + out["commits_forecast"]),
        f"ingest_gets_per_hour_{n}": round(ingest["get"]),
        f"ingest_gets_per_hour_forecast_{n}": round(_sum(lines, "level-0", "get")),
        f"ingest_lists_per_hour_{n}": round(ingest["list"]),
        f"index_puts_per_hour_{n}": round(index.get("put", 0.0)),
        f"index_puts_per_hour_forecast_{n}": round(_sum(lines, "bucket index (", "put")),
        f"compaction_puts_per_hour_{n}": round(compaction["put"]),
        f"compaction_gets_per_hour_{n}": round(compaction["get"]),
        f"compaction_puts_per_hour_forecast_{n}": round(_sum(lines, "compaction", "put")),
        f"kept_up_{n}": int(not out["behind"]),
    }


def ratios_of(f: dict[str, Any]) -> dict[str, float]:
    pairs = [(f"{name}_vs_forecast_{n}", f"{figure}_{n}", f"{figure}_forecast_{n}") for n in COUNTS
             for name, figure in (("objects", "objects_per_hour_l0"), ("ingest_puts", "ingest_puts_per_hour"),
                                  ("ingest_gets", "ingest_gets_per_hour"), ("index_puts", "index_puts_per_hour"))]
    return {name: round(f[a] / f[b], 3) for name, a, b in pairs if f.get(b)}


def _notes(runs: dict[int, dict[str, Any]]) -> str:
    notes = [__doc__ or "", "In this run:", ""]
    for n, out in runs.items():
        notes.append(f"* {n} partitions: window {out['seconds']:.0f} s, {out['produced']['sent']:,} records produced; "
                     f"batches in the window {out['batches']}, their mean time (s) "
                     f"{ {g: round(s, 2) for g, s in out['batch_seconds'].items()} }; "
                     f"behind: {sorted(out['behind']) or 'none'}; level-0 blocks a batch "
                     f"{ {g: round(v, 2) for g, v in out['blocks_per_batch'].items()} } (forecast "
                     f"{ {g: round(v, 2) for g, v in out['blocks_per_batch_forecast'].items()} }), records a batch "
                     f"{ {g: round(v) for g, v in out['records_per_batch'].items()} }, the last batch's task peak "
                     f"memory (MiB) {out['task_peak_rss_mib']}; requests an hour by service "
                     f"{ {s: {op: round(v) for op, v in ops.items()} for s, ops in out['requests'].items()} }.")
    return "\n".join(notes)


def run() -> dict[str, Any]:
    signal.signal(signal.SIGTERM, peers._stopped)
    figures: dict[str, Any] = {"rate_records_per_s": RATE, "window_seconds": WINDOW}
    runs: dict[int, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="shale-bench-cost-") as tmp, kafka_broker(heap="2g") as broker, \
            minio_bucket() as bucket:
        for n in COUNTS:
            progress(f"{n} partitions: a steady {RATE:,} records/s on defaults")
            runs[n] = measure(Path(tmp), broker.bootstrap_servers, bucket, n)
            figures |= figures_of(n, runs[n])
            progress(f"{n} partitions: {figures}")
    for out in runs.values():
        del out["lines"]
    return write_result("cost", figures, {}, ratios_of(figures), _notes(runs), {"runs": runs})
