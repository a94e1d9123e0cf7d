"""Why a query returned what it did, for people (``shale query``): a second, wider look at the block source (every
time, or every label), taken only to explain an answer. Pure over a ``BlockSource``; never changes a result.

* ``unmatched``: a label matcher (``topic``, ``record``, a parser label) that no block of the tenant matches at any
  time, named with the values that exist, so a misspelled topic is an error and not "0 rows".
* ``outside_window``: matching records exist outside ``--from``/``--to``, with the range they span.
* ``column_outside_window``: a column that exists in the selected records, but in none inside the window.
"""

from __future__ import annotations

import datetime as dt

from shale.block import RECORD_LABEL, BlockMeta
from shale.query.plan import BlockSource, plan_query
from shale.query.reader import Query

EVER = (0, 2**62)
SHOWN_VALUES = 20


def _iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _label_sets(blocks: list[BlockMeta], query: Query) -> list[dict[str, str]]:
    return [{"topic": d.topic, RECORD_LABEL: d.record or "", **labels}
            for b in blocks for d in b.datasets if d.kind == query.kind
            for labels in (d.labels or [{}])]


def unmatched(source: BlockSource, query: Query) -> str | None:
    """The first ``=`` or ``=~`` matcher that matches no dataset of the tenant's group at any time, with the values
    its label has (at most twenty); None when every matcher matches something."""
    sets = _label_sets(source.query_blocks([query.tenant], *EVER, "", group=query.group), query)
    for matcher in query.matchers:
        if matcher.op not in ("=", "=~") or any(matcher.matches(labels) for labels in sets):
            continue
        values = sorted({labels[matcher.name] for labels in sets if labels.get(matcher.name)})
        listed = ", ".join(values[:SHOWN_VALUES]) + (f" and {len(values) - SHOWN_VALUES} more"
                                                      if len(values) > SHOWN_VALUES else "")
        what = "record type" if matcher.name == RECORD_LABEL else matcher.name
        return (f"no {query.group} group record of tenant {query.tenant} has {matcher} at any time; its "
                f"{what} values: {listed or 'none'}")
    return None


def _active_span(source: BlockSource, query: Query) -> tuple[int, int, int, int] | None:
    """(first, last) data time of the selected records at any time, of the active generation, and the rows of
    datasets reaching outside the window (an upper bound: a dataset is counted whole); None when nothing."""
    blocks = source.query_blocks([query.tenant], *EVER, query.selector, group=query.group)
    rules = source.generation_rules(query.tenant) if query.group == "partition" else []
    try:
        plan = plan_query(blocks, query.group, query.kind, rules=rules, default_generation=query.default_generation,
                          start=EVER[0], end=EVER[1], matchers=query.matchers)
    except ValueError:
        return None  # several record types: the query itself says so
    if not plan.parts:
        return None
    first = min(p.dataset.min_time for p in plan.parts)
    last = max(p.dataset.max_time for p in plan.parts)
    outside = [p.dataset.rows for p in plan.parts
               if p.dataset.min_time < query.start or p.dataset.max_time > query.end]
    return first, last, len(outside), sum(outside)


def outside_window(source: BlockSource, query: Query) -> str | None:
    """A line when matching records exist outside the query's window, with the range they span."""
    span = _active_span(source, query)
    if span is None or span[2] == 0:
        return None
    first, last, _, rows = span
    return (f"matching records also exist outside the window {_iso(query.start)} to {_iso(query.end)}: they span "
            f"{_iso(first)} to {_iso(last)} (up to {rows} rows in blocks reaching outside it); "
            f"--from {_iso(first)} reads them all")


def column_outside_window(source: BlockSource, query: Query, unknown: list[str]) -> str | None:
    """When every unknown column exists in the selected records at some time: say so, with their range."""
    blocks = source.query_blocks([query.tenant], *EVER, query.selector, group=query.group)
    have = {c for b in blocks for d in b.datasets if d.kind == query.kind for c in d.columns}
    if not set(unknown) <= have:
        return None
    span = _active_span(source, query)
    where = f" (the selected records span {_iso(span[0])} to {_iso(span[1])})" if span else ""
    return (f"column(s) {', '.join(unknown)} exist in the selected records, but in none of those between "
            f"{_iso(query.start)} and {_iso(query.end)}{where}: widen --from/--to")
