"""``shale reprocess``: a Spark batch job from backup-group blocks to a new partition-group generation.

It works in rounds. Each round takes, per Kafka partition, the next backup block(s) of the range (in offset
order), runs one Spark task per partition that parses their records with the chosen parser and writes
partition-group blocks of generation N exactly as ingestion does (``write_partition``: deterministic ids,
meta.json last, quarantine for rejects, offsets already committed skipped), and then commits the round with one
``CommitIngestBatch`` (group partition, generation N). A killed run resumes from the committed offsets of
generation N: no duplicates, no gaps. It never touches the generation live ingestion writes, so the two run side
by side. Every written block names the backup blocks it came from (``derived_from``).
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from shale.block import BlockMeta, read_dataset
from shale.config import BucketConfig, IngestConfig, ParserRule, ShaleConfig
from shale.errors import ConfigError
from shale.failpoints import failpoint
from shale.ingest.blocks import GroupSpec, write_partition
from shale.ingest.committer import IngestConflictError
from shale.ingest.parsers import load_parser
from shale.metastore import CommitIngestBatch, Metastore, OffsetRange
from shale.objstore import task_bucket

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


@dataclass
class ReprocessReport:
    rounds: int = 0
    backup_blocks: int = 0
    records: int = 0
    quarantined: int = 0
    blocks_written: int = 0
    skipped_committed: int = 0


@dataclass(frozen=True)
class PartitionWork:
    """One task of one round: backup blocks of one Kafka partition, in offset order."""

    topic: str
    partition: int
    blocks: list[str]
    committed_end: int | None


def run_partition(work_json: str, metas_json: str, spec_json: str, bucket_config: BucketConfig) -> str:
    """A Spark task: parse one partition's backup records of this round into partition-group blocks."""
    work = json.loads(work_json)
    metas = [BlockMeta.model_validate(m) for m in json.loads(metas_json)]
    spec_data = json.loads(spec_json)
    spec = GroupSpec("partition", spec_data["generation"], bucket_config,
                     IngestConfig.model_validate(spec_data["ingest"]))
    bucket = task_bucket(bucket_config)
    tables = []
    for meta in metas:
        for dataset in meta.datasets:
            if dataset.kind == "records" and dataset.topic == work["topic"]:
                table = read_dataset(bucket, meta, dataset)
                tables.append(table.filter(pc.equal(table.column("partition"), work["partition"])))
    table = pa.concat_tables(tables).sort_by([("offset", "ascending")]) if tables else None
    if table is None or table.num_rows == 0:
        return json.dumps({"result": None})
    result = write_partition(spec, bucket, table, work["committed_end"], derived_from=[m.id for m in metas])
    if result is None:
        return json.dumps({"result": None})
    return json.dumps({"result": {"start": result.start, "end": result.end, "records": result.records,
                                  "quarantined": result.quarantined,
                                  "metas": [m.model_dump(mode="json") for m in result.metas]}})


class ReprocessJob:
    def __init__(self, config: ShaleConfig, metastore: Metastore, spark: SparkSession, *, tenant: str, topic: str,
                 start: int, end: int, parser: str, options: dict[str, Any], generation: int,
                 from_generation: int = 1, blocks_per_round: int = 4) -> None:
        if generation == from_generation and generation == config.ingest.generation:
            raise ConfigError(f"--generation {generation} is the generation live ingestion writes; reprocess into a "
                              "new one, then switch readers to it")
        load_parser(parser, options)  # fails now, in the driver, on a bad parser or options
        self.config = config
        self.metastore = metastore
        self.spark = spark
        self.tenant, self.topic, self.start, self.end = tenant, topic, start, end
        self.generation, self.from_generation = generation, from_generation
        self.blocks_per_round = blocks_per_round
        self.ingest = config.ingest.model_copy(update={
            "parsers": [ParserRule(topic_pattern=".*", parser=parser, options=options)], "tenants": [],
            "default_tenant": tenant, "tenant_header": ""})
        self.report = ReprocessReport()

    def _backup_blocks(self) -> dict[int, list[BlockMeta]]:
        """The backup blocks of the range per Kafka partition, in offset order."""
        metas = [m for m in self.metastore.query_blocks([self.tenant], self.start, self.end,
                                                        f'{{topic="{self.topic}"}}', group="backup")
                 if m.generation == self.from_generation]
        per: dict[int, list[BlockMeta]] = defaultdict(list)
        for meta in metas:
            for r in meta.kafka:
                if r.topic == self.topic:
                    per[r.partition].append(meta)
        for partition, blocks in per.items():
            blocks.sort(key=lambda m: min(r.start for r in m.kafka if r.topic == self.topic
                                          and r.partition == partition))
        return per

    def _rounds(self) -> Iterator[list[tuple[PartitionWork, list[BlockMeta]]]]:
        per = self._backup_blocks()
        self.report.backup_blocks = sum(len(b) for b in per.values())
        committed = {o.partition: o.committed_end for o in self.metastore.offsets("partition", self.generation)
                     if o.topic == self.topic}
        queues = {}
        for partition, blocks in per.items():
            done = committed.get(partition)
            pending = [m for m in blocks if done is None or self._end(m, partition) > done]
            self.report.skipped_committed += len(blocks) - len(pending)
            queues[partition] = pending
        while any(queues.values()):
            round_ = []
            for partition, pending in sorted(queues.items()):
                take, queues[partition] = pending[:self.blocks_per_round], pending[self.blocks_per_round:]
                if take:
                    round_.append((PartitionWork(self.topic, partition, [m.id for m in take],
                                                 committed.get(partition)), take))
            yield round_
            for work, take in round_:
                committed[work.partition] = self._end(take[-1], work.partition)

    def _end(self, meta: BlockMeta, partition: int) -> int:
        return max(r.end for r in meta.kafka if r.topic == self.topic and r.partition == partition)

    def run(self, progress: Callable[[int, int], None] | None = None) -> ReprocessReport:
        bucket = self.config.bucket
        spec = json.dumps({"generation": self.generation, "ingest": self.ingest.model_dump(mode="json")})
        total = None
        for round_ in self._rounds():
            total = total or self.report.backup_blocks
            payloads = [(json.dumps(w.__dict__), json.dumps([m.model_dump(mode="json") for m in metas]))
                        for w, metas in round_]
            results = (self.spark.sparkContext.parallelize(payloads, len(payloads))
                       .map(lambda p: run_partition(p[0], p[1], spec, bucket)).collect())
            blocks: list[BlockMeta] = []
            ranges: list[OffsetRange] = []
            for (work, _), raw in zip(round_, results, strict=True):
                result = json.loads(raw)["result"]
                if result is None:
                    continue
                metas = [BlockMeta.model_validate(m) for m in result["metas"]]
                blocks += metas
                ranges.append(OffsetRange(topic=self.topic, partition=work.partition, start=result["start"],
                                          end=result["end"]))
                self.report.records += result["records"]
                self.report.quarantined += result["quarantined"]
            if ranges:
                command = CommitIngestBatch(group="partition", generation=self.generation,
                                            batch=f"reprocess/{self.report.rounds}", ranges=ranges, blocks=blocks)
                outcome = self.metastore.submit(command)
                if not outcome.ok:
                    raise IngestConflictError(f"reprocess round refused by the metastore: {outcome.message}")
                self.report.blocks_written += len(blocks)
            self.report.rounds += 1
            done = sum(len(w.blocks) for w, _ in round_)
            if progress is not None:
                progress(done, total or 0)
            failpoint("reprocess.after-round")
        return self.report
