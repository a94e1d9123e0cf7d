"""Planning a query: which blocks and datasets to read, with which row filter, and where duplicates can occur.

Blocks come from a ``BlockSource`` (the metastore, or a tenant's bucket index), already pruned by tenant, data
time and dataset labels, and never HealthyOverlapped or marked for deletion. The row filter keeps the time range
and the label matchers that name columns (for example a parser's ``level``); Parquet row-group statistics
prune with it too.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from shale.block import (
    BACKUP_SCHEMA,
    QUARANTINE_SCHEMA,
    RECORD_LABEL,
    TIMESTAMP,
    BlockMeta,
    Dataset,
    RecordScope,
    decode_column_types,
    partition_schema,
    shared_scopes,
)
from shale.index import Matcher
from shale.metastore import BlockQueries, GenerationRules
from shale.schemas import read_type

Kind = Literal["records", "quarantine"]


class UnknownColumnsError(ValueError):
    """Columns asked for that no selected record has (in the query's window)."""

    def __init__(self, unknown: list[str], names: list[str]) -> None:
        super().__init__(f"unknown columns {unknown}; this query's columns are {names}")
        self.unknown = unknown


class BlockSource(BlockQueries, GenerationRules, Protocol):
    """Where a query finds its blocks: the metastore, a read-only view of its state, or a bucket index. Every
    source answers both questions, so every source returns the same rows."""


@dataclass(frozen=True)
class Part:
    """One dataset of one block to read, and the data-time intervals in which its generation is the active one
    (None: the whole query range)."""

    block: BlockMeta
    dataset: Dataset
    intervals: tuple[tuple[int, int], ...] | None = None


def active_intervals(rules: list[tuple[str, int, int, int]], topic: str, generation: int, default: int,
                     start: int, end: int) -> list[tuple[int, int]]:
    """Where in ``[start, end]`` ``generation`` is the active one for ``topic``: the latest switch covering a
    time wins; times no switch covers belong to ``default``."""
    mine = [(s, e, g) for t, s, e, g in rules if t == topic and e >= start and s <= end]
    cuts = sorted({start, end + 1, *(max(start, s) for s, _, _ in mine), *(min(end, e) + 1 for _, e, _ in mine)})
    out: list[tuple[int, int]] = []
    for low, high in itertools.pairwise(cuts):
        active = default
        for s, e, g in mine:  # oldest first: later switches override
            if s <= low and high - 1 <= e:
                active = g
        if active == generation:
            if out and out[-1][1] == low - 1:
                out[-1] = (out[-1][0], high - 1)
            else:
                out.append((low, high - 1))
    return out


@dataclass
class QueryPlan:
    parts: list[Part]
    schema: pa.Schema
    time_column: str
    dedup_partitions: set[RecordScope]
    """(topic, partition, incarnation) where two selected blocks may hold the same record (only there are rows
    deduplicated; the first read is kept)."""
    base_columns: list[str]
    """The columns every dataset of this query has (its kind's base schema)."""

    @property
    def objects(self) -> int:
        return len(self.parts)


def output_schema(group: str, kind: Kind, parts: list[Part]) -> pa.Schema:
    if kind == "quarantine":
        return QUARANTINE_SCHEMA
    if group == "backup":
        return BACKUP_SCHEMA
    # A typed parser's columns keep their types; where blocks disagree (a schema evolved), the newest block's type
    # wins (parts are in time order), and older rows are cast to it when read. An empty record is read as the
    # writer's value, stored with a marker field (``shale.schemas.empty``): the cast drops the marker.
    types: dict[str, pa.DataType] = {}
    for part in parts:
        types.update({c: read_type(t) for c, t in decode_column_types(part.dataset.column_types).items()})
    return partition_schema(sorted({c for p in parts for c in p.dataset.columns}), types)


def plan_query(blocks: list[BlockMeta], group: str, kind: Kind, columns: Sequence[str] | None = None, *,
               rules: list[tuple[str, int, int, int]] | None = None, default_generation: int = 1,
               start: int = 0, end: int = 2**62, matchers: Sequence[Matcher] = ()) -> QueryPlan:
    """Parts to read. In the partition group only the active generation of each topic is read (section 14); the
    metastore records a switch when ingestion starts a topic or a newer generation has caught up (DESIGN 10.5), so
    ``default_generation`` decides only times no switch covers (data committed before switches were recorded). The
    backup group stores one verbatim record in every generation: copies across generations are dropped
    (``shale.block.records``).

    A block may hold several record types of a topic (``Dataset.record``): the ``record`` matchers pick the
    datasets of the types they match (the index matched the block by any of them), and records of several types
    in one query are refused, naming the types: their columns are unrelated (DESIGN 10.8)."""
    by_record = [m for m in matchers if m.name == RECORD_LABEL]
    parts = []
    for b in sorted(blocks, key=lambda m: (m.min_time, m.id)):
        for d in b.datasets:
            if d.kind != kind or b.group != group:
                continue
            if by_record and not all(m.matches({RECORD_LABEL: d.record or ""}) for m in by_record):
                continue
            if group == "partition":
                spans = active_intervals(rules or [], d.topic, b.generation, default_generation, start, end)
                if not spans:
                    continue
                parts.append(Part(b, d, tuple(spans) if spans != [(start, end)] else None))
            else:
                parts.append(Part(b, d))
    if kind == "records":
        _one_record_type(parts)
    blocks = [b for b in blocks if any(p.block is b for p in parts)]
    dedup = shared_scopes(blocks)
    schema = output_schema(group, kind, parts)
    base = [f.name for f in output_schema(group, kind, [])]
    if columns:
        unknown = [c for c in columns if c not in schema.names]
        if unknown:
            raise UnknownColumnsError(unknown, schema.names)
        schema = pa.schema([schema.field(c) for c in columns])
    time_column = "event_time" if group == "partition" and kind == "records" else "timestamp"
    return QueryPlan(parts, schema, time_column, dedup, base)


def _one_record_type(parts: list[Part]) -> None:
    """Refuse a query whose records are of several record types (a topic written under a record name strategy):
    one type's columns mean nothing to another's, so they are never mixed into one table."""
    types = {p.dataset.record for p in parts}
    if len(types) > 1 and types != {None}:
        named = sorted(t for t in types if t is not None)
        topics = sorted({p.dataset.topic for p in parts if p.dataset.record is not None})
        plain = " and records of no record type (blocks written under subject_name_strategy 'topic')" \
            if None in types else ""
        raise ValueError(f"topic(s) {', '.join(topics)} hold records of several record types: {', '.join(named)}"
                         f"{plain}; their columns are unrelated, so a query reads one: add a record matcher, e.g. "
                         f'{{record="{named[0]}"}} (Iceberg: one table per type)')


def _label_expression(matcher: Matcher, field: Any) -> Any:
    value = pc.coalesce(field, pa.scalar(""))  # Prometheus semantics: a missing label is ""
    if matcher.op == "=":
        return pc.equal(value, matcher.value)
    if matcher.op == "!=":
        return pc.not_equal(value, matcher.value)
    anchored = f"^(?s:{matcher.value})$"  # as the index matches (Prometheus 3: "." matches a newline)
    hit = pc.match_substring_regex(value, anchored)
    return hit if matcher.op == "=~" else pc.invert(hit)


_LAST_MS = (2**63 - 1) // 1000


def _instant(ms: int) -> Any:
    """A time bound in milliseconds as a column-typed (microsecond) scalar; "no bound" (2**62 ms) clamps to the
    last representable microsecond instead of overflowing."""
    return pa.scalar(max(-_LAST_MS, min(ms, _LAST_MS)) * 1000, TIMESTAMP)


def row_filter(plan: QueryPlan, part: Part, start: int, end: int, matchers: Sequence[Matcher]) -> Any:
    """A pyarrow expression for one part: the time range (or its generation's intervals in it) and every matcher
    on one of its columns."""
    # Bounds are whole milliseconds, inclusive; stored times have microseconds, so a bound ``high`` takes every
    # microsecond of its millisecond (below ``high + 1``): adjacent intervals leave no gap between them.
    time = pc.field(plan.time_column)
    expression = (time >= _instant(start)) & (time < _instant(end + 1))
    if part.intervals is not None:
        spans = [(time >= _instant(low)) & (time < _instant(high + 1)) for low, high in part.intervals]
        either = spans[0]
        for span in spans[1:]:
            either = either | span
        expression = expression & either
    available = set(part.dataset.columns) | {"topic", "dt"}
    for matcher in matchers:
        if matcher.name == RECORD_LABEL and part.dataset.record is not None:
            continue  # the dataset's record type, matched by plan_query (not a column named 'record')
        if matcher.name in available:
            expression = expression & _label_expression(matcher, pc.field(matcher.name))
    return expression


def check_regex(matchers: Sequence[Matcher]) -> None:
    """pyarrow evaluates regexes with RE2; refuse what RE2 cannot run, naming the matcher."""
    for matcher in matchers:
        if matcher.op in ("=~", "!~"):
            try:
                pc.match_substring_regex(pa.array([""]), f"^(?s:{matcher.value})$")
            except pa.ArrowInvalid as exc:
                raise ValueError(f"{matcher}: RE2 cannot run this regular expression ({exc})") from None
            re.compile(matcher.value)
