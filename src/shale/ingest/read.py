"""The Spark side of an ingest group: its session, Spark's Kafka source for exact offsets, a batch's read (the tasks
of ``task.py`` writing blocks) and the warm-up rehearsal before the lease (docs/DESIGN.md 10.1 step 2, 10.7)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from shale.block.schemas import BACKUP_SCHEMA
from shale.config import ShaleConfig
from shale.encoder.chunks import Chunk, GroupSpec, Written, write_chunks
from shale.encoder.records import SPARK_COLUMNS, WRITTEN_SCHEMA
from shale.ingest.plan import BatchPlan
from shale.ingest.task import WARM_SCHEMA, Paused, make_task, make_warm_task, start_worker, tasks
from shale.kafka import FETCH_BYTES, FETCH_WAIT_MS, MAX_POLL_RECORDS, java_options
from shale.objstore import Bucket

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
        # One consumer group for every batch's read (``kafka.group.id``; ``kafka.spark_options`` may name another).
        # Spark's executors pool their Kafka consumers by group and partition; its default, a new group per query,
        # made every task of every batch open a new consumer (connection, authentication, metadata, a cold
        # fetch). Shale assigns partitions and commits nothing to Kafka, so the group never rebalances anything.
        self.consumer_group = f"shale-ingest-{spec.group}-{spec.generation}"

    def session(self) -> SparkSession:
        if self._spark is None:
            from shale.spark import spark_session

            self._spark = spark_session(f"shale-ingest-{self.spec.group}", self.config.spark)
        # Arrow batches from the JVM stay small next to the chunk size, whatever the records' sizes.
        arrow_bytes = max(2**20, self.config.ingest.max_task_bytes // 32)
        self._spark.conf.set("spark.sql.execution.arrow.maxBytesPerBatch", str(arrow_bytes))
        return self._spark

    def kafka_source(self, plan: BatchPlan) -> Any:
        """Spark's Kafka source for exactly the plan's ranges, read_committed."""
        spark = self.session()
        assign: dict[str, list[int]] = {}
        starting: dict[str, dict[str, int]] = {}
        ending: dict[str, dict[str, int]] = {}
        for r in plan.ranges:
            assign.setdefault(r.topic, []).append(r.partition)
            starting.setdefault(r.topic, {})[str(r.partition)] = r.start
            ending.setdefault(r.topic, {})[str(r.partition)] = r.end
        reader = (spark.read.format("kafka")
                  .option("kafka.bootstrap.servers", self.config.kafka.bootstrap_servers)
                  .option("assign", json.dumps(assign))
                  .option("startingOffsets", json.dumps(starting))
                  .option("endingOffsets", json.dumps(ending))
                  .option("includeHeaders", "true")
                  .option("failOnDataLoss", "true")  # offsets deleted between planning and reading: retry the plan
                  .option("kafka.isolation.level", "read_committed")
                  .option("kafka.max.partition.fetch.bytes", str(FETCH_BYTES))
                  .option("kafka.fetch.max.wait.ms", str(FETCH_WAIT_MS))
                  .option("kafka.max.poll.records", str(MAX_POLL_RECORDS))
                  .option("kafka.group.id", self.consumer_group))
        for key, value in java_options(self.config.kafka).items():
            reader = reader.option(f"kafka.{key}", value)
        return reader

    def frame(self, plan: BatchPlan) -> Any:
        """The plan's records in ``SPARK_COLUMNS``, in at most as many Spark partitions as a batch has tasks."""
        frame = self.kafka_source(plan).load().selectExpr(*SPARK_COLUMNS)
        count = tasks(len(plan.ranges), self.session().sparkContext.defaultParallelism)
        if count < len(plan.ranges):
            frame = frame.coalesce(count)  # each task reads several partitions in turn
        return frame

    def read(self, plan: BatchPlan) -> tuple[list[Written], list[Paused]]:
        """Read and write one batch: the chunks its tasks wrote, and the partitions that paused on the registry.
        Ranges that held no readable record at all are recorded by an empty block per topic."""
        task = make_task(self.spec, plan, self.config.ingest.max_task_bytes)
        rows = self.frame(plan).mapInArrow(task, WRITTEN_SCHEMA).collect()
        written = [Written.model_validate_json(row["written"]) for row in rows if row["written"] is not None]
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
        task = make_warm_task(self.spec, plan, self.config.ingest.max_task_bytes)
        rows = self.frame(plan).mapInArrow(task, WARM_SCHEMA).collect()
        for row in rows:
            for phase, seconds in json.loads(row["seconds"]).items():
                task_seconds[phase] = round(task_seconds.get(phase, 0.0) + seconds, 3)
        return task_seconds

