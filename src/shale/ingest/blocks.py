"""Turning one Kafka partition's records of one micro-batch into blocks (runs in Spark tasks).

The offsets already committed are skipped first (Secor's trim: a replayed batch after a crash, or a Spark
checkpoint behind the metastore, finds its records committed). The batch's range is ``[committed end, last
offset + 1)``; ids are deterministic from (group, generation, topic, partition, range, tenant, partition
values) with the time of the batch's newest record, so replaying a batch rewrites the same keys.

* backup group: one block per tenant, the records verbatim;
* partition group: the topic's parser gives each record an event time (dt, hour) and columns; one block per
  (tenant, dt[, hour]); records the parser rejects go, with the reason, to one quarantine block per tenant.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from shale.block import BlockMeta, BlockSpec, DatasetInput, KafkaRange, ParserInfo, deterministic_block_id, write_block
from shale.block.schemas import KAFKA_FIELDS, PARTITION_BASE_FIELDS, QUARANTINE_SCHEMA, TIMESTAMP, TIMESTAMP_MS
from shale.config import BucketConfig, IngestConfig
from shale.ingest.parsers import ParseError, Parser, load_parser
from shale.ingest.records import header_value
from shale.ingest.tenants import TenantMapper
from shale.objstore import Bucket

GROUPS = ("backup", "partition")


@dataclass
class GroupSpec:
    """What a Spark task needs to write one group's blocks (pickled to the executors)."""

    group: str
    generation: int
    bucket: BucketConfig
    ingest: IngestConfig
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
            import re

            rule = next((r for r in self.ingest.parsers if re.fullmatch(r.topic_pattern, topic)), None)
            self._parsers[topic] = (load_parser(rule.parser, dict(rule.options)) if rule is not None
                                    else f"no parser is configured for topic {topic!r} (ingest.parsers)")
        return self._parsers[topic]


@dataclass
class PartitionResult:
    topic: str
    partition: int
    start: int
    end: int
    records: int
    quarantined: int
    bytes: int
    metas: list[BlockMeta]


def _date(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC)


def _quarantine(rows: pa.Table, reasons: list[str], parser: str) -> pa.Table:
    return rows.append_column("reason", pa.array(reasons, pa.string())).append_column(
        "parser", pa.array([parser] * rows.num_rows, pa.string())).cast(QUARANTINE_SCHEMA)


def _tenant_column(spec: GroupSpec, table: pa.Table, topic: str) -> tuple[list[str], list[str | None]]:
    """Each record's tenant, and a reason for records whose tenant header is invalid (quarantined)."""
    mapper = spec.tenants
    default = mapper.for_topic(topic)
    if not mapper.header:
        return [default] * table.num_rows, [None] * table.num_rows  # cheap: one shared element repeated
    tenants, problems = [], []
    for headers in table.column("headers").to_pylist():
        tenant, problem = mapper.for_header(header_value(headers, mapper.header))
        tenants.append(tenant or default)
        problems.append(problem)
    return tenants, problems


def _by(values: list[Any]) -> dict[Any, list[int]]:
    groups: dict[Any, list[int]] = defaultdict(list)
    for i, value in enumerate(values):
        groups[value].append(i)
    return groups


def _parse(spec: GroupSpec, table: pa.Table,
           topic: str) -> tuple[pa.Table, list[int], list[tuple[int, str]], Parser | None]:
    """Parsed rows (with event_time, dt, hour and the parser's columns), their source row indexes, and the
    (row, reason) of every rejected record."""
    parser = spec.parser_for(topic)
    if isinstance(parser, str):
        return pa.table({}), [], [(i, parser) for i in range(table.num_rows)], None
    values = table.column("value").to_pylist()
    stamps = table.column("timestamp").cast(TIMESTAMP_MS, safe=False).cast(pa.int64()).to_pylist()
    good: list[int] = []
    times: list[int] = []
    columns: dict[str, list[Any]] = {name: [] for name in parser.columns()}
    rejected: list[tuple[int, str]] = []
    for i, (value, stamp) in enumerate(zip(values, stamps, strict=True)):
        try:
            event_time, fields = parser.parse(value, stamp)
            _date(event_time)  # a time no calendar can hold is the parser's mistake, not the pipeline's
        except ParseError as exc:
            rejected.append((i, exc.reason))
            continue
        except (ValueError, OverflowError, OSError):
            rejected.append((i, f"event time {event_time} ms is outside the years 1 to 9999"))
            continue
        good.append(i)
        times.append(event_time)
        for name, values_of in columns.items():
            values_of.append(fields.get(name))
    base = table.take(good)
    days = [_date(t) for t in times]
    out = pa.table({
        **{f.name: base.column(f.name) for f in KAFKA_FIELDS},
        "event_time": pa.array(times, pa.int64()).cast(TIMESTAMP_MS).cast(TIMESTAMP),
        "dt": pa.array([d.strftime("%Y-%m-%d") for d in days], pa.string()),
        "hour": pa.array([d.hour if spec.ingest.partition_by_hour else None for d in days], pa.int8()),
        **{name: pa.array(vals, parser.columns()[name]) for name, vals in columns.items()},
    })
    return out.cast(pa.schema([*PARTITION_BASE_FIELDS, *(pa.field(n, t) for n, t in parser.columns().items())])), \
        good, rejected, parser


def write_partition(spec: GroupSpec, bucket: Bucket, table: pa.Table, committed_end: int | None,
                    derived_from: list[str] | None = None) -> PartitionResult | None:
    """Write the blocks of one topic-partition's records (normalized, in offset order). None if every record
    is committed already."""
    if committed_end is not None:
        table = table.filter(pc.greater_equal(table.column("offset"), committed_end))
    if table.num_rows == 0:
        return None
    topic = table.column("topic")[0].as_py()
    partition = int(table.column("partition")[0].as_py())
    first, last = int(table.column("offset")[0].as_py()), int(table.column("offset")[-1].as_py())
    gap = committed_end is not None and first > committed_end and not spec.ingest.allow_offset_gaps
    # A gap makes the commit fail loudly (offsets never read), unless the topic may legitimately skip offsets.
    start = first if committed_end is None or gap else committed_end
    end = last + 1
    time_ms = int(pc.max(table.column("timestamp").cast(TIMESTAMP_MS, safe=False).cast(pa.int64())).as_py())
    kafka = [KafkaRange(topic=topic, partition=partition, start=start, end=end)]
    tenants, problems = _tenant_column(spec, table, topic)
    key = f"{spec.group}/{spec.generation}/{topic}/{partition}/{start}/{end}"
    value_bytes = int(pc.sum(pc.binary_length(table.column("value"))).as_py() or 0)
    blocks: list[tuple[BlockSpec, list[DatasetInput]]] = []
    quarantine: dict[str, tuple[list[int], list[str]]] = defaultdict(lambda: ([], []))
    parser_name = "-"

    def spec_for(tenant: str, pv: dict[str, str], parser: Parser | None, what: str) -> BlockSpec:
        pv_key = ",".join(f"{k}={v}" for k, v in sorted(pv.items())) or what
        info = (ParserInfo(name=parser.name, version=parser.version, options_digest=parser.digest())
                if parser is not None else None)
        return BlockSpec(id=deterministic_block_id(time_ms, f"{key}/{tenant}/{pv_key}"), tenant=tenant,
                         group=spec.group, generation=spec.generation, kafka=kafka, partition_values=pv, parser=info,
                         derived_from=sorted(derived_from or []))

    for i, problem in enumerate(problems):
        if problem is not None:
            quarantine[spec.tenants.default][0].append(i)
            quarantine[spec.tenants.default][1].append(problem)
    valid = [i for i, p in enumerate(problems) if p is None]
    if spec.group == "backup" and not spec.tenants.header:
        # Every record belongs to the topic's tenant: the whole table is the block, no copy.
        blocks.append((spec_for(tenants[0], {}, None, "records"),
                       [DatasetInput("records", topic, table, "timestamp", labels=[{"topic": topic}])]))
    elif spec.group == "backup":
        for tenant, rows in _by([tenants[i] for i in valid]).items():
            picked = table.take([valid[r] for r in rows])
            blocks.append((spec_for(tenant, {}, None, "records"),
                           [DatasetInput("records", topic, picked, "timestamp", labels=[{"topic": topic}])]))
    else:
        subset = table.take(valid)
        parsed, good, rejected, parser = _parse(spec, subset, topic)
        parser_name = parser.name if parser is not None else "-"
        for row, reason in rejected:
            quarantine[tenants[valid[row]]][0].append(valid[row])
            quarantine[tenants[valid[row]]][1].append(reason)
        if parsed.num_rows:
            hours = parsed.column("hour").to_pylist()
            days = parsed.column("dt").to_pylist()
            keys = [(tenants[valid[g]], d, h) for g, d, h in zip(good, days, hours, strict=True)]
            label_cols = {n: parsed.column(n).to_pylist() for n in (parser.labels() if parser else [])}
            for (tenant, day, hour), rows in _by(keys).items():
                pv = {"dt": day} if hour is None else {"dt": day, "hour": f"{hour:02d}"}
                sets = sorted({tuple((n, label_cols[n][r] or "") for n in label_cols) for r in rows})
                labels = [{"topic": topic, **pv, **dict(s)} for s in sets]
                blocks.append((spec_for(tenant, pv, parser, "records"),
                               [DatasetInput("records", topic, parsed.take(rows), "event_time", labels=labels)]))
    for tenant, (rows, reasons) in quarantine.items():
        picked = _quarantine(table.take(rows), reasons, parser_name)
        blocks.append((spec_for(tenant, {}, None, "quarantine"),
                       [DatasetInput("quarantine", topic, picked, "timestamp", labels=[{"topic": topic}])]))
    metas = [write_block(bucket, block_spec, datasets) for block_spec, datasets in blocks]
    quarantined = sum(len(rows) for rows, _ in quarantine.values())
    return PartitionResult(topic, partition, start, end, table.num_rows, quarantined, value_bytes, metas)
