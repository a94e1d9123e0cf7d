"""Turning a chunk of Kafka records into blocks (runs in Spark tasks, for ingest and reprocess).

A chunk covers exact offsets ``[start, end)`` of one or more Kafka partitions (everything one ingest task read of
them since its previous chunk); the records it holds are those of the ranges a read_committed consumer sees
(transaction markers, aborted records and compacted-away offsets leave gaps). Its blocks are cut by topic, never
by partition: every block of a topic carries all of the chunk's ranges of that topic, so the blocks of a batch tile
the offsets it commits and the bucket alone tells which offsets were read (rebuild depends on it), and a batch
writes objects in proportion to its tasks, topics, tenants and hours, not to its partitions. In a block of several
partitions every row group holds one partition's rows, named in the dataset's table of contents
(``Dataset.row_group_partitions``). Ids are deterministic from the group, generation, topic, the ranges
(incarnation, partition, start, end), tenant and partition values, with the batch's read time as their ULID time,
so a retried or speculative task rewrites the same keys.

* backup group: one block per (topic, tenant), the records verbatim;
* partition group: the topic's parser gives each record an event time (dt, hour) and columns; one block per
  (topic, tenant, dt[, hour]), a dataset per record type;
* records whose tenant is invalid (a rule or a header that names no valid tenant), or that the parser rejects, go
  to one quarantine block per tenant with the reason (the default tenant when the record's own is invalid).

Times: a record's Kafka timestamp is stored as it is, whatever it holds (-1, microseconds written as
milliseconds, a far future). Block times are bounded: the ULID time is the batch's read time, and the data-time
range in metadata clamps record times into ``[0, read time + MAX_FUTURE_MS]``. In the partition group the event
time decides the partition, so an event time outside that window is quarantined with the reason.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field

from shale.block import (
    QUARANTINE_SCHEMA,
    BlockMeta,
    BlockSpec,
    DatasetInput,
    KafkaRange,
    ParserInfo,
    check_record_name,
    deterministic_block_id,
    write_block,
)
from shale.config import BucketConfig, IngestConfig
from shale.encoder.parsers import Parser, load_parser
from shale.encoder.parsing import parse_records
from shale.encoder.records import header_value
from shale.encoder.tenants import TenantMapper
from shale.errors import InvalidNameError
from shale.objstore import Bucket

GROUPS = ("backup", "partition")
MAX_FUTURE_MS = 24 * 3600 * 1000
"""How far past its read time a record's time may lie and still count as its data time (clock skew allowance)."""


@dataclass
class GroupSpec:
    """What a Spark task needs to write one group's blocks (pickled to the executors)."""

    group: str
    generation: int
    bucket: BucketConfig
    ingest: IngestConfig
    shard: int = 0
    """The shard of the group this driver holds: every block it writes carries it (and its id's key)."""
    _parsers: dict[str, Parser | str] = field(default_factory=dict, repr=False)
    _tenants: TenantMapper | None = field(default=None, repr=False)

    @property
    def tenants(self) -> TenantMapper:
        if self._tenants is None:
            self._tenants = TenantMapper.from_config(self.ingest)
        return self._tenants

    def parser_for(self, topic: str) -> Parser | str:
        """The topic's parser, or the reason there is none (every record then goes to quarantine)."""
        if topic not in self._parsers:
            rule = next((r for r in self.ingest.parsers if re.fullmatch(r.topic_pattern, topic)), None)
            parser: Parser | str = (load_parser(rule.parser, dict(rule.options)) if rule is not None
                                    else f"no parser is configured for topic {topic!r} (ingest.parsers)")
            if not isinstance(parser, str):
                parser.bind(self.ingest)
            self._parsers[topic] = parser
        return self._parsers[topic]


@dataclass(frozen=True)
class Chunk:
    """Offsets ``[start, end)`` of one topic-partition incarnation, read at ``read_time_ms``."""

    topic: str
    partition: int
    incarnation: str
    start: int
    end: int
    read_time_ms: int


class Written(BaseModel):
    """What writing one chunk produced for one of its partition ranges: the typed record an ingest or reprocess task
    returns to the driver. ``blocks`` are every block of the range's topic in the chunk, which the chunk's other
    ranges of that topic name too (consumers count a block once, by id)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    topic: str
    partition: int
    incarnation: str = ""
    start: int
    end: int
    records: int = Field(description="records stored, quarantined ones included")
    quarantined: int
    bytes: int = Field(description="bytes of record values")
    blocks: list[BlockMeta]
    peak_rss: int = Field(default=0, description="the task process's peak resident memory while it wrote")
    seconds: dict[str, float] = Field(default_factory=dict, description="seconds spent on this chunk by phase "
                                      "(shale.ingest.task.PHASES), since the chunk before it in its task")
    reasons: dict[str, int] = Field(default_factory=dict, description="the most frequent kinds of quarantine "
                                    "reason (an example of each) and how many records each sent there")


class _WrittenWire(BaseModel):
    """``Written`` records on the wire between a task and its driver: every block once, each record naming its
    blocks by their place in ``blocks`` (a chunk's block names all of its partitions' ranges, and each range's
    ``Written`` names the block: written out per range, a task over P partitions would send, and its driver
    validate, P copies of a block of P ranges)."""

    model_config = ConfigDict(extra="forbid")
    blocks: list[BlockMeta]
    written: list[Written] = Field(description="each with no blocks: ``refs`` names them")
    refs: list[list[int]]


def encode_written(written: list[Written]) -> str:
    """``written`` as one JSON text (``decode_written`` reads it), every block in it once."""
    blocks: list[BlockMeta] = []
    places: dict[str, list[int]] = defaultdict(list)  # a block id's places in ``blocks`` (one, unless ids collide)
    refs = []
    for w in written:
        mine = []
        for block in w.blocks:
            at = next((i for i in places[block.id] if blocks[i] is block or blocks[i] == block), None)
            if at is None:
                at = len(blocks)
                blocks.append(block)
                places[block.id].append(at)
            mine.append(at)
        refs.append(mine)
    return _WrittenWire(blocks=blocks, written=[w.model_copy(update={"blocks": []}) for w in written],
                        refs=refs).model_dump_json()


def decode_written(text: str) -> list[Written]:
    """The ``Written`` records ``encode_written`` wrote, each block validated once and shared by the records that
    name it."""
    wire = _WrittenWire.model_validate_json(text)
    return [w.model_copy(update={"blocks": [wire.blocks[i] for i in refs]})
            for w, refs in zip(wire.written, wire.refs, strict=True)]


def reason_kind(reason: str) -> str:
    """A reason without its record's values (quoted text and numbers), so that reasons of one kind count together."""
    return _VALUES.sub("…", reason)


_VALUES = re.compile(r"'[^']*'|\"[^\"]*\"|\d+")


def top_reasons(reasons: Iterable[tuple[str, int]], top: int = 3) -> dict[str, int]:
    """The ``top`` most frequent kinds of reason, each as its first example (shortened) with the kinds' count."""
    counts: Counter[str] = Counter()
    example: dict[str, str] = {}
    for reason, n in reasons:
        kind = reason_kind(reason)
        counts[kind] += n
        example.setdefault(kind, reason if len(reason) <= 200 else reason[:199] + "…")
    return {example[kind]: n for kind, n in counts.most_common(top)}


def _take(table: pa.Table, rows: list[int]) -> pa.Table:
    return table.take(pa.array(rows, pa.int64()))  # typed: an empty list of indexes must not be null-typed


def _by(values: list[Any]) -> dict[Any, list[int]]:
    groups: dict[Any, list[int]] = defaultdict(list)
    for i, value in enumerate(values):
        groups[value].append(i)
    return groups


def _quarantine(rows: pa.Table, reasons: list[str], parser: str) -> pa.Table:
    return rows.append_column("reason", pa.array(reasons, pa.string())).append_column(
        "parser", pa.array([parser] * rows.num_rows, pa.string())).cast(QUARANTINE_SCHEMA)


def _tenants(spec: GroupSpec, table: pa.Table, topic: str) -> tuple[list[str], list[str | None]]:
    """Each record's tenant, and the reason for records whose tenant is invalid (they go to quarantine)."""
    mapper = spec.tenants
    default, problem = mapper.for_topic(topic)
    if not mapper.header:
        return [default] * table.num_rows, [problem] * table.num_rows
    tenants, problems = [], []
    for headers in table.column("headers").to_pylist():
        tenant, header_problem = mapper.for_header(header_value(headers, mapper.header))
        tenants.append(tenant or default)
        problems.append(header_problem or (problem if tenant is None else None))
    return tenants, problems


def _row_tenants(tenants: list[str], origin: list[int], good: list[int]) -> pa.Array:
    """The tenant of each parsed row (``good``: rows of the group, ``origin``: their rows in the chunk)."""
    if len(set(tenants)) == 1:
        return pa.repeat(pa.scalar(tenants[0], pa.string()), len(good))
    return pa.array(tenants, pa.string()).take(pa.array(np.asarray(origin, np.int64)[np.asarray(good, np.int64)]))


RowGroup = tuple[tuple[str, str, int | None], pa.Array | None, list[tuple[tuple[str, str], ...]]]


def _row_groups(parsed: pa.Table, tenants: pa.Array, labels: list[str]) -> list[RowGroup]:
    """The parsed rows by (tenant, dt, hour), in the order each first appears: the key, its rows (None: every
    row) and its distinct label sets, sorted (a missing label as ""). Grouped by Arrow, not record by record."""
    keys = ["tenant", "dt", "hour"]
    named = [f"label{i}" for i in range(len(labels))]
    keyed = pa.table({"tenant": tenants, "dt": parsed.column("dt"), "hour": parsed.column("hour"),
                      **{f"label{i}": pc.fill_null(parsed.column(n).cast(pa.string()), "")
                         for i, n in enumerate(labels)}})
    sets: dict[tuple[str, str, int | None], set[tuple[tuple[str, str], ...]]] = defaultdict(set)
    for row in keyed.group_by(keys + named, use_threads=False).aggregate([]).to_pylist():
        sets[(row["tenant"], row["dt"], row["hour"])].add(tuple(zip(labels, (row[n] for n in named), strict=True)))
    if len(sets) == 1:
        [(key, found)] = sets.items()
        return [(key, None, sorted(found))]
    grouped = keyed.select(keys).append_column("row", pa.array(np.arange(keyed.num_rows, dtype=np.int64))).group_by(
        keys, use_threads=False).aggregate([("row", "list")])
    lists = grouped.column("row_list").combine_chunks()
    members = {key: lists[i].values
               for i, key in enumerate(zip(*(grouped.column(k).to_pylist() for k in keys), strict=True))}
    return [(key, members[key], sorted(found)) for key, found in sets.items()]


def _record_groups(spec: GroupSpec, table: pa.Table,
                   topic: str) -> tuple[list[tuple[str | None, list[int] | None]], list[tuple[int, str]]]:
    """The chunk's record types, each with its rows (None: every row), in name order, and the (row, reason) of
    records whose type cannot name a dataset. One group of every row, with no type, unless the topic's parser
    stores each record type as its own dataset (``Parser.record_types``); rows whose type cannot be told form a
    group of their own, without a type (their parse says why they are quarantined)."""
    parser = spec.parser_for(topic)
    if isinstance(parser, str) or not parser.per_record_type or not table.num_rows:
        return [(None, None)], []  # the topic strategy: nothing read ahead of parsing
    types = parser.record_types(pc.binary_slice(table.column("value"), 0, parser.header_bytes).to_pylist())
    if types is None:
        return [(None, None)], []
    unnamed: list[tuple[int, str]] = []
    refused: dict[str, str] = {}
    for named in {t for t in types if t is not None}:
        try:
            check_record_name(named)
        except InvalidNameError as exc:
            refused[named] = f"{exc} (the record's type names its dataset and table)"
    groups: dict[str | None, list[int]] = defaultdict(list)
    for row, name in enumerate(types):
        if name is not None and name in refused:
            unnamed.append((row, refused[name]))
        else:
            groups[name].append(row)
    ordered = sorted(groups.items(), key=lambda item: (item[0] is not None, item[0] or ""))
    return [(name, rows) for name, rows in ordered], unnamed


def write_chunk(spec: GroupSpec, bucket: Bucket, table: pa.Table, chunk: Chunk,
                derived_from: list[str] | None = None) -> Written:
    """Write the blocks of a chunk of one partition (``write_chunks``)."""
    [written] = write_chunks(spec, bucket, table, [chunk], derived_from)
    return written


def write_chunks(spec: GroupSpec, bucket: Bucket, table: pa.Table, chunks: list[Chunk],
                 derived_from: list[str] | None = None) -> list[Written]:
    """Write the blocks of one chunk of the partition ranges ``chunks`` (one range per partition, all read at one
    time): ``table`` holds their records, normalized, the partitions' runs one after another, each in offset order
    and inside its range. A topic with no record in ``table`` gets one block with no datasets recording its ranges.
    Returns one ``Written`` per range, in ``chunks``' order, each naming every block of its topic."""
    topics = dict.fromkeys(c.topic for c in chunks)
    out: dict[Chunk, Written] = {}
    for topic in topics:
        rows = table if len(topics) == 1 else table.filter(pc.equal(table.column("topic"), topic))
        ranges = [c for c in chunks if c.topic == topic]
        out.update(zip(ranges, _write_topic(spec, bucket, rows, ranges, derived_from), strict=True))
    return [out[c] for c in chunks]


def _block_key(spec: GroupSpec, chunks: list[Chunk]) -> str:
    if len(chunks) == 1:  # the ids of chunks of one partition, as before blocks of several
        c = chunks[0]
        key = f"{spec.group}/{spec.generation}/{c.topic}/{c.incarnation}/{c.partition}/{c.start}/{c.end}"
    else:
        key = f"{spec.group}/{spec.generation}/{chunks[0].topic}/" + ",".join(
            f"{c.incarnation}/{c.partition}/{c.start}/{c.end}" for c in chunks)
    if spec.shard:  # shard 0 keeps the ids of before shards; another shard's blocks never share an id with them
        key += f"/s{spec.shard}"
    return key


def _tally(table: pa.Table, chunks: list[Chunk], blocks: list[BlockMeta],
           quarantined: list[tuple[int, str]]) -> list[Written]:
    """One ``Written`` per range: its records, quarantined records, value bytes and reasons. Counted per
    partition in one pass over the rows (a mask per range was rows x partitions: 0.5 s of a 2,048-partition
    chunk's 2.5 s)."""
    lengths = pc.fill_null(pc.binary_length(table.column("value")), 0).to_numpy() if table.num_rows else None
    partitions = table.column("partition").to_numpy() if table.num_rows else None
    reasons: dict[int, list[str]] = defaultdict(list)
    for row, why in quarantined:
        reasons[int(partitions[row]) if len(chunks) > 1 and partitions is not None else chunks[0].partition].append(why)
    if len(chunks) == 1 or partitions is None or lengths is None:
        counts = {chunks[0].partition: table.num_rows}
        sizes = {chunks[0].partition: 0 if lengths is None else int(lengths.sum())}
    else:  # partitions are small non-negative numbers; sums of byte lengths in float64 are exact below 2**53
        by_count, by_size = np.bincount(partitions), np.bincount(partitions, weights=lengths)
        counts = {c.partition: int(by_count[c.partition]) for c in chunks if c.partition < len(by_count)}
        sizes = {c.partition: int(by_size[c.partition]) for c in chunks if c.partition < len(by_size)}
    out = []
    for c in chunks:
        records, size = counts.get(c.partition, 0), sizes.get(c.partition, 0)
        out.append(Written(topic=c.topic, partition=c.partition, incarnation=c.incarnation, start=c.start,
                           end=c.end, records=records, quarantined=len(reasons[c.partition]), bytes=size,
                           blocks=blocks, reasons=top_reasons(((r, 1) for r in reasons[c.partition]), top=5)))
    return out


def _write_topic(spec: GroupSpec, bucket: Bucket, table: pa.Table, chunks: list[Chunk],
                 derived_from: list[str] | None) -> list[Written]:
    """``write_chunks`` for the ranges of one topic."""
    topic = chunks[0].topic
    kafka = [KafkaRange(topic=topic, partition=c.partition, start=c.start, end=c.end, incarnation=c.incarnation)
             for c in chunks]
    key = _block_key(spec, chunks)
    by_partition = len(chunks) > 1
    clamp = (0, chunks[0].read_time_ms + MAX_FUTURE_MS)

    def spec_for(tenant: str, pv: dict[str, str], parser: Parser | None, what: str) -> BlockSpec:
        pv_key = ",".join(f"{k}={v}" for k, v in sorted(pv.items())) or what
        info = (ParserInfo(name=parser.name, version=parser.version, options_digest=parser.digest(),
                           reader_schema_id=parser.named_schema_id()) if parser is not None else None)
        return BlockSpec(id=deterministic_block_id(chunks[0].read_time_ms, f"{key}/{tenant}/{pv_key}"), tenant=tenant,
                         shard=spec.shard, group=spec.group, generation=spec.generation, kafka=kafka,
                         partition_values=pv,
                         parser=info, derived_from=sorted(derived_from or []))

    if table.num_rows == 0:
        return _tally(table, chunks, [write_block(bucket, spec_for(spec.tenants.default, {}, None, "empty"), [])], [])
    tenants, problems = _tenants(spec, table, topic)
    blocks: list[tuple[BlockSpec, list[DatasetInput]]] = []
    quarantine: dict[str, tuple[list[int], list[str]]] = defaultdict(lambda: ([], []))
    for i, problem in enumerate(problems):
        if problem is not None:
            quarantine[spec.tenants.default][0].append(i)
            quarantine[spec.tenants.default][1].append(problem)
    valid = [i for i, p in enumerate(problems) if p is None]
    parser_name = "-"
    if spec.group == "backup":
        whole = len(valid) == table.num_rows and len(set(tenants)) == 1
        for tenant, rows in ({tenants[0]: valid} if whole else _by([tenants[i] for i in valid])).items():
            picked = table if whole else _take(table, [valid[r] for r in rows])  # one tenant: no copy
            blocks.append((spec_for(tenant, {}, None, "records"),
                           [DatasetInput("records", topic, picked, "timestamp", labels=[{"topic": topic}],
                                         clamp=clamp, by_partition=by_partition)]))
    else:
        subset = _take(table, valid) if len(valid) < table.num_rows else table
        by_block: dict[tuple[str, str, int | None], list[DatasetInput]] = {}
        groups, unnamed = _record_groups(spec, subset, topic)
        if unnamed:  # only a parser names types: the quarantine rows name it even if no group parses
            parser_name = str(getattr(spec.parser_for(topic), "name", "-"))
        for row, reason in unnamed:
            quarantine[tenants[valid[row]]][0].append(valid[row])
            quarantine[tenants[valid[row]]][1].append(reason)
        parser: Parser | None = None
        for record, members in groups:
            part = subset if members is None else _take(subset, members)
            origin = valid if members is None else [valid[m] for m in members]  # the group's rows in ``table``
            parsed, good, rejected, parser = parse_records(spec.parser_for(topic), part, clamp[1],
                                                          spec.ingest.partition_by_hour)
            parser_name = parser.name if parser is not None else "-"
            schema_ids, fingerprint = parser.schema_info() if parser is not None else ([], "")
            for row, reason in rejected:
                quarantine[tenants[origin[row]]][0].append(origin[row])
                quarantine[tenants[origin[row]]][1].append(reason)
            if not parsed.num_rows:
                continue
            labels_of = parser.labels() if parser else []
            for (tenant, day, hour), in_block, sets in _row_groups(parsed, _row_tenants(tenants, origin, good),
                                                                   labels_of):
                pv = {"dt": day} if hour is None else {"dt": day, "hour": f"{hour:02d}"}
                labels = [{"topic": topic, **pv, **dict(s)} for s in sets]
                picked = parsed if in_block is None else parsed.take(in_block)  # one day and tenant: no copy
                by_block.setdefault((tenant, day, hour), []).append(
                    DatasetInput("records", topic, picked, "event_time", labels=labels, schema_ids=schema_ids,
                                 schema_fingerprint=fingerprint, record=record, by_partition=by_partition))
        for (tenant, day, hour), datasets in by_block.items():
            pv = {"dt": day} if hour is None else {"dt": day, "hour": f"{hour:02d}"}
            blocks.append((spec_for(tenant, pv, parser, "records"), datasets))
        if len(groups) > 1 or unnamed:  # several groups' rejects: the quarantine rows in offset order
            for tenant, (rows, reasons) in list(quarantine.items()):
                pairs = sorted(zip(rows, reasons, strict=True))
                quarantine[tenant] = ([r for r, _ in pairs], [why for _, why in pairs])
    for tenant, (rows, reasons) in quarantine.items():
        picked = _quarantine(_take(table, rows), reasons, parser_name)
        blocks.append((spec_for(tenant, {}, None, "quarantine"),
                       [DatasetInput("quarantine", topic, picked, "timestamp", labels=[{"topic": topic}],
                                     clamp=clamp, by_partition=by_partition)]))
    metas = [write_block(bucket, block_spec, datasets) for block_spec, datasets in blocks]
    return _tally(table, chunks, metas, [pair for rows, reasons in quarantine.values() for pair in zip(rows, reasons,
                                                                                                       strict=True)])
