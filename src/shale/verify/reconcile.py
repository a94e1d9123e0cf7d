"""``shale verify``: reconcile Kafka's offsets with the index and the blocks' contents (guarantee 1).

For each partition of the topic, in the topic's current incarnation (its Kafka topic id; blocks of an earlier
incarnation of a recreated topic are not compared with today's offsets): the offsets that hold records in Kafka
(read with a read_committed consumer, so transaction markers, aborted records and compacted-away offsets are not
expected), the metastore's committed end, and the offsets stored in the group's live blocks (records and
quarantine datasets, read one column at a time). Every Kafka offset below the committed end must be stored
exactly once; offsets Kafka no longer holds (retention) are checked for duplicates only. A stored offset that
Kafka still holds the range of but no read_committed consumer sees is ``not_in_kafka``: an aborted record stored
as data (a failure), unless the topic is compacted (then Kafka may have removed it after it was read).

Offsets whose record an erasure removed (``shale erase``, DESIGN 19) are ``erased``, with the erasure's id: stored
no more by request, never counted as missing.

Offsets above the committed end are never ingested yet, but not all of them can still be: those below Kafka's
earliest offset were deleted by its retention before the group read them (``lost``, the range
``[committed end, earliest)``; the ingest plan reports the same ``Loss`` and waits for ``shale offsets
acknowledge-loss``, which moves the committed end past them). Only offsets Kafka still holds are
``not_yet_ingested`` (``pending``).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import NamedTuple, Protocol

import pyarrow as pa

from shale.block import BlockMeta, Dataset, IncarnationCodes, read_dataset, row_incarnations
from shale.config import KafkaConfig
from shale.errors import ConfigError
from shale.index import OffsetRow
from shale.kafka import admin, describe_topics, existing_offsets, offset_bounds
from shale.metastore import BlockQueries, OffsetReads, Tenants, erased_offsets, every_erasure
from shale.objstore import BucketReader


@dataclass
class PartitionReport:
    partition: int
    kafka_earliest: int
    kafka_end: int
    committed_end: int | None
    stored: int
    quarantined: int
    missing: int
    duplicated: int
    not_yet_ingested: int
    missing_sample: list[int] = field(default_factory=list)
    incarnation: str = ""
    not_in_kafka: int = 0
    skipped: int = 0
    lost: int = 0
    """Offsets ``[committed_end, kafka_earliest)``: deleted by Kafka before the group read them, not acknowledged."""
    action: str = ""
    """The command that accepts the loss (``shale offsets acknowledge-loss ...``), when ``lost``."""
    erased: int = 0
    """Committed offsets whose record an erasure removed (``shale erase``): not stored by request, not missing."""
    erasures: list[str] = field(default_factory=list)
    """The erasures (request ids) that removed them."""


@dataclass
class VerifyReport:
    group: str
    generation: int
    topic: str
    partitions: list[PartitionReport]

    @property
    def missing(self) -> int:
        return sum(p.missing for p in self.partitions)

    @property
    def duplicated(self) -> int:
        return sum(p.duplicated for p in self.partitions)

    @property
    def quarantined(self) -> int:
        return sum(p.quarantined for p in self.partitions)

    @property
    def stored(self) -> int:
        return sum(p.stored for p in self.partitions)

    compacted: bool = False

    @property
    def not_in_kafka(self) -> int:
        return sum(p.not_in_kafka for p in self.partitions)

    @property
    def not_yet_ingested(self) -> int:
        return sum(p.not_yet_ingested for p in self.partitions)

    @property
    def lost(self) -> int:
        return sum(p.lost for p in self.partitions)

    @property
    def erased(self) -> int:
        return sum(p.erased for p in self.partitions)

    @property
    def ok(self) -> bool:
        """Nothing committed is missing or stored twice (records not yet ingested or quarantined aside)."""
        return self.missing == 0 and self.duplicated == 0 and (self.compacted or self.not_in_kafka == 0)

    @property
    def status(self) -> str:
        """The one-word verdict, worst first: PROBLEMS (missing, duplicated or aborted records stored), LOST (Kafka
        deleted offsets before the group read them, not acknowledged: they will never come), NOT YET (records Kafka
        holds are not ingested yet), QUARANTINED (all stored once, some as quarantine), else OK."""
        if not self.ok:
            return "PROBLEMS"
        if self.lost:
            return "LOST"
        if self.not_yet_ingested:
            return "NOT YET"
        return "QUARANTINED" if self.quarantined else "OK"

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "missing": self.missing, "duplicated": self.duplicated,
                "quarantined": self.quarantined, "stored": self.stored, "not_in_kafka": self.not_in_kafka,
                "not_yet_ingested": self.not_yet_ingested, "lost": self.lost, "erased": self.erased, "ok": self.ok,
                "status": self.status}


def pending(earliest: int, end: int, committed_end: int | None) -> tuple[range, range]:
    """The offsets of a partition not ingested: (lost, not yet ingested). Kafka holds ``[earliest, end)``; the
    group has committed up to ``committed_end`` (None: never, it starts at Kafka's earliest). Lost: above the
    committed end and below Kafka's earliest, deleted before they were read (an acknowledged loss moved the
    committed end past them). Not yet ingested: above the committed end and still in Kafka."""
    start = earliest if committed_end is None else committed_end
    readable = max(start, earliest)  # the first offset not ingested that Kafka still holds
    return range(start, readable), range(readable, max(readable, end))


def acknowledge_command(group: str, generation: int, topic: str, partition: int, to: int) -> str:
    """The command that accepts a loss up to ``to`` (Kafka's earliest offset)."""
    return (f"shale offsets acknowledge-loss --group {group} --generation {generation} --topic {topic} "
            f"--partition {partition} --to {to}")


class StoredBlocks(Tenants, BlockQueries, OffsetReads, Protocol):
    """What verify and the ledger read from the metastore (the embedded service and the HTTP client both fit)."""


def erased_of(metastore: object, topic: str, incarnation: str = "") -> dict[int, dict[int, str]]:
    """Per partition of ``topic``, its erased offsets and the erasure of each (a metastore that keeps no
    erasures: none)."""
    rows = getattr(metastore, "erasures", None)
    return erased_offsets(every_erasure(rows), topic, incarnation) if rows is not None else {}


class NothingStored:
    """The metastore of a configuration that never ingested (an embedded one without a state file): verify then
    reports every record Kafka holds as not yet ingested, instead of refusing to look."""

    def tenants(self) -> list[str]:
        return []

    def query_blocks(self, tenants: Sequence[str], start: int, end: int, selector: str = "",
                     group: str | None = None) -> list[BlockMeta]:
        return []

    def offsets(self, group: str | None = None, generation: int | None = None) -> list[OffsetRow]:
        return []


def group_blocks(metastore: StoredBlocks, group: str, generation: int, topic: str,
                 incarnation: str | None = None) -> list[BlockMeta]:
    """The group's live blocks holding ``topic`` (every tenant), with only that topic's datasets; with
    ``incarnation``, only blocks of that topic incarnation (or of unrecorded incarnations, written before Shale
    kept them)."""
    tenants = metastore.tenants()
    if not tenants:
        return []
    metas = metastore.query_blocks(tenants, 0, 2**62, f'{{topic="{topic}"}}', group=group)
    return [m for m in metas if m.generation == generation and (incarnation is None or any(
        r.topic == topic and r.incarnation in ("", incarnation) for r in m.kafka))]


def _compacted(kafka: KafkaConfig, topic: str) -> bool:
    from confluent_kafka.admin import ConfigResource

    client = admin(kafka)  # kept alive until its answer arrives
    for future in client.describe_configs([ConfigResource("topic", topic)]).values():
        entry = future.result(timeout=30).get("cleanup.policy")
        return entry is not None and "compact" in str(entry.value)
    return False


class Stored(NamedTuple):
    offsets: dict[int, list[int]]
    """Per partition, the offsets of the rows stored (of the incarnation asked for)."""
    quarantined: dict[int, int]
    ambiguous: dict[int, set[int]]
    """Per partition, offsets of rows whose incarnation their block cannot tell: a compacted block holding two
    incarnations of a recreated topic whose ranges overlap (offset 5 of each). They count as present, never as
    copies of each other."""


def stored_offsets(bucket: BucketReader, metas: list[BlockMeta], topic: str, incarnation: str | None = None,
                   concurrency: int = 16) -> Stored:
    """Offsets per partition stored in the blocks' datasets of ``topic``, and quarantined counts; with
    ``incarnation``, only the rows of that incarnation in blocks that hold several (``block.records``)."""
    jobs = [(m, d) for m in metas for d in m.datasets if d.topic == topic]

    def load(job: tuple[BlockMeta, Dataset]) -> tuple[str, pa.Table, pa.Table | None]:
        """The dataset's (partition, offset) rows of ``incarnation``, and those its block cannot attribute."""
        meta, dataset = job
        table = read_dataset(bucket, meta, dataset, columns=["partition", "offset"], whole_object=None)
        if incarnation is None or len({r.incarnation for r in meta.kafka if r.topic == topic}) < 2:
            return dataset.kind, table, None
        codes = IncarnationCodes()
        rows = row_incarnations(meta, topic, table.column("partition"), table.column("offset"), codes)
        return dataset.kind, table.filter(rows == codes.code(incarnation)), table.filter(rows < 0)

    found = Stored(defaultdict(list), {}, defaultdict(set))
    quarantined: Counter[int] = Counter()
    with ThreadPoolExecutor(concurrency) as pool:
        for kind, mine, unsure in pool.map(load, jobs):
            for partition, offset in zip(mine.column("partition").to_pylist(), mine.column("offset").to_pylist(),
                                         strict=True):
                found.offsets[partition].append(offset)
            if unsure is not None:
                for partition, offset in zip(unsure.column("partition").to_pylist(),
                                             unsure.column("offset").to_pylist(), strict=True):
                    found.ambiguous[partition].add(offset)
            if kind == "quarantine":
                quarantined.update(mine.column("partition").to_pylist())
                if unsure is not None:
                    quarantined.update(unsure.column("partition").to_pylist())
    found.quarantined.update(quarantined)
    return found


def verify_topic(metastore: StoredBlocks, bucket: BucketReader, kafka: KafkaConfig, group: str, generation: int,
                 topic: str) -> VerifyReport:
    state = describe_topics(kafka, [topic]).get(topic)
    if state is None:
        raise ConfigError(f"topic {topic!r} does not exist in Kafka at {kafka.bootstrap_servers}: nothing to verify")
    parts = list(state.partitions)
    marks = offset_bounds(kafka, [(topic, p) for p in parts])
    committed = {o.partition: o for o in metastore.offsets(group, generation)
                 if o.topic == topic and o.incarnation in ("", state.incarnation)}
    stored, quarantined, ambiguous = stored_offsets(
        bucket, group_blocks(metastore, group, generation, topic, state.incarnation), topic, state.incarnation)
    erased = erased_of(metastore, topic, state.incarnation)
    reports = []
    for partition in parts:
        earliest, end = marks[(topic, partition)]
        row = committed.get(partition)
        done = row.committed_end if row is not None else None
        counts = Counter(stored.get(partition, []))
        duplicated = sum(n - 1 for n in counts.values() if n > 1)
        upto = min(end, done) if done is not None else earliest
        in_kafka = existing_offsets(kafka, topic, partition, earliest, upto)
        visible = set(in_kafka)
        gone = erased.get(partition, {})
        removed = sorted(o for o in gone if o not in counts and (done is None or o < done))
        missing = [o for o in in_kafka if o not in counts and o not in ambiguous.get(partition, ()) and o not in gone]
        unexpected = [o for o in counts if earliest <= o < upto and o not in visible]
        lost, not_yet = pending(earliest, end, done)
        reports.append(PartitionReport(
            partition=partition, kafka_earliest=earliest, kafka_end=end, committed_end=done,
            stored=sum(counts.values()), quarantined=quarantined.get(partition, 0), missing=len(missing),
            duplicated=duplicated, not_yet_ingested=len(not_yet), missing_sample=missing[:10],
            incarnation=state.incarnation, not_in_kafka=len(unexpected), skipped=row.skipped if row is not None else 0,
            lost=len(lost), action=acknowledge_command(group, generation, topic, partition, earliest) if lost else "",
            erased=len(removed), erasures=sorted({gone[o] for o in removed})))
    return VerifyReport(group, generation, topic, reports, compacted=_compacted(kafka, topic))
