"""A change table's latest rows (``shale query --latest``, ``shale.read(latest=True)``, the Spark source's
``latest`` option): the whole stored history of the selected topics, parsed rows and quarantined records (a
tombstone is quarantined: it has no value to parse), each row with its incarnation, handed to
``shale.changes.latest_view``; label matchers on columns then pick among the latest rows (applied to the history,
they would pick versions: an older version of a row that no longer matches would come back).

Each topic's mode and key come from its ``ingest.parsers`` rule (``table``, ``key``); a topic whose rule is
``append`` (the default) has no latest rows, and the query says so."""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from shale.block import RECORD_LABEL, IncarnationCodes, read_dataset, row_incarnations
from shale.changes import (
    INCARNATION,
    TableRule,
    Versions,
    ViewStats,
    latest_view,
    latest_view_after,
    latest_view_and_versions,
)
from shale.config import ParserRule, ShaleConfig
from shale.objstore import BucketReader
from shale.query.plan import BlockSource, Kind, Part, QueryPlan, _label_expression
from shale.query.reader import Query, _conform

EVER = (0, 2**62)
KINDS: tuple[Kind, ...] = ("records", "quarantine")
SELECTING = ("topic", RECORD_LABEL)
"""Matchers that choose which topics' histories are read; any other names a column of the latest rows."""


def table_rule(parsers: Sequence[ParserRule], topic: str) -> TableRule:
    """The change-table rule of ``topic``: its first ``ingest.parsers`` rule's; a ValueError for an append table."""
    rule = next((r for r in parsers if re.fullmatch(r.topic_pattern, topic)), None)
    if rule is None or rule.table == "append":
        raise ValueError(f"topic {topic!r} is an append table: it has no latest rows. Set table = \"upsert\" or "
                         "\"debezium\" on its ingest.parsers rule (docs/design/change-tables.md), or select other "
                         "topics")
    return TableRule(rule.table, rule.key)


def history_query(query: Query, kind: Kind = "records") -> Query:
    """The query of the history of the topics ``query`` selects: every time, only the topic and record matchers
    (its plan's schema is the latest rows' schema)."""
    selector = "{" + ", ".join(str(m) for m in query.matchers if m.name in SELECTING) + "}"
    return Query(query.tenant, *EVER, selector, kind=kind, default_generation=query.default_generation)


VIEW_COLUMNS = {"topic", "key", "partition", "offset", "timestamp", "value", "reason", "op", "source"}
"""The history's columns the view itself reads (``shale.changes.columns``), whatever the query asks for."""


def needed_columns(query: Query, parsers: Sequence[ParserRule]) -> set[str] | None:
    """The history's columns a latest read needs: the view's, the query's columns and matchers, and the change
    tables' key columns; None (every column) when the query names no columns."""
    if not query.columns:
        return None
    keys = {name for r in parsers if r.table == "upsert" and r.key
            for name in (r.key.replace(".", "_"), r.key.split(".")[0])}
    return VIEW_COLUMNS | set(query.columns) | {m.name for m in query.matchers} | keys


@dataclass
class _Read:
    """A latest read's history, kept for the next read of the same tables in this process: its versions
    (``shale.changes.Versions``, each row with its incarnation's code in ``codes``), the blocks it read (kind and
    id), their level-0 sources with their generations, the erasures their records were written without, and the
    schemas it read them in."""

    codes: IncarnationCodes
    blocks: set[tuple[Kind, str]]
    sources: set[tuple[int, str]]
    erasures: set[str]
    schemas: dict[Kind, pa.Schema]
    versions: Versions


class LatestReads:
    """The versions of the change tables a process read last (at most ``size`` reads), so that its next latest
    read of the same tables (one tenant, selector and columns, one store) reads only the blocks stored since:
    a block whose level-0 sources were all read is a compaction of records read, and is not read again. The
    history is read again in full when what was read may have changed: an erasure the versions do not know
    of, records gone without a block holding them (retention, a repair), a generation switch or a schema change
    (docs/design/change-tables.md 20.3)."""

    def __init__(self, size: int = 4) -> None:
        self.size = size
        self._reads: OrderedDict[Hashable, _Read] = OrderedDict()

    def get(self, key: Hashable) -> _Read | None:
        read = self._reads.get(key)
        if read is not None:
            self._reads.move_to_end(key)
        return read

    def clear(self) -> None:
        self._reads.clear()

    def put(self, key: Hashable, read: _Read) -> None:
        self._reads[key] = read
        self._reads.move_to_end(key)
        while len(self._reads) > self.size:
            self._reads.popitem(last=False)


PROCESS_READS = LatestReads()
"""The reads of this process: ``shale.read(latest=True)``'s, and the Spark source's in the Python process Spark
plans a read in (a new one, as Spark may start for any read, reads the whole history)."""


def store_name(config: ShaleConfig) -> str:
    """The bucket ``config`` names, as ``LatestReads`` tells stores apart (no secret in it)."""
    return f"{config.bucket.endpoint} {config.bucket.url}"


def _held(plans: dict[Kind, QueryPlan]) -> tuple[set[tuple[Kind, str]], set[tuple[int, str]], set[str]]:
    """What the planned parts hold: their blocks (kind and id), level-0 sources with generations, and erasures."""
    parts = [(kind, p) for kind, plan in plans.items() for p in plan.parts]
    return ({(kind, p.block.id) for kind, p in parts},
            {(p.block.generation, s) for _, p in parts for s in p.block.compaction.sources},
            {e for _, p in parts for e in p.block.erased or ()})


def _new_parts(plans: dict[Kind, QueryPlan], schemas: dict[Kind, pa.Schema], sources: set[tuple[int, str]],
               erasures: set[str], earlier: _Read | None) -> dict[Kind, list[Part]] | None:
    """The parts not read by ``earlier`` (``sources`` and ``erasures``: what the plans hold); None when the whole
    history must be read again."""
    parts = [(kind, p) for kind, plan in plans.items() for p in plan.parts]
    if earlier is None or earlier.schemas != schemas or any(p.intervals is not None for _, p in parts):
        return None
    if not earlier.sources <= sources:  # records read are gone: retention, a repair, a generation switched
        return None
    if not erasures <= earlier.erasures:  # an erasure since
        return None
    new: dict[Kind, list[Part]] = {kind: [] for kind in plans}
    for kind, p in parts:
        if (kind, p.block.id) not in earlier.blocks and not {
                (p.block.generation, s) for s in p.block.compaction.sources} <= earlier.sources:
            new[kind].append(p)
    return new


def _history(query: Query, plan: QueryPlan, parts: list[Part], schema: pa.Schema, bucket: BucketReader,
             codes: IncarnationCodes) -> pa.Table:
    """The rows of ``parts`` of ``plan`` in ``schema`` (the plan's, or its needed columns), each with its
    incarnation's code."""
    tables = []
    for part in parts:
        wanted = [c for c in [*plan.base_columns, *part.dataset.columns] if c in schema.names]
        table = read_dataset(bucket, part.block, part.dataset, columns=wanted, whole_object=None)
        incarnations = row_incarnations(part.block, part.dataset.topic, table.column("partition"),
                                        table.column("offset"), codes)
        tables.append(_conform(table, schema, part).append_column(INCARNATION, pa.array(incarnations)))
        query.stats.objects += 1
    return pa.concat_tables(tables) if tables else schema.append(pa.field(INCARNATION, pa.int64())).empty_table()


def read_latest(query: Query, source: BlockSource, bucket: BucketReader, parsers: Sequence[ParserRule],
                as_of: int | None = None, reads: LatestReads | None = None,
                store: str = "") -> tuple[pa.Table, ViewStats]:
    """The latest row per key of the topics ``query`` selects, as they stood at ``as_of`` (epoch milliseconds of
    the Kafka record time; None: now), in the columns ``query.columns`` names (all by default), at most
    ``query.limit`` rows. ``query``'s window is not used: a latest row may have been written at any time.
    ``reads`` (with ``store``, the bucket's name) keeps the versions read for the next read of the same tables,
    which then reads only what was stored since (not with ``as_of``); the stats count the records read."""
    if query.kind != "records" or query.group != "partition":
        raise ValueError("latest rows are read from the partition group's records (not --quarantine or the backup "
                         "group)")
    needed = needed_columns(query, parsers)
    plans: dict[Kind, QueryPlan] = {}
    for kind in KINDS:
        q = history_query(query, kind)
        plans[kind] = q.plan(source)
        query.stats.blocks += q.stats.blocks
    schemas = {kind: plan.schema if needed is None else pa.schema([f for f in plan.schema if f.name in needed])
               for kind, plan in plans.items()}
    key = (store, query.tenant, tuple(sorted(str(m) for m in query.matchers if m.name in SELECTING)),
           None if needed is None else tuple(sorted(needed)),
           tuple((r.topic_pattern, r.table, r.key) for r in parsers))
    earlier = reads.get(key) if reads is not None and as_of is None else None
    blocks, sources, erasures = _held(plans)
    new = _new_parts(plans, schemas, sources, erasures, earlier)
    codes = earlier.codes if earlier is not None and new is not None else IncarnationCodes()
    read = {kind: _history(query, plans[kind], plans[kind].parts if new is None else new[kind], schemas[kind],
                           bucket, codes) for kind in KINDS}
    rows, quarantined = read["records"], read["quarantine"]
    rules: dict[str, TableRule] = {}
    tables = [rows, quarantined, *([earlier.versions.rows, earlier.versions.quarantined] if earlier else [])]
    for topic in {t for table in tables for t in pc.unique(table.column("topic")).to_pylist()}:
        rules[topic] = table_rule(parsers, topic)
    if reads is None or as_of is not None:
        view, stats = latest_view(rows, quarantined, rules.__getitem__, as_of)
    else:
        if earlier is not None and new is not None:  # the earlier view, its keys the new records name recomputed
            view, stats, versions = latest_view_after(earlier.versions, rows, quarantined, rules.__getitem__)
        else:
            view, stats, versions = latest_view_and_versions(rows, quarantined, rules.__getitem__)
        reads.put(key, _Read(codes, blocks, sources, erasures, schemas, versions))
    for matcher in query.matchers:
        if matcher.name in SELECTING:
            continue
        if matcher.name in view.column_names:
            view = view.filter(_label_expression(matcher, view.column(matcher.name)))
        elif not matcher.matches({}):  # a missing label is "", as the index reads it
            view = view.slice(0, 0)
    if query.columns:
        unknown = [c for c in query.columns if c not in view.column_names]
        if unknown:
            raise ValueError(f"unknown columns {unknown}; the latest rows' columns are {view.column_names}")
        view = view.select(list(query.columns))
    if query.limit is not None:
        view = view.slice(0, query.limit)
    query.stats.rows = view.num_rows
    return view, stats

