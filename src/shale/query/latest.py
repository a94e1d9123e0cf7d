"""A change table's latest rows (``shale query --latest``, ``shale.read(latest=True)``, the Spark source's
``latest`` option): the whole stored history of the selected topics, parsed rows and quarantined records (a
tombstone is quarantined: it has no value to parse), each row with its incarnation, handed to
``shale.changes.latest_view``; label matchers on columns then pick among the latest rows (applied to the history,
they would pick versions: an older version of a row that no longer matches would come back).

Each topic's mode and key come from its ``ingest.parsers`` rule (``table``, ``key``); a topic whose rule is
``append`` (the default) has no latest rows, and the query says so."""

from __future__ import annotations

import re
from collections.abc import Sequence

import pyarrow as pa

from shale.block import RECORD_LABEL, IncarnationCodes, read_dataset, row_incarnations
from shale.changes import INCARNATION, TableRule, ViewStats, latest_view
from shale.config import ParserRule
from shale.objstore import BucketReader
from shale.query.plan import BlockSource, Kind, _label_expression
from shale.query.reader import Query, _conform

EVER = (0, 2**62)
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


def _history(query: Query, kind: Kind, source: BlockSource, bucket: BucketReader, codes: IncarnationCodes,
             needed: set[str] | None = None) -> pa.Table:
    """Every stored row of ``kind`` of the selected topics, at any time, with its incarnation's code; only the
    ``needed`` columns (None: all) are read and kept."""
    q = history_query(query, kind)
    plan = q.plan(source)
    schema = plan.schema if needed is None else pa.schema([f for f in plan.schema if f.name in needed])
    tables = []
    for part in plan.parts:
        wanted = None if needed is None else [c for c in [*plan.base_columns, *part.dataset.columns] if c in needed]
        table = read_dataset(bucket, part.block, part.dataset, columns=wanted, whole_object=None)
        incarnations = row_incarnations(part.block, part.dataset.topic, table.column("partition"),
                                        table.column("offset"), codes)
        tables.append(_conform(table, schema, part).append_column(INCARNATION, pa.array(incarnations)))
        query.stats.objects += 1
    query.stats.blocks += q.stats.blocks
    schema = schema.append(pa.field(INCARNATION, pa.int64()))
    return pa.concat_tables(tables) if tables else schema.empty_table()


def read_latest(query: Query, source: BlockSource, bucket: BucketReader, parsers: Sequence[ParserRule],
                as_of: int | None = None) -> tuple[pa.Table, ViewStats]:
    """The latest row per key of the topics ``query`` selects, as they stood at ``as_of`` (epoch milliseconds of
    the Kafka record time; None: now), in the columns ``query.columns`` names (all by default), at most
    ``query.limit`` rows. ``query``'s window is not used: a latest row may have been written at any time."""
    if query.kind != "records" or query.group != "partition":
        raise ValueError("latest rows are read from the partition group's records (not --quarantine or the backup "
                         "group)")
    codes = IncarnationCodes()
    needed = needed_columns(query, parsers)
    rows = _history(query, "records", source, bucket, codes, needed)
    quarantined = _history(query, "quarantine", source, bucket, codes, needed)
    rules: dict[str, TableRule] = {}
    for topic in {*rows.column("topic").to_pylist(), *quarantined.column("topic").to_pylist()}:
        rules[topic] = table_rule(parsers, topic)
    view, stats = latest_view(rows, quarantined, rules.__getitem__, as_of)
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

