"""A restore's Prometheus metrics, set by the driver from the committed progress (served with
``shale restore --metrics-port``)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from shale.restore.progress import ProgressLine

RESTORED = Gauge("shale_restore_records_restored", "Records of the source partition committed to the target (from "
                 "the restore's progress topic, so exactly what a read_committed consumer sees).",
                 ["job", "partition"])
PLANNED = Gauge("shale_restore_records_planned", "Records the plan counts for the source partition (an upper bound "
                "under --until).", ["job", "partition"])
RATE = Gauge("shale_restore_records_per_second", "Records restored per second since this run started.", ["job"])
ETA = Gauge("shale_restore_eta_seconds", "Seconds until every planned record is restored at the current rate "
            "(-1: not known yet).", ["job"])
STOPPED = Counter("shale_restore_partitions_stopped_total", "Partitions that stopped on a gap, a corrupt block or a "
                  "refused record.", ["job"])
DEAD_LETTERED = Counter("shale_restore_dead_lettered_total", "Records larger than the target's max.message.bytes "
                        "written to the bucket instead.", ["job"])


def observe(job: str, line: ProgressLine, planned: dict[int, int], now: dict[int, tuple[int, int]]) -> None:
    for partition, records in planned.items():
        PLANNED.labels(job, str(partition)).set(records)
        RESTORED.labels(job, str(partition)).set(now.get(partition, (0, 0))[1])
    RATE.labels(job).set(line.per_second)
    ETA.labels(job).set(-1 if line.eta_seconds is None else line.eta_seconds)
