"""Rendering the status page: HTML with inline CSS and an inline SVG chart (no script, no external request)."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from html import escape
from typing import Any

from shale.web.status import Status

COLOURS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948"]
CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5rem; color: #222; }
h1 { font-size: 1.4rem; } h2 { font-size: 1.1rem; margin-top: 1.6rem; }
table { border-collapse: collapse; font-size: .85rem; }
th, td { border: 1px solid #ccc; padding: .25rem .5rem; text-align: right; }
th { background: #f2f2f2; } td.l, th.l { text-align: left; }
.ok { color: #2a7d2a; } .bad { color: #b00020; font-weight: bold; } .muted { color: #777; }
.cards { display: flex; gap: 1rem; flex-wrap: wrap; }
.card { border: 1px solid #ccc; border-radius: 6px; padding: .5rem 1rem; min-width: 9rem; }
.card b { display: block; font-size: 1.3rem; }
"""


def _when(ms: int | None) -> str:
    if not ms:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M")


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "none yet"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def _table(headers: list[str], rows: list[list[Any]], table_id: str, left: int = 1) -> str:
    head = "".join(f'<th class="{"l" if i < left else ""}">{escape(h)}</th>' for i, h in enumerate(headers))
    body = "".join("<tr>" + "".join(f'<td class="{"l" if i < left else ""}">{c}</td>' for i, c in enumerate(r))
                   + "</tr>" for r in rows)
    if not rows:
        body = f'<tr><td class="l muted" colspan="{len(headers)}">none</td></tr>'
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def level_chart(status: Status, width: int = 900, height: int = 220) -> str:
    """Stacked bars: live blocks per hour of data time, one colour per compaction level."""
    counts: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for _, level, bucket, n in status.histogram:
        counts[bucket][level] += n
    if not counts:
        return '<svg id="levels" width="300" height="40"><text x="0" y="25">no blocks yet</text></svg>'
    buckets = sorted(counts)[-72:]
    levels = sorted({lv for b in buckets for lv in counts[b]})
    top = max(sum(counts[b].values()) for b in buckets)
    bar = max(2, (width - 60) // len(buckets))
    parts = [f'<svg id="levels" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height + 40}" '
             f'role="img" aria-label="live blocks per hour by level">']
    for i, b in enumerate(buckets):
        y = height
        for level in levels:
            n = counts[b].get(level, 0)
            h = round(n / top * (height - 10))
            if n:
                y -= h
                parts.append(f'<rect class="bar level-{level}" x="{50 + i * bar}" y="{y}" width="{bar - 1}" '
                             f'height="{h}" fill="{COLOURS[level % len(COLOURS)]}" data-level="{level}" '
                             f'data-blocks="{n}"><title>{_when(b)} level {level}: {n} blocks</title></rect>')
    parts.append(f'<text x="0" y="15" font-size="11">{top}</text><text x="0" y="{height}" font-size="11">0</text>')
    parts.append(f'<text x="50" y="{height + 15}" font-size="11">{_when(buckets[0])}</text>')
    parts.append(f'<text x="{width - 120}" y="{height + 15}" font-size="11">{_when(buckets[-1])}</text>')
    for j, level in enumerate(levels):
        parts.append(f'<rect x="{50 + j * 90}" y="{height + 25}" width="10" height="10" '
                     f'fill="{COLOURS[level % len(COLOURS)]}"/><text x="{64 + j * 90}" y="{height + 34}" '
                     f'font-size="11">level {level}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _iceberg(facts: dict[str, Any]) -> str:
    """The Iceberg publisher: how far it has published, its lag and its last error."""
    if not facts.get("enabled"):
        return '<h2>Iceberg</h2><p class="muted" id="iceberg">not enabled (iceberg.enabled)</p>'
    lag = float(facts.get("lag_seconds", 0.0))
    error = facts.get("last_error", "")
    return ('<h2>Iceberg</h2><p id="iceberg">'
            f'published through log index <b>{facts.get("published_through", 0)}</b> of '
            f'{facts.get("applied_index", 0)}; tables: {facts.get("tables", 0)}; lag: '
            f'<span class="{"bad" if lag > 300 else "ok"}">{_age(lag)}</span>'
            + (f'; <span class="bad">last error: {escape(str(error))}</span>' if error else "") + "</p>"
            + "".join(f'<p class="bad">table {escape(f["tenant"])}.{escape(f["topic"])}'
                      f'{" record " + escape(f["record"]) if f.get("record") else ""} not published since entry '
                      f'{f["since_entry"]} ({f["failures"]} failures; the other tables are): {escape(f["error"])}</p>'
                      for f in facts.get("failing_tables", [])))


def _overlaps(found: dict[str, list[dict[str, Any]]]) -> str:
    """Overlapping indexed blocks compaction will not merge, with the command that plans their repair."""
    if not found:
        return '<h2>Overlaps</h2><p class="ok" id="overlaps">no overlapping blocks</p>'
    rows = [[escape(tenant), escape(" + ".join(o["blocks"])), escape(o["detail"]),
             f"<code>shale bucket repair --tenant {escape(tenant)}</code>"]
            for tenant, overlaps in sorted(found.items()) for o in overlaps]
    return ('<h2>Overlaps</h2><p class="bad">Indexed blocks hold the same records and compaction will not merge '
            "them. Nothing has stopped; run the repair's dry run, then <code>--apply</code>.</p>"
            + _table(["tenant", "blocks", "overlap", "repair"], rows, "overlaps", left=4))


def render(status: Status, refresh_s: int = 10) -> str:
    node = status.node
    leader_ok = node.get("role") in ("leader", "single") or node.get("leader")
    cards = [("tenants", len(status.tenants)), ("live blocks", node.get("blocks", 0)),
             ("compaction jobs", len(status.jobs)), ("queued blocks", sum(status.queue.values())),
             ("DLQ depth", status.dlq_depth), ("pending deletions", status.tombstones),
             ("partial blocks", sum(status.partial_blocks.values())),
             ("overlapping blocks", len({b for found in status.overlaps.values() for o in found for b in o["blocks"]}))]
    html = [f'<!doctype html><html><head><meta charset="utf-8"><title>Shale status</title>'
            f'<meta http-equiv="refresh" content="{refresh_s}"><style>{CSS}</style></head><body>',
            f'<h1>Shale status</h1><p>metastore {escape(str(node.get("role")))} '
            f'<span class="{"ok" if leader_ok else "bad"}">{"leader known" if leader_ok else "NO LEADER"}</span>, '
            f'term {node.get("term")}, applied index {node.get("applied_index")}, '
            f'generated {_when(int(status.generated_at * 1000))} UTC</p>',
            '<div class="cards" id="cards">' + "".join(
                f'<div class="card" data-name="{escape(n)}"><b>{v}</b>{escape(n)}</div>' for n, v in cards) + "</div>",
            "<h2>Tenants</h2>",
            _table(["tenant", "live blocks", "rows", "bytes", "bucket index age"],
                   [[escape(t["tenant"]), t["blocks"], t["rows"], t["bytes"], _age(t["index_age_s"])]
                    for t in status.tenants], "tenants"),
            "<h2>Blocks by level over time</h2>", level_chart(status),
            "<h2>Compaction</h2>",
            _table(["job", "tenant", "level", "sources", "status", "token", "failures", "worker"],
                   [[escape(j["name"]), escape(j["tenant"]), j["level"], j["sources"],
                     f'<span class="{"bad" if j["status"] == "excluded" else ""}">{escape(j["status"])}</span>',
                     j["token"], j["failures"], escape(j["worker"])] for j in status.jobs], "jobs"),
            "<p>queued blocks: " + (", ".join(f"{escape(k)}: {v}" for k, v in sorted(status.queue.items()))
                                    or "none") + "</p>",
            "<h2>Ingest</h2>",
            _table(["group", "generation", "shard", "of", "holder", "lease age", "token", "takeovers"],
                   [[escape(x["group"]), x["generation"], x["shard"], x["shards"],
                     escape(x["holder"]) if x["holder"] else
                     f'<span class="bad">none (last: {escape(x["last_holder"] or "-")})</span>',
                     _age(x["age_ms"] / 1000) if x["holder"] else "-", x["token"], x["takeovers"]]
                    for x in status.leases], "leases", left=5),
            f'<p class="bad">{escape(status.kafka_error)}</p>' if status.kafka_error else "",
            _table(["group", "generation", "topic", "partition", "incarnation", "committed end",
                    "offsets without a record", "lag", "lost", "event time"],
                   [[escape(o["group"]), o["generation"], escape(o["topic"]), o["partition"],
                     escape(o["incarnation"][:8] or "-"), o["committed_end"], o["skipped"],
                     escape(o["note"]) if o["note"] else ("-" if o["lag"] is None else o["lag"]),
                     f'<span class="bad">{o["lost"]}: shale offsets acknowledge-loss</span>' if o["lost"] else 0,
                     _when(o["max_event_time"])] for o in status.offsets],
                   "offsets", left=4),
            "<p>acknowledged losses: " + (", ".join(
                f'{escape(x["group"])} {escape(x["topic"])}[{x["partition"]}] [{x["start"]},{x["end"]}) '
                f'({escape(x["reason"])})' for x in status.losses) or "none") + "; past topic incarnations: " + (
                ", ".join(f'{escape(i["topic"])}[{i["partition"]}] {escape(i["incarnation"][:8])} ended at '
                          f'{i["committed_end"]}' for i in status.incarnations) or "none") + "</p>",
            "<h2>Completeness ledger</h2><p class=\"muted\">a day is complete when every partition's committed "
            "event time has passed its end (shale ledger --topic T)</p>",
            _table(["topic", "generation", "partitions", "complete up to"],
                   [[escape(e["topic"]), e["generation"], e["partitions"], _when(e["watermark"])]
                    for e in status.ledger], "ledger"),
            "<h2>Restores</h2>",
            _table(["started", "ended", "job", "state", "by", "tenant", "topic", "target", "range", "records",
                    "why stopped"],
                   [[_when(r["started_at"]), _when(r["ended_at"]) if r["ended_at"] else "-", escape(r["job"]),
                     f'<span class="{"bad" if r["state"] in ("stopped", "interrupted") else ""}">'
                     f'{escape(r["state"])}</span>', escape(r["by"]), escape(r["tenant"]), escape(r["topic"]),
                     escape(r["target"]), escape(r["range"]), r["records"], escape(r["message"][:300])]
                    for r in status.restores], "restores", left=9),
            "<h2>Storage</h2>",
            f"<p>dead letter queue: <b>{status.dlq_depth}</b> commands; pending deletions: <b>{status.tombstones}"
            f"</b> (oldest {_age(status.oldest_tombstone_s) if status.tombstones else '-'}); partial blocks: "
            + (", ".join(f"{escape(t)}: {n}" for t, n in sorted(status.partial_blocks.items())) or "none")
            + "</p>", _overlaps(status.overlaps), _iceberg(status.iceberg),
            '<form method="post" action="/ui/logout"><button type="submit">Log out</button></form></body></html>']
    return "".join(html)


def login_page(message: str = "") -> str:
    """The status page's login form: the token is sent once, by POST from this page, and a session cookie
    (HttpOnly, SameSite=Strict) carries the login from then on."""
    note = f'<p class="bad" id="login-error">{escape(message)}</p>' if message else ""
    return (f'<!doctype html><html><head><meta charset="utf-8"><title>Shale status: log in</title>'
            f"<style>{CSS}</style></head><body><h1>Shale status</h1>{note}"
            '<form method="post" action="/ui/login" id="login"><label>API token (a reader of every tenant, or '
            'admin) <input type="password" name="token" id="token" autocomplete="off" required></label> '
            '<button type="submit">Log in</button></form></body></html>')
