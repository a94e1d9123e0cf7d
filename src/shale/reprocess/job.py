"""``shale reprocess``: a Spark batch job from backup-group blocks to a new partition-group generation.

It works in rounds. Per Kafka partition, the backup blocks of the range give the partition's offsets as intervals
(a compacted backup block may hold several intervals of a partition, interleaved with another block's). Each
round takes, per partition, the next offsets from its committed end in generation N (or from its first interval),
as far as the intervals continue without a gap, within one topic incarnation, over at most a few blocks (so that
a killed run loses little) and about a task's memory budget of records. One Spark task per partition reads the
records of that range from the blocks that hold them, parses them with the chosen parser (and, when one is named,
every record read as the named reader schema: ``shale.reprocess.schema``) and writes
partition-group blocks of generation N in chunks exactly as ingestion does (``ChunkWriter``: deterministic ids,
meta.json last, quarantine for rejects), and the round commits with one ``CommitIngestBatch(writer="reprocess")``
built by the same function ingestion uses. A killed run resumes from the committed offsets of generation N: no
duplicates, no gaps. The metastore refuses a reprocess commit into a generation live ingestion writes (and the
reverse), so the two never share one. Every written block names the backup blocks it came from
(``derived_from``).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from shale.block import BlockMeta
from shale.config import ParserRule, ShaleConfig
from shale.encoder import decode_written, load_parser
from shale.errors import ConfigError
from shale.failpoints import failpoint
from shale.ingest import IngestConflictError, PartitionRange, batch_commit
from shale.metastore import BlockQueries, Commands, OffsetReads
from shale.objstore import results_counted, with_requests
from shale.reprocess.schema import ReaderSchema, resolve_reader
from shale.reprocess.task import run_partition
from shale.reprocess.wire import PartitionWork, RoundSpec, encode_spec, encode_work
from shale.schemas import KnownSchemas

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
    reader_schema_id: int = 0
    """The registry id of the named reader schema (0: none named)."""


@dataclass(frozen=True)
class Interval:
    """Offsets ``[start, end)`` of one partition incarnation, held by one backup block."""

    start: int
    end: int
    incarnation: str
    block: BlockMeta


class ReprocessStore(BlockQueries, OffsetReads, Commands, Protocol):
    """What reprocessing needs from the metastore."""


class ReprocessJob:
    def __init__(self, config: ShaleConfig, metastore: ReprocessStore, spark: SparkSession, *, tenant: str, topic: str,
                 start: int, end: int, parser: str, options: dict[str, Any], generation: int,
                 from_generation: int = 1, round_bytes: int | None = None, blocks_per_round: int = 4,
                 reader: ReaderSchema | None = None) -> None:
        if generation == config.ingest.generation:
            raise ConfigError(f"--generation {generation} is the generation live ingestion writes (ingest.generation); "
                              "reprocess into a new one, then switch readers to it")
        self.known = KnownSchemas()
        if reader is not None:  # resolved once, here; the executors remember it
            options, self.known = resolve_reader(config.ingest.schema_registry, parser, options, reader)
        load_parser(parser, options)  # fails now, in the driver, on a bad parser or options
        self.config = config
        self.metastore = metastore
        self.spark = spark
        self.tenant, self.topic, self.start, self.end = tenant, topic, start, end
        self.generation, self.from_generation = generation, from_generation
        self.round_bytes = round_bytes or config.ingest.max_task_bytes // 4
        self.blocks_per_round = blocks_per_round
        self.ingest = config.ingest.model_copy(update={
            "parsers": [ParserRule(topic_pattern=".*", parser=parser, options=options)], "tenants": [],
            "default_tenant": tenant, "tenant_header": ""})
        self.report = ReprocessReport(reader_schema_id=self.known.schemas[0].id if self.known.schemas else 0)

    def _intervals(self) -> tuple[dict[int, list[Interval]], list[str]]:
        """Per partition, the backup blocks' intervals of the range in offset order, and the topic incarnations
        from oldest to newest ('' first: blocks written before incarnations were recorded)."""
        metas = [m for m in self.metastore.query_blocks([self.tenant], self.start, self.end,
                                                        f'{{topic="{self.topic}"}}', group="backup")
                 if m.generation == self.from_generation]
        self.report.backup_blocks = len(metas)
        first_seen: dict[str, int] = {}
        per: dict[int, list[Interval]] = defaultdict(list)
        for meta in metas:
            for r in meta.kafka:
                if r.topic == self.topic and r.end > r.start:
                    per[r.partition].append(Interval(r.start, r.end, r.incarnation, meta))
                    first_seen[r.incarnation] = min(first_seen.get(r.incarnation, meta.time_ms), meta.time_ms)
        order = sorted(first_seen, key=lambda i: (i != "", first_seen[i]))
        for intervals in per.values():
            intervals.sort(key=lambda i: (order.index(i.incarnation), i.start))
        return per, order

    @staticmethod
    def _round(intervals: list[Interval], done: tuple[int, str] | None, budget: int, order: list[str],
               max_blocks: int) -> tuple[PartitionRange, list[BlockMeta]] | None:
        """The next round's range of one partition and the blocks holding it, or None when nothing is left."""

        def same(a: str, b: str) -> bool:
            return a == b or not a or not b

        pending = intervals
        if done is not None:
            end_done, current = done
            rank = order.index(current) if current in order else -1
            pending = [i for i in intervals if not (same(i.incarnation, current) and i.end <= end_done)
                       and not (i.incarnation and order.index(i.incarnation) < rank)]
        if not pending:
            return None
        incarnation = pending[0].incarnation
        same_run = [i for i in pending if i.incarnation == incarnation]
        start = same_run[0].start
        if done is not None and same(incarnation, done[1]):
            start = max(start, done[0])
        end, size, blocks = start, 0.0, list[BlockMeta]()
        for interval in same_run:
            if interval.start > end:
                break  # a gap: this round stops before it
            if interval.end <= end:
                continue
            # The interval's share of its block's data: blocks hold several partitions' intervals.
            block_offsets = sum(r.end - r.start for r in interval.block.kafka) or 1
            data = sum(d.bytes for d in interval.block.datasets) * (interval.end - end) / block_offsets
            if blocks and (size + data > budget or (interval.block not in blocks and len(blocks) >= max_blocks)):
                break
            end, size = interval.end, size + data
            if interval.block not in blocks:
                blocks.append(interval.block)
        return PartitionRange("", 0, incarnation, start, end), blocks

    def _rounds(self) -> Iterator[list[tuple[PartitionRange, list[BlockMeta]]]]:
        per, order = self._intervals()
        committed = {o.partition: (o.committed_end, o.incarnation)
                     for o in self.metastore.offsets("partition", self.generation) if o.topic == self.topic}
        while True:
            round_ = []
            for partition, intervals in sorted(per.items()):
                found = self._round(intervals, committed.get(partition), self.round_bytes, order,
                                    self.blocks_per_round)
                if found is not None:
                    work, blocks = found
                    round_.append((PartitionRange(self.topic, partition, work.incarnation, work.start, work.end),
                                   blocks))
            if not round_:
                return
            yield round_
            for work, _ in round_:
                committed[work.partition] = (work.end, work.incarnation)

    def run(self, progress: Callable[[int, int], None] | None = None) -> ReprocessReport:
        bucket, registry = self.config.bucket, self.config.ingest.schema_registry
        spec = encode_spec(RoundSpec(int(time.time() * 1000), self.generation, self.ingest,
                                     self.config.ingest.max_task_bytes, self.known))
        total = 0
        for round_ in self._rounds():
            total = total or self.report.backup_blocks
            payloads = [encode_work(PartitionWork(work, tuple(metas))) for work, metas in round_]
            results = results_counted(self.spark.sparkContext.parallelize(payloads, len(payloads))
                                      .map(with_requests(lambda p: run_partition(p, spec, bucket, registry)))
                                      .collect())
            written = [w for raw in results for w in decode_written(raw)]
            command = batch_commit(written, [work for work, _ in round_], group="partition",
                                   generation=self.generation, writer="reprocess",
                                   batch=f"reprocess/{self.report.rounds}")
            outcome = self.metastore.submit(command)
            if not outcome.ok:
                raise IngestConflictError(f"reprocess round refused by the metastore: {outcome.message}")
            self.report.records += sum(w.records for w in written)
            self.report.quarantined += sum(w.quarantined for w in written)
            self.report.blocks_written += len(command.blocks)
            self.report.rounds += 1
            if progress is not None:
                progress(sum(len(metas) for _, metas in round_), total)
            log.info("reprocess round committed", extra={"round": self.report.rounds, "blocks": len(command.blocks),
                                                         "records": sum(w.records for w in written)})
            failpoint("reprocess.after-round")
        return self.report
