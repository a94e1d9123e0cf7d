"""Rebuild the metastore's state from the bucket alone (guarantee 4 of the direction).

1. Every complete block (loadable meta.json, any age) is read. Blocks marked for deletion (retention, compaction,
   the leader's collection of uncommitted blocks) and blocks fully overlapped by a newer block become
   tombstones, so their objects are removed after the delete delay as before. They are never adopted.
2. Where live blocks of one (group, generation, topic, partition, incarnation, dataset kind, partition values)
   overlap in Kafka offsets (a block from a crashed batch or a losing ingest process beside the committed
   ones), one chain of non-overlapping blocks is adopted and the others are left out and reported: adopting
   both would store records twice. The chain is the one that covers the most offsets with compaction outputs
   (level > 0: a commit made them), then the most offsets. Blocks this cannot judge are adopted as they are:
   blocks holding datasets of more than one kind, and partition-group blocks whose partition values are fewer
   than their partition's (compaction outputs that merged several days or hours): their Kafka ranges do not
   say which records of those offsets they hold.
3. Committed offsets are rebuilt per (group, generation, topic, partition, incarnation) as the end of the
   contiguous run of offsets, from the lowest one, covered by the adopted blocks' Kafka ranges (commits are
   contiguous). A live block that begins beyond a gap in that run was never committed and never can be: it is
   left out and reported. A complete block that directly extends the run but was not yet committed (a batch
   that crashed between meta.json and its commit) is adopted: its records are in no other block, and ingest
   resumes after it without reading them twice. Of several incarnations of one topic-partition, the one with
   the newest block is current; the others are recorded as ended.
"""

from __future__ import annotations

import bisect
import json
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from shale.block import BlockFetcher, BlockMeta, BlockState, recover_meta
from shale.errors import ConfigError
from shale.index import begin, commit
from shale.index import offsets as offset_store
from shale.metastore.rules import StateMachine
from shale.objstore import BucketReader

RunKey = tuple[str, int, str, int, str]
"""(group, generation, topic, partition, incarnation)"""


@dataclass
class RebuildReport:
    tenants: int = 0
    blocks: int = 0
    tombstones: int = 0
    offsets: int = 0
    excluded: list[tuple[str, str]] = field(default_factory=list)
    recovered: list[str] = field(default_factory=list)
    """Blocks whose meta.json was lost, recovered from their objects' footers."""


@dataclass(frozen=True)
class _Span:
    start: int
    end: int
    weight: tuple[int, int]
    meta: BlockMeta


def _judgeable(metas: list[BlockMeta]) -> dict[str, tuple[str, str]]:
    """Per block id that the chain rule can judge: its dataset kind and partition values (as JSON)."""
    widest: dict[tuple[str, int, str, int], int] = defaultdict(int)
    for meta in metas:
        for r in meta.kafka:
            key = (meta.group, meta.generation, r.topic, r.partition)
            widest[key] = max(widest[key], len(meta.partition_values))
    out: dict[str, tuple[str, str]] = {}
    for meta in metas:
        kinds: set[str] = {d.kind for d in meta.datasets}
        full = all(len(meta.partition_values) == widest[(meta.group, meta.generation, r.topic, r.partition)]
                   for r in meta.kafka)
        if len(kinds) == 1 and (meta.group == "backup" or full):
            out[meta.id] = (kinds.pop(), json.dumps(meta.partition_values, sort_keys=True))
    return out


def _best_chain(spans: list[_Span]) -> set[str]:
    """Weighted interval scheduling: the non-overlapping spans of the greatest total weight (ids)."""
    spans = sorted(spans, key=lambda s: (s.end, s.start, s.meta.id))
    ends = [s.end for s in spans]
    best: list[tuple[tuple[int, int], list[str]]] = [((0, 0), [])]
    for i, span in enumerate(spans):
        before = bisect.bisect_right(ends, span.start, 0, i)  # spans ending at or before this one starts
        weight, chosen = best[before]
        take = ((weight[0] + span.weight[0], weight[1] + span.weight[1]), [*chosen, span.meta.id])
        best.append(max(best[i], take, key=lambda b: b[0]))
    return set(best[-1][1])


def choose_chains(metas: list[BlockMeta]) -> tuple[list[BlockMeta], list[tuple[str, str]]]:
    """The blocks to adopt, and the ones left out because they overlap the adopted chain (with the reason)."""
    judged = _judgeable(metas)
    spans: dict[tuple[object, ...], list[_Span]] = defaultdict(list)
    for meta in metas:
        if meta.id not in judged:
            continue
        kind, pv = judged[meta.id]
        per_key: dict[RunKey, list[tuple[int, int]]] = defaultdict(list)
        for r in meta.kafka:
            if r.end > r.start:
                per_key[(meta.group, meta.generation, r.topic, r.partition, r.incarnation)].append((r.start, r.end))
        for run, ranges in per_key.items():
            covered = sum(e - s for s, e in ranges)
            spans[(*run, kind, pv)].append(_Span(min(s for s, _ in ranges), max(e for _, e in ranges),
                                                 (covered if meta.level > 0 else 0, covered), meta))
    left_out: dict[str, str] = {}
    for where, candidates in spans.items():
        if len(candidates) < 2:
            continue
        chosen = _best_chain(candidates)
        kept = [c for c in candidates if c.meta.id in chosen]
        for c in candidates:
            if c.meta.id in chosen or c.meta.id in left_out:
                continue
            other = next((k for k in kept if k.start < c.end and c.start < k.end), None)
            if other is not None:
                left_out[c.meta.id] = (f"{where[2]}[{where[3]}] offsets [{max(c.start, other.start)},"
                                       f"{min(c.end, other.end)}) are also in {other.meta.id}, adopted instead")
    return [m for m in metas if m.id not in left_out], sorted(left_out.items())


def _committed_runs(metas: list[BlockMeta]) -> dict[RunKey, int]:
    spans: dict[RunKey, list[tuple[int, int]]] = defaultdict(list)
    for meta in metas:
        for r in meta.kafka:
            spans[(meta.group, meta.generation, r.topic, r.partition, r.incarnation)].append((r.start, r.end))
    ends = {}
    for key, ranges in spans.items():
        ranges.sort()
        end = ranges[0][1]
        for start, stop in ranges[1:]:
            if start > end:
                break
            end = max(end, stop)
        ends[key] = end
    return ends


def rebuild_from_bucket(bucket: BucketReader, target: Path, clock: Callable[[], float] = time.time) -> RebuildReport:
    if target.exists():
        raise ConfigError(f"{target} exists; rebuild into a new file, then install it with `shale metastore restore`")
    report = RebuildReport()
    fetcher = BlockFetcher(bucket, sync_delay=0, clock=clock)
    live: list[BlockMeta] = []
    dead: list[tuple[BlockMeta, str]] = []
    for tenant in fetcher.tenants():
        report.tenants += 1
        tenant_live = []
        for view in fetcher.sync(tenant).blocks.values():
            if view.meta is None and view.state is BlockState.PARTIAL:
                # A block that lost its meta.json: its objects' footers may still say what it is (seed 004).
                recovered, _ = recover_meta(bucket, tenant, view.id, view.objects)
                if recovered is not None:
                    report.recovered.append(recovered.id)
                    view.meta, view.state = recovered, BlockState.HEALTHY
            if view.meta is None:
                continue
            if view.state is BlockState.HEALTHY:
                tenant_live.append(view.meta)
            elif view.state is BlockState.MARKED_FOR_DELETION:
                dead.append((view.meta, view.mark.reason if view.mark else "marked"))
            elif view.state is BlockState.HEALTHY_OVERLAPPED:
                dead.append((view.meta, f"compacted into {view.overlapped_by}"))
        adopted, overlapping = choose_chains(tenant_live)
        live.extend(adopted)
        report.excluded.extend(overlapping)
    ends = _committed_runs(live)
    kept = []
    for meta in live:
        beyond = [r for r in meta.kafka if r.end > r.start
                  and r.start >= ends[(meta.group, meta.generation, r.topic, r.partition, r.incarnation)]]
        if beyond:
            report.excluded.append((meta.id, f"{beyond[0].topic}[{beyond[0].partition}] starts at {beyond[0].start}, "
                                             "after the last contiguous committed offset: never committed"))
        else:
            kept.append(meta)
    now_ms = int(clock() * 1000)
    newest: dict[RunKey, int] = defaultdict(int)
    event_times: dict[RunKey, int] = defaultdict(int)
    for meta in kept:
        for r in meta.kafka:
            key = (meta.group, meta.generation, r.topic, r.partition, r.incarnation)
            newest[key] = max(newest[key], meta.time_ms)
            event_times[key] = max(event_times[key], meta.max_time)
    state = StateMachine(target)
    w = state.writer
    begin(state.conn)
    for meta in kept:
        w.add_block(meta, now_ms)
    for meta, reason in dead:
        w.add_tombstone(meta, now_ms, reason)
    # Per topic-partition, its incarnations oldest first: each older one is recorded as ended by the next.
    for key in sorted(ends, key=lambda k: (k[:4], newest[k], k[4])):
        group, generation, topic, partition, incarnation = key
        if offset_store.committed(w.conn, group, generation, topic, partition) is not None:
            offset_store.end_incarnation(w.conn, group, generation, topic, partition, now_ms)
        offset_store.set_committed_end(w.conn, group, generation, topic, partition, ends[key], event_times[key], now_ms,
                            incarnation=incarnation)
    commit(state.conn)
    state.close()
    report.blocks, report.tombstones, report.offsets = len(kept), len(dead), len(ends)
    return report
