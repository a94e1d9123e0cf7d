"""Facts for the status page, gathered from the metastore's state, the bucket and (when reachable) Kafka."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from shale.block import DLQ_PREFIX, bucket_index_key
from shale.config import ShaleConfig
from shale.errors import NotFoundError, ShaleError
from shale.logs import redact
from shale.metastore import IndexReads
from shale.objstore import BucketReader

log = logging.getLogger(__name__)
HOUR_MS = 3_600_000


@dataclass
class Status:
    generated_at: float
    node: dict[str, Any]
    tenants: list[dict[str, Any]] = field(default_factory=list)
    histogram: list[tuple[str, int, int, int]] = field(default_factory=list)
    bucket_ms: int = HOUR_MS
    jobs: list[dict[str, Any]] = field(default_factory=list)
    leases: list[dict[str, Any]] = field(default_factory=list)
    """Every ingest shard's lease: its holder (empty: nobody writes the shard), age and takeovers."""
    queue: dict[str, int] = field(default_factory=dict)
    restores: list[dict[str, Any]] = field(default_factory=list)
    """The newest runs of ``shale restore``: who, what, when, the result."""
    offsets: list[dict[str, Any]] = field(default_factory=list)
    ledger: list[dict[str, Any]] = field(default_factory=list)
    dlq_depth: int = 0
    tombstones: int = 0
    oldest_tombstone_s: float = 0.0
    partial_blocks: dict[str, int] = field(default_factory=dict)
    overlaps: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Per tenant, indexed blocks that overlap where compaction will not merge them (the leader's last scan)."""
    kafka_error: str = ""
    losses: list[dict[str, Any]] = field(default_factory=list)
    incarnations: list[dict[str, Any]] = field(default_factory=list)
    iceberg: dict[str, Any] = field(default_factory=dict)


def _index_age(bucket: BucketReader, tenant: str, now: float) -> float | None:
    try:
        return max(0.0, now - bucket.head(bucket_index_key(tenant)).last_modified)
    except NotFoundError:
        return None
    except ShaleError:
        return None


def _lag(config: ShaleConfig, offsets: list[dict[str, Any]]) -> str:
    """Fill each committed partition's lag and its lost offsets (deleted by Kafka before they were read, waiting for
    `shale offsets acknowledge-loss`) from Kafka; a partition whose topic was recreated since is marked so."""
    from shale.kafka import describe_topics, offset_bounds

    topics = sorted({o["topic"] for o in offsets})
    if not topics:
        return ""
    try:
        current = describe_topics(config.kafka, topics, timeout=3)  # a page must not hang on a broker that is down
        marks = offset_bounds(config.kafka, [(t, p) for t, state in current.items() for p in state.partitions])
    except Exception as exc:  # Kafka is optional for the page: show what is known
        # The page is not a log, but it shows this error as text: redact configured secrets from it too.
        return f"Kafka not reachable: {redact(str(exc))[:200]}"
    for o in offsets:
        state = current.get(o["topic"])
        if state is None or (o["incarnation"] and o["incarnation"] != state.incarnation):
            o["note"] = "topic deleted" if state is None else "topic recreated: a new incarnation starts"
            continue
        earliest, end = marks.get((o["topic"], o["partition"]), (0, o["committed_end"]))
        o["lag"] = max(0, end - o["committed_end"])
        o["lost"] = max(0, earliest - o["committed_end"])
    return ""


def collect(index: IndexReads, node: dict[str, Any], bucket: BucketReader, config: ShaleConfig,
            partial_blocks: dict[str, int] | None = None, iceberg: dict[str, Any] | None = None,
            overlaps: dict[str, list[dict[str, Any]]] | None = None) -> Status:
    """The page's facts: ``index`` read-only, ``node`` the serving node's status (role, term, applied index)."""
    now = time.time()
    status = Status(generated_at=now, node=node)
    for tenant, blocks, rows, size in index.tenant_totals():
        status.tenants.append({"tenant": tenant, "blocks": blocks, "rows": rows, "bytes": size,
                               "index_age_s": _index_age(bucket, tenant, now)})
    status.histogram = index.level_histogram(HOUR_MS)
    status.jobs = index.compaction_jobs()
    status.queue = index.compaction_queue()
    status.leases = index.ingest_leases()
    status.restores = index.restores(20)
    status.offsets = [{**o.model_dump(), "lag": None, "lost": 0, "note": ""} for o in index.offsets()]
    status.kafka_error = _lag(config, status.offsets)
    incarnations, losses = index.offset_history()
    status.losses = [x.model_dump() for x in losses]
    status.incarnations = [i.model_dump() for i in incarnations]
    days: dict[tuple[str, int, str], dict[str, Any]] = {}
    for o in status.offsets:
        if o["group"] != "partition":
            continue
        key = (o["group"], o["generation"], o["topic"])
        entry = days.setdefault(key, {"group": key[0], "generation": key[1], "topic": key[2],
                                      "partitions": 0, "watermark": None})
        entry["partitions"] += 1
        watermark = o["max_event_time"]
        entry["watermark"] = watermark if entry["watermark"] is None else min(entry["watermark"], watermark)
    status.ledger = list(days.values())
    status.dlq_depth = sum(1 for i in bucket.list(DLQ_PREFIX) if i.key.endswith(".json"))
    tombstones = index.tombstones(limit=100_000)
    status.tombstones = len(tombstones)
    if tombstones:
        status.oldest_tombstone_s = now - min(t.created_at for t in tombstones) / 1000
    status.partial_blocks = dict(partial_blocks or {})
    status.overlaps = dict(overlaps or {})
    status.iceberg = dict(iceberg or {})
    return status
