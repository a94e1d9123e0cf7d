"""The leader's periodic work: retention (``TruncateIndex``), deletion marks and object removal for tombstones
(``DeleteTombstones``), dead letter queue replay and the cleaning of its rejected commands, and the bucket scan
(partial blocks, uncommitted blocks, and overlapping indexed blocks that compaction will not merge, reported with
the repair command).

Retention and tombstone collection follow seed 004's two-phase pattern: read the leader's own state, then
propose a command; ``TruncateIndex`` carries the term it was prepared in, and is rejected if leadership changed.
Marks come before tombstones' object removal, and removal goes meta.json first, data, mark last (seed 000).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter, Gauge

from shale.block import (
    META_FILENAME,
    BlockFetcher,
    BlockState,
    Cleaner,
    DeletionMark,
    MetastoreView,
    Overlap,
    check_block_folder,
    check_file_name,
    deletion_mark_key,
    legacy_block_prefix,
    overlaps,
    write_deletion_mark,
)
from shale.bucketindex import DeltaLink, DeltaWriter
from shale.compaction import uncompactable
from shale.config import RetentionConfig, granted_delete_delay
from shale.index import CompactionState, PartitionRow, TombstoneRow
from shale.metastore.api.dlq import Committed, DeadLetterQueue
from shale.metastore.api.service import MetastoreService
from shale.metastore.rules import Claims, DeleteTombstones, PartitionKey, TruncateIndex, unclaimed
from shale.objstore import Bucket

log = logging.getLogger(__name__)
TOMBSTONES = Gauge("shale_metastore_tombstones", "Tombstones whose objects are not yet deleted.")
OLDEST_TOMBSTONE = Gauge("shale_metastore_oldest_tombstone_seconds", "Age of the oldest pending tombstone.")
PARTIAL = Gauge("shale_bucket_partial_blocks", "Partial blocks (no meta.json after the sync delay) at the last "
                "bucket scan.", ["tenant"])
PARTIAL_AGE = Gauge("shale_bucket_partial_oldest_seconds", "Age of the oldest partial block at the last scan.",
                    ["tenant"])
DELETED = Counter("shale_metastore_deleted_blocks_total", "Blocks whose objects were removed after the delay.")
UNCOMMITTED = Counter("shale_bucket_uncommitted_blocks_marked_total", "Blocks no commit can claim, marked for "
                      "deletion by the bucket scan.", ["tenant"])
RETENTION = Counter("shale_metastore_retention_blocks_total", "Blocks removed from the index by retention.")
OVERLAPPING = Gauge("shale_bucket_overlapping_blocks", "Indexed blocks that may hold a record another indexed block "
                    "holds too, in an overlap compaction will not merge (run `shale bucket repair`), at the last "
                    "bucket scan.", ["tenant"])
OVERLAPS_SHOWN = 20
"""Overlaps kept per tenant for the status page (the gauge counts them all)."""


def retention_cutoffs(tenants: set[str], retention: RetentionConfig, now_ms: int) -> dict[str, int]:
    """Per tenant with a retention, the time (ms) its blocks' creation window and data must both end by to be
    removed."""
    return {t: now_ms - int(retention.for_tenant(t) * 1000) for t in sorted(tenants) if retention.for_tenant(t) > 0}


def expired_partitions(partitions: list[PartitionRow], retention: RetentionConfig, now_ms: int) -> list[PartitionRow]:
    """Partitions past their tenant's retention: by creation window *and* by data time (seed 004), so that
    backfilled old data is kept for the full period after it was written."""
    cutoffs = retention_cutoffs({p.tenant for p in partitions}, retention, now_ms)
    return [p for p in partitions
            if p.tenant in cutoffs and p.window_end <= cutoffs[p.tenant] and p.max_time <= cutoffs[p.tenant]]


@dataclass
class Maintenance:
    service: MetastoreService
    bucket: Bucket
    retention: RetentionConfig
    delete_delay: float
    is_leader: Callable[[], bool]
    term: Callable[[], int]
    clock: Callable[[], float] = time.time

    sync_delay: float = 900.0
    erasure_delay_floor: float = 3600.0
    """The shortest delete delay this leader gives an erasure's replaced blocks, whatever the request asked
    (``ShaleConfig.erasure_delay_floor``)."""
    write_deltas: bool = False

    def __post_init__(self) -> None:
        self.dlq = DeadLetterQueue(self.bucket)
        self.deltas = DeltaWriter(self.bucket, self.clock) if self.write_deltas else None
        self._marked: set[str] = set()
        self.partial_blocks: dict[str, int] = {}
        self.overlaps: dict[str, list[dict[str, object]]] = {}
        """Per tenant, the overlaps compaction will not merge (at most ``OVERLAPS_SHOWN``), for the status page."""

    def scan_bucket(self) -> dict[str, int]:
        """Scan every tenant's blocks in the bucket (the metastore cannot see partial uploads), record the partial
        ones, and run the bucket cleaner with the index's view: indexed blocks are protected, and complete blocks
        that no commit can claim any more (``garbage.unclaimed``) are marked, then removed after the delete delay.

        The bucket is listed first and the index read after (linearizable, one snapshot): a block committed after
        the listing is then indexed in the read, or still claimable by it, so it is never judged garbage."""
        fetcher = BlockFetcher(self.bucket, self.sync_delay, clock=self.clock)
        cleaner = Cleaner(self.bucket, fetcher, self.delete_delay, clock=self.clock)
        results = [fetcher.sync(tenant) for tenant in fetcher.tenants()]
        self.service.linearize()
        reader = self.service.state.reader
        with reader.snapshot():
            compaction = CompactionState(reader.conn)
            jobs = compaction.jobs()
            claims = Claims.of(reader.offsets(), reader.incarnations(), [job.sources for job in jobs])
            views = {r.tenant: MetastoreView(frozenset(reader.tenant_block_ids(r.tenant)),
                                             frozenset(reader.tenant_tombstone_ids(r.tenant)),
                                             functools.partial(unclaimed, claims=claims)) for r in results}
            queued = compaction.queued()
            stuck = {tenant: uncompactable(overlaps(reader.tenant_blocks(tenant)), queued, jobs, self.service.limits)
                     for tenant in reader.tenants()}
        self._report_overlaps(stuck)
        found: dict[str, int] = {}
        for result in results:
            partial = result.in_state(BlockState.PARTIAL)
            found[result.tenant] = len(partial)
            PARTIAL.labels(result.tenant).set(len(partial))
            PARTIAL_AGE.labels(result.tenant).set(max((v.age for v in partial), default=0))
            report = cleaner.plan(result, views[result.tenant])
            cleaner.execute(result, report)
            collected = [a for a in report.actions if a.kind == "mark" and a.reason.startswith("uncommitted")]
            UNCOMMITTED.labels(result.tenant).inc(len(collected))
            for action in collected:
                log.warning("marked an uncommitted block for deletion",
                            extra={"tenant": action.tenant, "block": action.block_id, "reason": action.reason})
        self.partial_blocks = found
        return found

    def _report_overlaps(self, stuck: dict[str, list[Overlap]]) -> None:
        for tenant in set(self.overlaps) - set(stuck):
            OVERLAPPING.labels(tenant).set(0)
        self.overlaps = {}
        for tenant, found in sorted(stuck.items()):
            OVERLAPPING.labels(tenant).set(len({b for o in found for b in (o.first, o.second)}))
            if not found:
                continue
            self.overlaps[tenant] = [{"blocks": [o.first, o.second], "detail": o.detail}
                                     for o in found[:OVERLAPS_SHOWN]]
            log.warning("indexed blocks overlap and compaction will not merge them; nothing stops, and "
                        f"`shale bucket repair --tenant {tenant}` plans the fix",
                        extra={"tenant": tenant, "overlaps": len(found), "first": found[0].detail})

    def prepare_retention(self) -> tuple[TruncateIndex, dict[str, list[DeletionMark]]] | None:
        """Step one of retention: read the state, write the deletion marks of the expired blocks (marks first:
        a bucket reader never sees a tombstoned block without its mark), and build the command. The command
        carries the cutoffs, so its apply removes exactly the blocks marked here that are still in the index,
        and any block added since that the same cutoffs expire (the tombstone collector marks those)."""
        now_ms = int(self.clock() * 1000)
        partitions = self.service.state.reader.partitions()
        expired = expired_partitions(partitions, self.retention, now_ms)
        if not expired:
            return None
        term = self.term()
        cutoffs = retention_cutoffs({p.tenant for p in expired}, self.retention, now_ms)
        marks: dict[str, list[DeletionMark]] = {}
        for p in expired:
            for block_id in self.service.state.reader.partition_blocks(p.tenant, p.shard, p.window_start,
                                                                       data_until=cutoffs[p.tenant]):
                marks.setdefault(p.tenant, []).append(
                    write_deletion_mark(self.bucket, p.tenant, block_id, self.clock(), "retention"))
        return TruncateIndex(prepared_term=term, cutoffs=cutoffs, partitions=[
            PartitionKey(tenant=p.tenant, shard=p.shard, window_start=p.window_start) for p in expired]), marks

    def apply_retention(self) -> int:
        prepared = self.prepare_retention()
        if prepared is None:
            return 0
        command, marks = prepared
        result = self.service.submit(command)
        if not result.ok:
            log.warning("retention proposal rejected", extra={"reason": result.reason})
            return 0
        removed = int(result.data.get("removed", 0))
        RETENTION.inc(removed)
        if self.deltas is not None:
            self._retention_deltas(self.deltas, result.data, marks, command.reason)
        log.info("retention removed blocks from the index", extra={"blocks": removed,
                                                                   "partitions": len(command.partitions)})
        return removed

    def _retention_deltas(self, deltas: DeltaWriter, data: dict[str, Any],
                          marks: dict[str, list[DeletionMark]], reason: str) -> None:
        """One delta per tenant whose blocks the truncation removed, marking every one of them: the marks written
        when it was prepared, and a mark at the entry's time for a block the same cutoffs expired that was added
        in between (the tombstone collector writes its bucket mark later). A delta that lacked one would show
        that block as live to a stale-tolerant reader."""
        links = data.get("links", {})
        for tenant, block_ids in sorted(data.get("tombstoned", {}).items()):
            link = DeltaLink.of(links.get(tenant))
            written = {m.id: m for m in marks.get(tenant, [])}
            at = link.time if link is not None else self.clock()
            deltas.write(tenant, marks=[written.get(b) or (b, at, reason) for b in block_ids], link=link)

    def collect_tombstones(self) -> int:
        """Mark every tombstoned block in the bucket once it is ``sync_delay`` old; remove the objects of those
        past the delete delay. A compaction's tombstones are as old as its output's commit, and the output was
        uploaded before it: marking its sources only once the output is past the sync delay means a bucket
        scanner, which trusts no block younger than that, always sees one of the two (seed 000)."""
        now = self.clock()
        rows = self.service.tombstones(limit=10_000)
        TOMBSTONES.set(len(rows))
        OLDEST_TOMBSTONE.set(max(0.0, now - min(r.created_at for r in rows) / 1000) if rows else 0)
        for row in rows:
            if row.block_id not in self._marked and row.created_at / 1000 + self.sync_delay <= now:
                write_deletion_mark(self.bucket, row.tenant, row.block_id, row.created_at / 1000, row.reason)
                self._marked.add(row.block_id)
        due = [r for r in rows if r.created_at / 1000 + self.delay_of(r) <= now]
        for row in due:
            remove_block_objects(self.bucket, row)
        if due:
            result = self.service.submit(DeleteTombstones(block_ids=[r.block_id for r in due]))
            result.raise_for_rejection()
            if self.deltas is not None:
                for tenant in sorted({r.tenant for r in due}):
                    self.deltas.write(tenant, removed=[r.block_id for r in due if r.tenant == tenant],
                                      link=DeltaLink.of(result.data.get("links", {}).get(tenant)))
            self._marked.difference_update(r.block_id for r in due)
            DELETED.inc(len(due))
            log.info("removed tombstoned blocks from the bucket", extra={"blocks": len(due)})
        return len(due)

    def delay_of(self, row: TombstoneRow) -> float:
        """How long a tombstoned block's objects stay: the delete delay, or the shorter one its erasure asked for,
        never below the floor."""
        return granted_delete_delay(row.delay_ms / 1000, max(self.erasure_delay_floor, self.sync_delay),
                                    self.delete_delay)

    def replay_dlq(self) -> int:
        report = self.dlq.replay(self.service.submit_bytes)
        return len(report.replayed)

    def clean_rejected(self) -> list[str]:
        """Remove the rejected dead letter commands whose offsets are all committed by other blocks, once kept for
        ``REJECTED_KEEP_SECONDS`` (``DeadLetterQueue.clean_rejected``); one that may hold the only copy stays."""
        _, losses = self.service.offset_history()
        lost: dict[tuple[str, int, str, int], list[tuple[int, int]]] = {}
        for x in losses:
            lost.setdefault((x.group, x.generation, x.topic, x.partition), []).append((x.start, x.end))
        views = {(o.group, o.generation, o.topic, o.partition): Committed(
            o.committed_end, o.incarnation, tuple(lost.get((o.group, o.generation, o.topic, o.partition), ())))
            for o in self.service.offsets()}
        return self.dlq.clean_rejected(lambda *key: views.get(key), self.clock())

    def run_once(self) -> None:
        if not self.is_leader():
            return
        self.replay_dlq()
        self.apply_retention()
        self.collect_tombstones()
        self.clean_rejected()

    def loop(self, stop: threading.Event, interval: float, dlq_interval: float, scan_interval: float) -> None:
        """Run until ``stop``: the DLQ every ``dlq_interval``, retention and tombstones every ``interval``, the
        bucket scan every ``scan_interval``."""
        next_full = next_scan = 0.0
        while not stop.is_set():
            try:
                if self.is_leader():
                    self.replay_dlq()
                    if time.monotonic() >= next_full:
                        self.apply_retention()
                        self.collect_tombstones()
                        self.clean_rejected()
                        next_full = time.monotonic() + interval
                    if time.monotonic() >= next_scan:
                        next_scan = time.monotonic() + scan_interval
                        self.scan_bucket()
            except Exception:
                log.exception("metastore maintenance pass failed; retrying next period")
            stop.wait(dlq_interval)


def remove_block_objects(bucket: Bucket, row: TombstoneRow) -> None:
    """Delete a tombstoned block: meta.json first, then its data objects, then its deletion mark. Its folder is the
    row's ``prefix``, which must name this block (a row without one comes from a metastore of before, whose blocks
    were all under ``<tenant>/blocks/``)."""
    prefix = check_block_folder(row.prefix or legacy_block_prefix(row.tenant, row.block_id), row.tenant,
                                row.block_id)
    bucket.delete(prefix + META_FILENAME)
    for name in row.files:
        bucket.delete(prefix + check_file_name(name))
    bucket.delete(deletion_mark_key(row.tenant, row.block_id))
