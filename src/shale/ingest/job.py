"""``shale ingest``: a Spark Structured Streaming query on Kafka whose ``foreachBatch`` runs the commit protocol.

Per micro-batch (docs/DESIGN.md, section 10):

1. Spark tasks, one per Kafka partition, skip offsets already committed, write each block's data objects then
   its meta.json (put-if-absent) under deterministic ids, and return the blocks' metadata.
2. The driver sends one ``CommitIngestBatch`` with every block and every partition's ``[start, end)``; the
   metastore accepts it only if each range starts at the committed end (or it is an exact replay).
3. Only then does ``foreachBatch`` return, so Spark records the batch in its checkpoint.

The metastore, not the checkpoint, is the authority on offsets: a query without a checkpoint starts every
known partition at its committed end, and a checkpoint that is behind the metastore finds its records
committed already and skips them.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from shale.block import BlockMeta
from shale.bucketindex import DeltaWriter
from shale.config import ShaleConfig
from shale.errors import ConfigError
from shale.failpoints import failpoint
from shale.ingest import metrics
from shale.ingest.blocks import GROUPS, GroupSpec, write_partition
from shale.ingest.committer import Committer, IngestConflictError
from shale.ingest.kafka import list_partitions, watermarks
from shale.ingest.records import SPARK_COLUMNS, SPARK_OUTPUT_SCHEMA, normalize, of_partition, partitions_of
from shale.metastore import CommitIngestBatch, DeadLetterQueue, Metastore, OffsetRange, open_metastore
from shale.objstore import open_bucket, task_bucket

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger(__name__)
OUTPUT = pa.schema([("topic", pa.string()), ("partition", pa.int32()), ("start", pa.int64()), ("end", pa.int64()),
                    ("records", pa.int64()), ("quarantined", pa.int64()), ("bytes", pa.int64()),
                    ("meta", pa.string())])
LAG_INTERVAL_S = 5.0


def make_task(spec: GroupSpec, committed: dict[tuple[str, int], int]) -> Callable[[Iterable[pa.RecordBatch]],
                                                                                 Iterator[pa.RecordBatch]]:
    """The function Spark runs per task (``mapInArrow``): write the blocks of its Kafka partition."""

    def task(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        collected = list(batches)
        if not collected:
            return
        table = normalize(pa.Table.from_batches(collected))
        if table.num_rows == 0:
            return
        for topic, partition in partitions_of(table):
            result = write_partition(spec, task_bucket(spec.bucket), of_partition(table, topic, partition),
                                     committed.get((topic, partition)))
            if result is None:
                continue
            rows = [{"topic": topic, "partition": partition, "start": result.start, "end": result.end,
                     "records": result.records, "quarantined": result.quarantined, "bytes": result.bytes,
                     "meta": meta.model_dump_json()} for meta in result.metas]
            yield pa.RecordBatch.from_pylist(rows, schema=OUTPUT)

    return task


class IngestJob:
    def __init__(self, config: ShaleConfig, group: str, *, spark: SparkSession | None = None,
                 metastore: Metastore | None = None) -> None:
        if group not in GROUPS:
            raise ConfigError(f"--group {group!r}: choose one of {', '.join(GROUPS)}")
        ingest = config.ingest
        if not ingest.topics and not ingest.topic_pattern:
            raise ConfigError("ingest.topics or ingest.topic_pattern must name what to persist")
        if group == "partition" and not ingest.parsers:
            raise ConfigError("the partition group needs ingest.parsers (which parser reads which topics)")
        self.config = config
        self.group = group
        self.generation = ingest.generation
        self.spec = GroupSpec(group, ingest.generation, config.bucket, ingest)
        self.spec.tenants.for_topic("probe")  # validates the tenant rules now rather than in a task
        self.metastore = metastore or open_metastore(config)
        self.bucket = open_bucket(config.bucket)
        self.committer = Committer(self.metastore, DeadLetterQueue(self.bucket), group, ingest.generation)
        self.run_id = uuid.uuid4().hex[:8]
        self._spark = spark
        self.batches = 0
        # Stale-tolerant bucket index: tell readers about committed blocks before the index writer does.
        self.deltas = DeltaWriter(self.bucket) if config.bucket_index.deltas else None
        self._lag_due = 0.0

    @property
    def checkpoint(self) -> str:
        return str(Path(self.config.ingest.checkpoint_dir) / f"{self.group}-g{self.generation}")

    def starting_offsets(self) -> str:
        """Every current partition of the subscribed topics: its committed end, or earliest/latest."""
        ingest, kafka = self.config.ingest, self.config.kafka
        found = list_partitions(kafka.bootstrap_servers, ingest.topics, ingest.topic_pattern, kafka.options)
        missing = sorted(set(ingest.topics) - set(found))
        if missing:
            raise ConfigError(f"topics {missing} do not exist in Kafka at {kafka.bootstrap_servers}")
        default = -2 if ingest.starting_offsets == "earliest" else -1
        offsets = {topic: {str(p): self.committer.committed.get((topic, p), default) for p in parts}
                   for topic, parts in found.items()}
        return json.dumps(offsets) if offsets else ingest.starting_offsets

    def start(self, available_now: bool = False) -> StreamingQuery:
        from shale.spark import spark_session

        self.committer.load()
        spark = self._spark or spark_session(f"shale-ingest-{self.group}", self.config.spark)
        ingest, kafka = self.config.ingest, self.config.kafka
        reader = (spark.readStream.format("kafka")
                  .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
                  .option("startingOffsets", self.starting_offsets())
                  .option("includeHeaders", "true")
                  .option("failOnDataLoss", str(ingest.fail_on_data_loss).lower())
                  .option("maxOffsetsPerTrigger", str(ingest.max_records_per_batch)))
        if ingest.topic_pattern:
            reader = reader.option("subscribePattern", ingest.topic_pattern)
        else:
            reader = reader.option("subscribe", ",".join(ingest.topics))
        if ingest.min_records_per_batch and not available_now:
            reader = (reader.option("minOffsetsPerTrigger", str(ingest.min_records_per_batch))
                      .option("maxTriggerDelay", f"{int(ingest.max_batch_delay)}s"))
        for key, value in kafka.options.items():
            reader = reader.option(f"kafka.{key}", value)
        writer = (reader.load().writeStream.queryName(f"shale-{self.group}-g{self.generation}-{self.run_id}")
                  .option("checkpointLocation", self.checkpoint).foreachBatch(self._on_batch))
        writer = (writer.trigger(availableNow=True) if available_now
                  else writer.trigger(processingTime=f"{int(ingest.trigger_interval * 1000)} milliseconds"))
        log.info("ingest started", extra={"group": self.group, "generation": self.generation,
                                          "checkpoint": self.checkpoint})
        return writer.start()

    def _on_batch(self, df: DataFrame, batch_id: int) -> None:
        started = time.perf_counter()
        committed = dict(self.committer.committed)
        rows = df.selectExpr(*SPARK_COLUMNS).mapInArrow(make_task(self.spec, committed), SPARK_OUTPUT_SCHEMA).collect()
        written = time.perf_counter()
        spans: dict[tuple[str, int], set[tuple[int, int, int, int, int]]] = {}
        blocks: list[BlockMeta] = []
        for row in rows:
            spans.setdefault((row["topic"], row["partition"]), set()).add(
                (row["start"], row["end"], row["records"], row["quarantined"], row["bytes"]))
            if row["meta"] is not None:
                blocks.append(BlockMeta.model_validate_json(row["meta"]))
        split = sorted(tp for tp, s in spans.items() if len(s) > 1)
        if split:
            raise IngestConflictError(f"Kafka partitions {split} were split across Spark tasks in one batch; Shale "
                                      "needs one task per Kafka partition (do not set the source's minPartitions)")
        if not spans:
            metrics.BATCHES.labels(self.group, "empty").inc()
            return
        ranges = [OffsetRange(topic=t, partition=p, start=s[0], end=s[1])
                  for (t, p), (s,) in sorted((k, tuple(v)) for k, v in spans.items())]
        command = CommitIngestBatch(group=self.group, generation=self.generation, batch=f"{self.run_id}/{batch_id}",
                                    ranges=ranges, blocks=blocks)
        failpoint("ingest.before-commit")
        outcome = self.committer.commit(command)
        failpoint("ingest.after-commit")
        if outcome == "committed" and self.deltas is not None:
            for tenant in sorted({b.tenant for b in blocks}):
                self.deltas.write(tenant, added=[b for b in blocks if b.tenant == tenant])
        totals = [next(iter(v)) for v in spans.values()]
        metrics.BATCHES.labels(self.group, outcome).inc()
        metrics.RECORDS.labels(self.group).inc(sum(t[2] for t in totals))
        metrics.QUARANTINED.labels(self.group).inc(sum(t[3] for t in totals))
        metrics.BYTES.labels(self.group).inc(sum(t[4] for t in totals))
        metrics.BLOCKS.labels(self.group).inc(len(blocks))
        metrics.DLQ_PENDING.labels(self.group).set(1 if self.committer.dlq_pending else 0)
        metrics.LAST_COMMIT.labels(self.group).set(time.time())
        self.batches += 1
        self._update_lag()
        log.info("batch committed", extra={
            "group": self.group, "batch": batch_id, "outcome": outcome, "blocks": len(blocks),
            "records": sum(t[2] for t in totals), "partitions": len(ranges),
            "write_seconds": round(written - started, 3), "seconds": round(time.perf_counter() - started, 3)})

    def _update_lag(self) -> None:
        """Refresh the lag gauges, at most every few seconds (one Kafka round trip; never fails a batch)."""
        if time.monotonic() < self._lag_due:
            return
        self._lag_due = time.monotonic() + LAG_INTERVAL_S
        kafka = self.config.kafka
        partitions: dict[str, list[int]] = {}
        for topic, partition in self.committer.committed:
            partitions.setdefault(topic, []).append(partition)
        try:
            marks = watermarks(kafka.bootstrap_servers, partitions, kafka.options)
        except Exception as exc:  # lag is best effort: never fail a committed batch over it
            log.debug("could not read Kafka end offsets for the lag metric: %s", exc)
            return
        for (topic, partition), (_, end) in marks.items():
            lag = max(0, end - self.committer.committed.get((topic, partition), end))
            metrics.LAG.labels(self.group, topic, str(partition)).set(lag)

    def run(self, available_now: bool = False) -> None:
        """Run until the query ends (available-now) or SIGTERM/SIGINT stops it."""
        query = self.start(available_now)
        stop = threading.Event()

        def on_signal(signum: int, _: Any) -> None:
            log.info("stopping ingest", extra={"group": self.group, "signal": signum})
            stop.set()
            query.stop()

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, on_signal)
            signal.signal(signal.SIGINT, on_signal)
        query.awaitTermination()
        if query.exception() is not None and not stop.is_set():
            raise IngestConflictError(f"ingest {self.group} stopped with an error: {query.exception()}")
