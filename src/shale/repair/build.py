"""Building a repair's new blocks, in Spark tasks: merges (the compactor's ``merge_blocks``: read the inputs whole,
CRC-checked, drop duplicate (topic, partition, offset), write one block) and rebuilds of damaged blocks.

A rebuild writes exactly the records the damaged block held, found elsewhere: for each of its Kafka ranges the
records are read from the backup group's blocks or from Kafka (a read_committed consumer, the same offsets of the
same topic incarnation), written by the ingest path's own ``write_chunk`` into a scratch bucket in memory (the
same tenant routing, parser, partition values and quarantine as when they were ingested), and the rows of the
damaged block's tenant, partition values and kind are taken. The new block gets the damaged block's metadata
(level, ranges, parser) and names it as its parent; its lineage is the damaged block's and its own id (as an erase
rewrite's, ``erased_lineage``), so a bucket scanner seeing both judges the damaged block overlapped by it, whichever
id is greater. If its rows differ from what the damaged block's
metadata says it held, nothing is written: the damaged block is then quarantined instead.
"""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
from obstore.store import MemoryStore

from shale.block import (
    BACKUP_SCHEMA,
    BlockMeta,
    BlockSpec,
    Dataset,
    DatasetInput,
    KafkaRange,
    backup_rows,
    plan_block,
    read_dataset,
    write_block,
)
from shale.compactor import erased_lineage, merge_blocks
from shale.config import BucketConfig, IngestConfig, KafkaConfig
from shale.encoder import Chunk, GroupSpec, write_chunk
from shale.errors import RetryableError, ShaleError
from shale.kafka import client_options, describe_topics
from shale.objstore import Bucket, ObstoreBucket, results_counted, task_bucket, with_requests
from shale.repair.model import BuildRequest, BuildResult

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

KAFKA_READ_DEADLINE = 300.0
"""How long reading one range from Kafka may take before the rebuild gives up (it is planned again next run)."""


class Builder(Protocol):
    """Where merges and rebuilds run: Spark tasks in production (``SparkBuilder``), in-process in unit tests."""

    def build(self, request: BuildRequest) -> BuildResult: ...


def run_build(payload: str, bucket: BucketConfig, ingest: IngestConfig, kafka: KafkaConfig) -> str:
    """One merge or rebuild (a Spark task's body). Input and output are JSON."""
    request = BuildRequest.model_validate_json(payload)
    target = task_bucket(bucket)
    if request.action == "merge":
        level = max(m.level for m in request.inputs)
        result = merge_blocks(target, request.inputs, job=f"repair-{request.attempt}", token=0, level=level)
        if result.output.id != request.output:
            raise ShaleError(f"merge wrote {result.output.id}, the plan named {request.output}: report this as a bug")
        return BuildResult(output=result.output).model_dump_json()
    return rebuild(target, request, GroupSpec(request.inputs[0].group, request.inputs[0].generation, bucket,
                                              ingest), kafka).model_dump_json()


def rebuild(bucket: Bucket, request: BuildRequest, spec: GroupSpec, kafka: KafkaConfig) -> BuildResult:
    damaged = request.inputs[0]
    if damaged.parser is not None:
        topics = {d.topic for d in damaged.datasets}
        parsers = {spec.parser_for(t) for t in topics}
        now = {(p.name, p.version, p.digest()) if not isinstance(p, str) else None for p in parsers}
        was = (damaged.parser.name, damaged.parser.version, damaged.parser.options_digest)
        if now != {was}:
            return BuildResult(problem=f"the damaged block was parsed by {was[0]} {was[1]} with options {was[2]}; "
                                       "this configuration parses its topic otherwise: not rebuilt")
    kinds = {d.kind for d in damaged.datasets if d.rows}
    tables: dict[str, list[pa.Table]] = defaultdict(list)
    labels: dict[str, set[tuple[tuple[str, str], ...]]] = defaultdict(set)
    for r in (r for r in damaged.kafka if r.end > r.start and damaged.rows):
        records = (backup_records(bucket, request.source_blocks, r) if request.source == "backup"
                   else kafka_records(kafka, r))
        scratch = ObstoreBucket(MemoryStore(), f"memory://repair-scratch-{uuid.uuid4().hex}")
        written = write_chunk(spec, scratch, records,
                              Chunk(r.topic, r.partition, r.incarnation, r.start, r.end, damaged.time_ms))
        for meta in written.blocks:
            if meta.tenant != damaged.tenant or meta.partition_values != damaged.partition_values:
                continue
            for dataset in meta.datasets:
                if dataset.kind in kinds:
                    tables[dataset.name].append(read_dataset(scratch, meta, dataset))
                    labels[dataset.name].update(tuple(sorted(ls.items())) for ls in dataset.labels)
    datasets = []
    for entry in damaged.datasets:
        found = tables.pop(entry.name, [])
        rows = sum(t.num_rows for t in found)
        if rows != entry.rows:
            return BuildResult(problem=f"the records found for {entry.name} are {rows} rows; the damaged block "
                                       f"held {entry.rows}: not rebuilt")
        if not rows:
            continue
        table = pa.concat_tables(found, promote_options="permissive")
        time_column = "event_time" if "event_time" in table.column_names else "timestamp"
        datasets.append(DatasetInput(entry.kind, entry.topic, table, time_column,
                                     labels=[dict(ls) for ls in sorted(labels[entry.name])],
                                     clamp=(entry.min_time, entry.max_time), record=entry.record))
    if tables:
        return BuildResult(problem=f"the records found hold datasets the damaged block did not: {sorted(tables)}")
    spec_out = BlockSpec(
        id=request.output, tenant=damaged.tenant, group=damaged.group, generation=damaged.generation,
        shard=damaged.shard, level=damaged.level, kafka=damaged.kafka, partition_values=damaged.partition_values,
        sources=erased_lineage(damaged, request.output), parents=[damaged.id], parser=damaged.parser,
        derived_from=sorted({*damaged.derived_from, *(m.id for m in request.source_blocks)}))
    planned = {d.name: d for d in plan_block(spec_out, datasets).datasets}
    for entry in damaged.datasets:
        if entry.rows and (problem := _differs(entry, planned[entry.name])):
            return BuildResult(problem=f"the records found for {entry.name} differ from the damaged block's: "
                                       f"{problem}: not rebuilt")
    return BuildResult(output=write_block(bucket, spec_out, datasets))


def _differs(was: Dataset, now: Dataset) -> str:
    """What tells two datasets' records apart from their metadata alone (row groups may be cut otherwise)."""
    for what, a, b in (("time range", (was.min_time, was.max_time), (now.min_time, now.max_time)),
                       ("columns", sorted(was.columns), sorted(now.columns)),
                       ("label sets", sorted(map(sorted, (ls.items() for ls in was.labels))),
                        sorted(map(sorted, (ls.items() for ls in now.labels))))):
        if a != b:
            return f"{what} {b} where it held {a}"
    return ""


def backup_records(bucket: Bucket, blocks: list[BlockMeta], r: KafkaRange) -> pa.Table:
    """The records of ``r`` held by backup-group blocks, verbatim, each once, in offset order."""
    tables = []
    for meta in blocks:
        if not any((q.topic, q.partition, q.incarnation) == (r.topic, r.partition, r.incarnation) for q in meta.kafka):
            continue
        tables += [t.cast(BACKUP_SCHEMA) for t in backup_rows(bucket, meta, r.topic, r.partition, r.start, r.end)]
    if not tables:
        return BACKUP_SCHEMA.empty_table()
    table = pa.concat_tables(tables).sort_by([("offset", "ascending")])
    offsets = table.column("offset")
    if table.num_rows > 1:
        first = pa.concat_arrays([pa.array([True]), pc.not_equal(offsets.slice(1), offsets.slice(0, table.num_rows - 1))
                                 .combine_chunks()])
        table = table.filter(first)
    return table


def kafka_records(kafka: KafkaConfig, r: KafkaRange) -> pa.Table:
    """The records of ``r`` as a read_committed consumer sees them, in the backup schema (as Spark's Kafka source
    hands them to ingest), after checking that the topic is still the incarnation ``r`` was read from."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    now = describe_topics(kafka, [r.topic]).get(r.topic)
    if now is None or now.incarnation != r.incarnation:
        raise ShaleError(f"{r.topic}[{r.partition}]: the topic incarnation {r.incarnation} is gone from Kafka "
                         f"(now {now.incarnation if now else 'no such topic'})")
    consumer = Consumer({**client_options(kafka), "group.id": f"shale-repair-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "enable.partition.eof": True})
    rows: list[dict[str, Any]] = []
    try:
        consumer.assign([TopicPartition(r.topic, r.partition, r.start)])
        for message in _messages(consumer, KafkaError._PARTITION_EOF):
            offset = message.offset()
            if offset is None or offset >= r.end:
                break
            kind, stamp = message.timestamp()
            headers = message.headers()
            rows.append({"topic": r.topic, "partition": r.partition, "offset": offset,
                         "timestamp": stamp * 1000, "timestamp_type": {1: 0, 2: 1}.get(kind, -1),
                         "key": message.key(), "value": message.value(),
                         "headers": [{"key": k, "value": v} for k, v in headers] if headers else None})
    finally:
        consumer.close()
    return pa.Table.from_pylist(rows, schema=BACKUP_SCHEMA)


def _messages(consumer: Any, eof: int) -> Iterator[Any]:
    """Messages until the partition's end (read_committed: its last stable offset), within the deadline."""
    deadline = time.monotonic() + KAFKA_READ_DEADLINE
    while time.monotonic() < deadline:
        for message in consumer.consume(num_messages=10_000, timeout=1.0):
            error = message.error()
            if error is None:
                yield message
            elif error.code() == eof:
                return
            else:
                raise RetryableError(f"Kafka read failed: {error}")
    raise RetryableError(f"reading from Kafka took longer than {KAFKA_READ_DEADLINE:.0f}s")


class SparkBuilder:
    """Each build is a one-task Spark job (as the compaction worker runs merges)."""

    def __init__(self, spark: SparkSession, bucket: BucketConfig, ingest: IngestConfig, kafka: KafkaConfig) -> None:
        self.spark, self.bucket, self.ingest, self.kafka = spark, bucket, ingest, kafka

    def build(self, request: BuildRequest) -> BuildResult:
        payload = request.model_dump_json()
        bucket, ingest, kafka = self.bucket, self.ingest, self.kafka
        sc = self.spark.sparkContext
        sc.setJobGroup(f"shale-repair-{uuid.uuid4().hex[:8]}", f"repair {request.action} {request.output}")
        [result] = results_counted(sc.parallelize([payload], 1)
                                   .map(with_requests(lambda p: run_build(p, bucket, ingest, kafka))).collect())
        return BuildResult.model_validate_json(result)


class LocalBuilder:
    """Builds in this process, with the same ``run_build`` a Spark task runs (for tests and small repairs)."""

    def __init__(self, bucket: BucketConfig, ingest: IngestConfig, kafka: KafkaConfig) -> None:
        self.bucket, self.ingest, self.kafka = bucket, ingest, kafka

    def build(self, request: BuildRequest) -> BuildResult:
        return BuildResult.model_validate_json(run_build(request.model_dump_json(), self.bucket, self.ingest,
                                                         self.kafka))
