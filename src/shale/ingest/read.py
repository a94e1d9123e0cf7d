"""The Spark side of an ingest group: its session, a batch's read (at most a task per core, each reading its share of
the planned ranges with its own Kafka consumer, ``source.py``, and writing blocks, ``task.py``) and the warm-up
rehearsal before the lease (docs/DESIGN.md 10.1 step 2, 10.7)."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from shale.block import BACKUP_SCHEMA
from shale.config import ShaleConfig
from shale.encoder import Chunk, GroupSpec, Written, decode_written, write_chunks
from shale.ingest.plan import BatchPlan
from shale.ingest.source import HELD_BYTES, assign_tasks, consumer_options, read_share
from shale.ingest.task import TASK_SCHEMA, WARM_SCHEMA, Paused, make_task, make_warm_task, start_worker, tasks
from shale.kafka import client_options
from shale.objstore import Bucket, RequestReport, add_task_requests

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class SparkRead:
    """One group's Spark application and the reads it runs. The session is made on first use (or given)."""

    def __init__(self, config: ShaleConfig, spec: GroupSpec, bucket: Bucket,
                 spark: SparkSession | None = None) -> None:
        self.config = config
        self.spec = spec
        self.bucket = bucket
        self._spark = spark
        # The group id of the tasks' consumers (``kafka.client_options`` may name another). They assign partitions
        # and commit nothing to Kafka, so the group never joins or rebalances; a broker that authorizes groups
        # checks it.
        self.consumer_group = f"shale-ingest-{spec.group}-{spec.generation}"

    def session(self) -> SparkSession:
        if self._spark is None:
            from shale.spark import spark_session

            self._spark = spark_session(f"shale-ingest-{self.spec.group}", self.config.spark)
        return self._spark

    def _run(self, plan: BatchPlan, make: Callable[..., Any], schema: str) -> list[Any]:
        """Run ``make``'s task (``make_task``, ``make_warm_task``) over the plan: at most one task per core, each
        reading its share of the ranges with its own Kafka consumer (``shale.ingest.source``); its rows."""
        spark = self.session()
        shares = assign_tasks(plan.ranges, tasks(len(plan.ranges), spark.sparkContext.defaultParallelism))
        bound = self.config.ingest.max_task_bytes
        held = min(HELD_BYTES, bound // 32)
        options = consumer_options(client_options(self.config.kafka), self.consumer_group, held)
        task = make(self.spec, plan, bound, functools.partial(read_share, options, shares, held))
        rows = spark.range(0, len(shares), 1, len(shares)).mapInArrow(task, schema).collect()
        for row in rows:  # the bucket requests the tasks made in their Python workers: this process's metrics
            if row["requests"] is not None:
                add_task_requests(RequestReport.model_validate_json(row["requests"]))
        return rows

    def read(self, plan: BatchPlan) -> tuple[list[Written], list[Paused]]:
        """Read and write one batch: the chunks its tasks wrote, and the partitions that paused on the registry.
        Ranges that held no readable record at all are recorded by an empty block per topic."""
        rows = self._run(plan, make_task, TASK_SCHEMA)
        written = [w for row in rows if row["written"] is not None for w in decode_written(row["written"])]
        paused = [Paused.model_validate_json(row["paused"]) for row in rows if row["paused"] is not None]
        seen = {(w.topic, w.partition) for w in written} | {(p.topic, p.partition) for p in paused}
        empty = [Chunk(r.topic, r.partition, r.incarnation, r.start, r.end, plan.read_time_ms)
                 for r in plan.ranges if (r.topic, r.partition) not in seen]
        if empty:
            written += write_chunks(self.spec, self.bucket, BACKUP_SCHEMA.empty_table(), empty)
        return written, paused

    def rehearse(self, plan: BatchPlan) -> dict[str, float]:
        """A batch's once-per-process costs paid on ``plan``'s records (``make_warm_task``: read, parsed, encoded
        into a scratch bucket, nothing written), in the tasks a batch of them would have; with no range, a tiny job
        that starts the Python workers with the task's modules imported. Returns the tasks' seconds by phase."""
        task_seconds: dict[str, float] = {}
        if not plan.ranges:
            self.session().range(2).mapInArrow(start_worker, "id long").collect()
            return task_seconds
        rows = self._run(plan, make_warm_task, WARM_SCHEMA)
        for row in rows:
            for phase, seconds in json.loads(row["seconds"]).items():
                task_seconds[phase] = round(task_seconds.get(phase, 0.0) + seconds, 3)
        return task_seconds

