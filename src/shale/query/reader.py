"""Running a query: a stream of Arrow record batches, never the whole result in memory.

Datasets are read one at a time with column projection and the row filter (ranged reads: only the footer and
the needed column chunks are fetched, Parquet page checksums checked). Rows whose record (topic incarnation,
topic, partition, offset: ``shale.block.records``) was already returned are dropped, only where two selected
blocks could share records; elsewhere no state is kept at all.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import pyarrow as pa

from shale.block import IncarnationCodes, check_tenant, read_dataset, row_incarnations
from shale.errors import IncompatibleColumnError
from shale.index import Matcher, parse_matchers
from shale.objstore import BucketReader, CallCounter
from shale.query.plan import BlockSource, Kind, Part, QueryPlan, check_regex, plan_query, row_filter


@dataclass
class QueryStats:
    blocks: int = 0
    objects: int = 0
    bytes_read: int = 0
    requests: int = 0
    rows: int = 0
    duplicates_dropped: int = 0
    seconds: float = 0.0


@dataclass
class Query:
    tenant: str
    start: int
    end: int
    selector: str = ""
    group: str = "partition"
    kind: Kind = "records"
    columns: Sequence[str] | None = None
    limit: int | None = None
    default_generation: int = 1
    stats: QueryStats = field(default_factory=QueryStats)

    def __post_init__(self) -> None:
        check_tenant(self.tenant)
        if self.end < self.start:
            raise ValueError(f"the query ends ({self.end}) before it starts ({self.start})")
        if self.group not in ("backup", "partition"):
            raise ValueError(f"group {self.group!r} is not backup or partition")
        self.matchers: list[Matcher] = parse_matchers(self.selector)
        check_regex(self.matchers)

    def plan(self, source: BlockSource) -> QueryPlan:
        blocks = source.query_blocks([self.tenant], self.start, self.end, self.selector, group=self.group)
        rules = source.generation_rules(self.tenant) if self.group == "partition" else []
        plan = plan_query(blocks, self.group, self.kind, self.columns, rules=rules,
                          default_generation=self.default_generation, start=self.start, end=self.end,
                          matchers=self.matchers)
        self.stats.blocks = len({p.block.id for p in plan.parts})
        return plan


def _conform(table: pa.Table, schema: pa.Schema, part: Part) -> pa.Table:
    """The dataset's rows in the query's schema: missing parser columns become nulls, order fixed. A column whose
    type changed incompatibly (the newest blocks' type cannot hold this block's values) fails the query with an
    error naming the column, both types and the block: never a silently wrong value (DESIGN 10.8)."""
    columns = []
    for f in schema:
        if f.name in table.column_names:
            column = table.column(f.name)
            try:
                columns.append(column.cast(f.type))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
                raise IncompatibleColumnError(
                    f"column {f.name!r} of block {part.block.id} holds {column.type}, which cannot be read as "
                    f"{f.type}, its type in the newest blocks of the query ({exc}): the topic's schema changed "
                    "incompatibly. Query each side of the change on its own (--start/--end), or read the older "
                    "blocks again as the new schema with `shale reprocess --schema-id` (records that do not fit "
                    "are quarantined with the reason)") from None
        else:
            columns.append(pa.nulls(table.num_rows, f.type))
    return pa.table(columns, schema=schema)


@runtime_checkable
class Counted(Protocol):
    """A bucket that counts its requests (``shale.objstore.ObstoreBucket`` does): queries report what they cost."""

    @property
    def calls(self) -> CallCounter: ...


def execute(query: Query, plan: QueryPlan, bucket: BucketReader) -> Iterator[pa.RecordBatch]:
    started = time.perf_counter()
    counter = bucket.calls if isinstance(bucket, Counted) else None
    bytes_before = counter.bytes_read if counter is not None else 0
    requests_before = counter.total() if counter is not None else 0
    seen: dict[tuple[str, int, int], set[int]] = defaultdict(set)
    needed = set(plan.schema.names)
    dedup_cols = {"topic", "partition", "offset"} if plan.dedup_partitions else set()
    try:
        yield from _parts(query, plan, bucket, seen, needed | dedup_cols, counter, bytes_before, requests_before)
    finally:
        query.stats.seconds = time.perf_counter() - started


def _parts(query: Query, plan: QueryPlan, bucket: BucketReader, seen: dict[tuple[str, int, int], set[int]],
           wanted: set[str], counter: CallCounter | None, bytes_before: int,
           requests_before: int) -> Iterator[pa.RecordBatch]:
    codes = IncarnationCodes()
    for part in plan.parts:
        if query.limit is not None and query.stats.rows >= query.limit:
            break
        expression = row_filter(plan, part, query.start, query.end, query.matchers)
        present = set(plan.base_columns) | set(part.dataset.columns)
        read_cols = [c for c in sorted(present) if c in wanted]
        table = read_dataset(bucket, part.block, part.dataset, filters=expression, whole_object=None,
                             columns=read_cols)
        query.stats.objects += 1
        if counter is not None:
            query.stats.bytes_read = counter.bytes_read - bytes_before
            query.stats.requests = counter.total() - requests_before
        if plan.dedup_partitions and table.num_rows:
            table = _drop_copies(query, plan, part, table, seen, codes)
        table = _conform(table, plan.schema, part)
        if query.limit is not None:
            table = table.slice(0, max(0, query.limit - query.stats.rows))
        query.stats.rows += table.num_rows
        yield from table.to_batches()


def _drop_copies(query: Query, plan: QueryPlan, part: Part, table: pa.Table,
                 seen: dict[tuple[str, int, int], set[int]], codes: IncarnationCodes) -> pa.Table:
    """``table`` without the rows whose record was returned already (only records of scopes two blocks share)."""
    scopes = {(t, p, codes.code(i)) for t, p, i in plan.dedup_partitions}
    incarnations = row_incarnations(part.block, part.dataset.topic, table.column("partition"),
                                    table.column("offset"), codes)
    keep = []
    keys = zip(table.column("topic").to_pylist(), table.column("partition").to_pylist(),
               table.column("offset").to_pylist(), incarnations.tolist(), strict=True)
    for topic, partition, offset, incarnation in keys:
        scope = (topic, partition, incarnation)
        if scope not in scopes:
            keep.append(True)
            continue
        offsets = seen[scope]
        keep.append(offset not in offsets)
        offsets.add(offset)
    dropped = keep.count(False)
    if not dropped:
        return table
    query.stats.duplicates_dropped += dropped
    return table.filter(pa.array(keep))


def run_query(query: Query, source: BlockSource, bucket: BucketReader) -> pa.RecordBatchReader:
    """The query's rows as a stream (the Python API). ``query.stats`` fills in as the stream is read."""
    plan = query.plan(source)
    return pa.RecordBatchReader.from_batches(plan.schema, execute(query, plan, bucket))

