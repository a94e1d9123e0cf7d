"""What a deployment costs in the bucket: objects and requests an hour, by kind of object, for a rate, a partition
count and the configuration's settings (``shale config cost``; docs/OPERATING.md, "What the bucket costs", gives
the same formulas in words; ``bench/cost.py`` checks them against a run).

A forecast assumes a steady stream: records spread evenly over the partitions, every task of a batch busy
(``k = min(partitions, cores)``), one data hour per batch. A group whose batches take longer than its trigger runs
fewer, larger batches: give the measured batch time (``batch_seconds``, the mean of
``shale_ingest_batch_seconds``), and it is used in place of the trigger. Not forecast: readers' requests (a query
reads what it selects) and the metastore's bucket scan (``metastore.bucket_scan_interval``: a LIST per 1,000 keys
the bucket holds)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from shale.config import ShaleConfig
from shale.ingest import chunk_bytes

WORKER_RESIDENT = 128 * 2**20
"""A Spark Python worker's resident memory before it reads a record: 105 MiB after its imports (pyarrow, the Kafka
client, the ingest task; measured 2026-12-04), with room for the allocator's caches. The forecast sizes a task's
chunks with it, as the task does with its own (``chunk_bytes``)."""

ICEBERG_OBJECTS = 3
"""Objects an Iceberg snapshot of one table adds: a manifest, a manifest list and a metadata.json (written by the
catalog service with ``catalog = "rest"``, by Shale with ``sql``)."""


@dataclass(frozen=True)
class CostLine:
    """One kind of object: how many are written an hour and the requests they cost an hour."""

    kind: str
    objects: float
    put: float
    get: float
    list: float
    delete: float

    def as_dict(self) -> dict[str, float | str]:
        return {k: v if isinstance(v, str) else round(v, 1) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class Load:
    """What the deployment is given: ``rate`` records a second of about ``record_bytes`` each, over
    ``partitions`` partitions of ``topics`` topics belonging to ``tenants`` tenants; ``cores`` Spark cores per
    ingest group's application; ``quarantine`` when some records of each partition-group chunk do not parse."""

    rate: float
    record_bytes: int
    partitions: int
    cores: int
    topics: int = 1
    tenants: int = 1
    quarantine: bool = False

    def __post_init__(self) -> None:
        if min(self.rate, self.record_bytes, self.partitions, self.cores, self.topics, self.tenants) <= 0:
            raise ValueError("rate, record size, partitions, cores, topics and tenants must be positive")
        if self.topics > self.partitions or self.tenants > self.topics:
            raise ValueError("a topic has at least one partition and a tenant at least one topic")


def batches_per_hour(config: ShaleConfig, group: str, batch_seconds: Mapping[str, float]) -> float:
    """``N_g``: a caught-up group plans a batch each trigger interval, one that is behind each batch time."""
    trigger = config.ingest.trigger_interval if group == "partition" else config.ingest.backup_trigger_interval
    period = max(trigger, batch_seconds.get(group, 0.0))
    if period <= 0:
        raise ValueError(f"the {group} group's trigger interval is 0 s: its batches follow their own time; give "
                         f"the measured batch time (--batch-seconds {group}=SECONDS)")
    return 3600 / period


def forecast(config: ShaleConfig, load: Load, batch_seconds: Mapping[str, float] | None = None) -> list[CostLine]:
    """Objects and requests an hour by kind of object: each ingest group's level-0 blocks, the bucket-index deltas
    and index, each compaction level's output, the deletion marks of replaced blocks and, when publishing is on,
    the Iceberg snapshots."""
    seconds = batch_seconds or {}
    lines: list[CostLine] = []
    commits = 0.0
    level: dict[str, tuple[float, int]] = {}  # per group: blocks an hour of the level below, datasets a block holds
    for group in config.run.ingest_groups:
        n = batches_per_hour(config, group, seconds)
        k = min(load.partitions, load.cores)
        task_bytes = load.rate * load.record_bytes * 3600 / n / k
        chunk = chunk_bytes(config.ingest.max_task_bytes, WORKER_RESIDENT, group)
        x = math.ceil(load.topics / k) * max(1, math.ceil(task_bytes / chunk))
        d = 2 if group == "partition" and load.quarantine else 1
        blocks = n * k * x
        lines.append(CostLine(f"level-0 block ({group} group)", blocks * (d + 1), blocks * (d + 1), blocks, 0, 0))
        commits += n
        level[group] = (blocks, d)
    replaced = replaced_objects = jobs_total = partition_jobs = 0.0
    per_job = config.compaction.blocks_per_job
    for depth in range(1, config.compaction.max_level + 1):
        objects = gets = 0.0
        for name, (blocks, d) in level.items():
            jobs = blocks / per_job[min(depth - 1, len(per_job) - 1)]
            objects += jobs * (d + 1)
            gets += blocks * d + jobs  # each source's data objects, and the job's meta.json looked for first
            replaced, replaced_objects = replaced + blocks, replaced_objects + blocks * (d + 1)
            jobs_total += jobs
            partition_jobs += jobs if name == "partition" else 0.0
            level[name] = (jobs, d)
        lines.append(CostLine(f"compaction output (level {depth})", objects, objects, gets, 0, 0))
    lines.append(CostLine("deletion mark", replaced, replaced, 0, 0, replaced + replaced_objects))
    deltas = commits * load.tenants + jobs_total if config.bucket_index.deltas else 0.0
    lines.append(CostLine("bucket-index delta", deltas, deltas, deltas, 0, deltas))
    # The writer looks every debounce seconds and writes a tenant it saw change one look ago: under changes at least
    # that frequent, one write every two looks (measured: 359 an hour on the default 5 s, bench/cost.py).
    changes = commits + jobs_total / load.tenants  # a tenant's index changes an hour
    index = config.bucket_index
    rewrites = load.tenants * max(3600 / index.rewrite_interval,
                                  min(changes, 3600 / max(2 * index.debounce, 1e-3)))
    lines.append(CostLine("bucket index (one object a tenant, rewritten)", 0, rewrites, 0, rewrites, 0))
    if config.iceberg.enabled and "partition" in level:
        snapshots = (batches_per_hour(config, "partition", seconds) + partition_jobs / load.topics) * load.topics
        lines.append(CostLine("Iceberg snapshot", snapshots * ICEBERG_OBJECTS, snapshots * ICEBERG_OBJECTS,
                              snapshots * 2, 0, 0))
    return lines


def total(lines: list[CostLine]) -> CostLine:
    """Every kind together (objects written, requests of each kind)."""
    return CostLine("total", *(sum(getattr(line, f) for line in lines)
                               for f in ("objects", "put", "get", "list", "delete")))
