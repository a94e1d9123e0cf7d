"""Recovery after a kill with no standby: what the time from a SIGKILL to the first commit again is made of.

A ``shale ingest --group partition`` process (one shard, defaults: ``ingest.lease_duration`` 15 s, a batch planned
every 5 s, Spark ``local[2]``) while a producer writes about 200 records/s to 4 partitions. ``KILLS`` times, once the
driver has committed, it is killed with SIGKILL (its whole process group, Spark included) and, ``run.restart_delay``
(5 s) later, started again, as ``shale run`` does with a process that died. The recovery runs from the kill until
the new process's first commit is in the metastore (polled every 0.1 s); the lease, until the metastore shows it
holding the lease. The new process's own log (JSON, its timestamps) splits the rest: its start until it begins to
warm (Python, imports, the configuration), its Spark application, the warm-up it runs while the lease is held (the
Kafka admin client and a rehearsal batch, docs/design/ingest.md 10.7), the wait for the lease, and from the lease to
its first commit (the offsets, the plan and the first batch, whose own time is ``first_batch``).

Two scenarios, since a lease is timed by the metastore's log (docs/design/ingest.md 10.7): ``beside``, the backup
group's driver runs too (as in ``shale run``), so its renewals keep the log's time running and the dead holder's
lease expires 10 to 15 s after the kill, while the new process starts; ``alone``, the killed driver was the log's
only writer, so the log is silent until the new process first asks, the silence is bridged (as for a metastore
outage) and the lease runs a whole ``lease_duration`` from that ask. ``bench/takeover.py`` measures the third case,
a warm standby already waiting. Figures are medians over ``KILLS`` samples per scenario, and the largest.
"""

from __future__ import annotations

import datetime as dt
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.integration.ingest_helpers import config_of, create_topic, write_config
from tests.waiting import eventually

from bench.common import progress, write_result
from bench.services import kafka_broker, minio_bucket
from bench.takeover import Producer
from shale.metastore import open_metastore
from shale.process import ManagedProcess

KILLS = 3
PARTITIONS = 4
RESTART_DELAY = 5.0  # run.restart_delay's default
ROOT = Path(__file__).resolve().parent.parent


def _driver(file: Path, log: Path, group: str = "partition") -> ManagedProcess:
    command = [sys.executable, "-m", "shale.cli", "--config", str(file), "--log-format", "json", "ingest",
               "--group", group]
    process = ManagedProcess(f"ingest-{group}", command, log, cwd=ROOT)
    process.start()
    return process


def _committed(file: Path) -> int:
    return sum(o.committed_end for o in open_metastore(config_of(file)).offsets("partition", 1))


def _holder(file: Path) -> str:
    rows = open_metastore(config_of(file)).ingest_leases("partition")  # type: ignore[union-attr]
    return next((str(r["holder"]) for r in rows if r["holder"]), "")


def _events(log: Path) -> dict[str, dict[str, Any]]:
    """The first log entry of each message, with its time as epoch seconds (``at``)."""
    out: dict[str, dict[str, Any]] = {}
    for line in log.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue  # Spark's and the JVM's own lines
        if isinstance(entry, dict) and "msg" in entry and "ts" in entry and entry["msg"] not in out:
            entry["at"] = dt.datetime.fromisoformat(entry["ts"].replace("Z", "+00:00")).timestamp()
            out[entry["msg"]] = entry
    return out


def _message(events: dict[str, dict[str, Any]], start: str) -> dict[str, Any]:
    return next(e for msg, e in events.items() if msg.startswith(start))


def _one_kill(file: Path, holder: ManagedProcess, log: Path) -> tuple[ManagedProcess, dict[str, float]]:
    """Kill ``holder`` once it has committed, start its replacement after the restart delay; the phases in s."""
    eventually(lambda: _committed(file) > 0 and _holder(file) != "", 600, "the driver's first commit")
    time.sleep(6)  # a steady driver: a few batches and renewals behind it
    before, at_kill = _holder(file), _committed(file)
    killed = time.time()
    holder.kill9()
    time.sleep(RESTART_DELAY)
    started = time.time()
    driver = _driver(file, log)
    eventually(lambda: _holder(file) not in ("", before), 300, "the new driver to hold the lease")
    lease = time.time() - killed
    eventually(lambda: _committed(file) > at_kill, 300, "the new driver's first commit")
    recovery = time.time() - killed
    events = _events(log)
    warmed = _message(events, "ingest driver warmed")
    taken = _message(events, "ingest lease")
    first = _message(events, "batch committed")
    spark, warm_seconds = float(warmed["phases"]["spark"]), float(warmed["seconds"])
    return driver, {
        "recovery": recovery, "lease": lease, "restart_delay": started - killed,
        "python_start": warmed["at"] - warm_seconds - started,  # the interpreter, imports, the configuration
        "spark_session": spark,
        "warm_up": warm_seconds - spark,  # the Kafka admin client and the rehearsal batch, while the lease is held
        "waiting_for_the_lease": max(0.0, taken["at"] - warmed["at"]),
        "lease_to_first_commit": first["at"] - taken["at"],
        "first_batch": float(first["seconds"]),
    }


def scenario(broker: Any, bucket: Any, folder: Path, beside: bool) -> list[dict[str, float]]:
    """``KILLS`` kills of the partition group's driver, the backup group's running ``beside`` it or not."""
    folder.mkdir()
    topic = folder.name
    create_topic(broker.bootstrap_servers, topic, PARTITIONS)
    file = write_config(folder, broker.bootstrap_servers, bucket, [topic], trigger_interval="5s",
                        backup_trigger_interval="30s")
    producer = Producer(broker.bootstrap_servers, topic)
    others = [_driver(file, folder / "backup.log", "backup")] if beside else []
    driver = _driver(file, folder / "driver-0.log")
    samples = []
    try:
        for kill in range(KILLS):
            driver, phases = _one_kill(file, driver, folder / f"driver-{kill + 1}.log")
            samples.append(phases)
            progress(f"{topic} kill {kill + 1}/{KILLS}: " + ", ".join(f"{k} {v:.1f} s" for k, v in phases.items()))
    finally:
        producer.close()
        for process in [driver, *others]:
            process.kill9()
    return samples


def run() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="shale-bench-recovery-") as tmp, kafka_broker() as broker, \
            minio_bucket() as bucket:
        beside = scenario(broker, bucket, Path(tmp) / "beside", beside=True)
        alone = scenario(broker, bucket, Path(tmp) / "alone", beside=False)

    def median(samples: list[dict[str, float]], key: str) -> int:
        return round(1000 * statistics.median(s[key] for s in samples))

    def largest(samples: list[dict[str, float]], key: str) -> int:
        return round(1000 * max(s[key] for s in samples))

    figures: dict[str, float] = {}
    for name, samples in (("beside", beside), ("alone", alone)):
        figures[f"{name}_recovery_p50_ms"] = median(samples, "recovery")
        figures[f"{name}_recovery_max_ms"] = largest(samples, "recovery")
        figures.update({f"{name}_{key}_p50_ms": median(samples, key) for key in samples[0] if key != "recovery"})
    figures["kills"] = KILLS
    return write_result(
        "recovery", figures=figures,
        baseline={"lease_duration_ms": 15_000, "restart_delay_ms": round(RESTART_DELAY * 1000)},
        ratios={"beside_recovery_p50_vs_lease": round(figures["beside_recovery_p50_ms"] / 15_000, 3),
                "alone_recovery_p50_vs_lease": round(figures["alone_recovery_p50_ms"] / 15_000, 3)},
        notes=__doc__ or "",
        details={"samples_s": {name: [{k: round(v, 3) for k, v in s.items()} for s in samples]
                               for name, samples in (("beside", beside), ("alone", alone))}},
    )
