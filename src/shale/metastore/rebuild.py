"""Rebuild the metastore's state from the bucket alone (guarantee 4 of the direction).

Every complete block (loadable meta.json, any age) that is neither marked for deletion nor fully overlapped
by a newer block goes back into the index; marked and overlapped blocks become tombstones, so their objects
are removed after the delete delay as before. Committed offsets are rebuilt per (group, generation, topic,
partition) as the end of the contiguous run of offsets, from the lowest one, covered by the live blocks'
Kafka ranges (commits are contiguous). A live block that begins beyond a gap in that run was never committed
and never can be: it is left out and reported. A complete block that directly extends the run but was not yet
committed (a batch that crashed between meta.json and its commit) is adopted: its records are in no other
block, and ingest resumes after it without reading them twice.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from shale.block import BlockFetcher, BlockMeta, BlockState
from shale.errors import ConfigError
from shale.metastore.fsm import StateMachine
from shale.objstore import BucketReader


@dataclass
class RebuildReport:
    tenants: int = 0
    blocks: int = 0
    tombstones: int = 0
    offsets: int = 0
    excluded: list[tuple[str, str]] = field(default_factory=list)


def _committed_runs(metas: list[BlockMeta]) -> dict[tuple[str, int, str, int], int]:
    spans: dict[tuple[str, int, str, int], list[tuple[int, int]]] = defaultdict(list)
    for meta in metas:
        for r in meta.kafka:
            spans[(meta.group, meta.generation, r.topic, r.partition)].append((r.start, r.end))
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
        for view in fetcher.sync(tenant).blocks.values():
            if view.meta is None:
                continue
            if view.state is BlockState.HEALTHY:
                live.append(view.meta)
            elif view.state is BlockState.MARKED_FOR_DELETION:
                dead.append((view.meta, view.mark.reason if view.mark else "marked"))
            elif view.state is BlockState.HEALTHY_OVERLAPPED:
                dead.append((view.meta, f"compacted into {view.overlapped_by}"))
    ends = _committed_runs(live)
    kept = []
    for meta in live:
        beyond = [r for r in meta.kafka if r.start >= ends[(meta.group, meta.generation, r.topic, r.partition)]
                  and r.end > r.start]
        if beyond:
            report.excluded.append((meta.id, f"{beyond[0].topic}[{beyond[0].partition}] starts at {beyond[0].start}, "
                                             "after the last contiguous committed offset: never committed"))
        else:
            kept.append(meta)
    now_ms = int(clock() * 1000)
    state = StateMachine(target)
    w = state.writer
    state.conn.execute("BEGIN IMMEDIATE")
    for meta in kept:
        w.add_block(meta, now_ms)
    for meta, reason in dead:
        w.add_tombstone(meta, now_ms, reason)
    for (group, generation, topic, partition), end in sorted(ends.items()):
        event_time = max((m.max_time for m in kept if m.group == group and m.generation == generation
                          and any(r.topic == topic and r.partition == partition for r in m.kafka)), default=0)
        w.set_committed_end(group, generation, topic, partition, end, event_time, now_ms)
    state.conn.execute("COMMIT")
    state.close()
    report.blocks, report.tombstones, report.offsets = len(kept), len(dead), len(ends)
    return report
