"""Lazy deletion (seed 000, rules 4, 7 and 8): mark, wait the delete delay, then remove.

Removal goes in reverse order of upload: meta.json first, then the data objects, then the mark. An
interrupted removal therefore leaves a block without meta.json but with its mark: Partial and marked, which
the next run finishes.

The cleaner, per tenant:

* marks Partial blocks (no loadable meta.json after the sync delay) and HealthyOverlapped blocks;
* removes marked blocks whose mark is older than the delete delay;
* removes orphan marks (their block's objects are all gone).

Blocks the metastore knows (``protected``) are never marked or removed here, whatever the bucket looks like:
the metastore is the authority on what is committed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from shale.block.fetcher import BlockFetcher, BlockState, BlockView, FetchResult, by_source, covering
from shale.block.layout import META_FILENAME, deletion_mark_key
from shale.block.marks import write_deletion_mark
from shale.objstore import Bucket

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Action:
    kind: str  # "mark", "delete" or "delete-orphan-mark"
    tenant: str
    block_id: str
    reason: str


@dataclass
class CleanupReport:
    actions: list[Action] = field(default_factory=list)
    protected: list[str] = field(default_factory=list)
    dry_run: bool = False


def delete_block(bucket: Bucket, view: BlockView) -> None:
    """Remove a block: meta.json first, then its data objects, then its deletion mark."""
    metas = [o for o in view.objects if o.key.endswith("/" + META_FILENAME)]
    for info in metas + [o for o in view.objects if o not in metas]:
        bucket.delete(info.key)
    bucket.delete(deletion_mark_key(view.tenant, view.id))


class Cleaner:
    def __init__(self, bucket: Bucket, fetcher: BlockFetcher, delete_delay: float,
                 clock: Callable[[], float] = time.time) -> None:
        self.bucket = bucket
        self.fetcher = fetcher
        self.delete_delay = delete_delay
        self.clock = clock

    def plan(self, result: FetchResult, protected: Collection[str] = ()) -> CleanupReport:
        """What to do. ``protected``: the blocks the metastore indexes. With it, the metastore also breaks the
        full-overlap rule's ties: a healthy block it does not index whose records are all in a block it does
        (a compaction output written by an attempt whose lease was lost) is marked, whatever the ids."""
        report = CleanupReport()
        now = self.clock()
        indexed = by_source(v for v in result.blocks.values() if v.id in protected)
        for view in sorted(result.blocks.values(), key=lambda v: v.id):
            if view.id in protected:
                if view.state in (BlockState.PARTIAL, BlockState.HEALTHY_OVERLAPPED, BlockState.MARKED_FOR_DELETION):
                    report.protected.append(view.id)
                continue
            if view.state is BlockState.MARKED_FOR_DELETION:
                assert view.mark is not None
                waited = now - view.mark.deletion_time
                if waited >= self.delete_delay:
                    report.actions.append(Action("delete", view.tenant, view.id,
                                                 f"marked {waited:.0f}s ago ({view.mark.reason})"))
            elif view.state is BlockState.PARTIAL:
                why = view.error or f"no meta.json {view.age:.0f}s after its last upload"
                report.actions.append(Action("mark", view.tenant, view.id, f"partial: {why}"))
            elif view.state is BlockState.HEALTHY_OVERLAPPED:
                report.actions.append(Action("mark", view.tenant, view.id, f"overlapped by {view.overlapped_by}"))
            elif view.state is BlockState.HEALTHY and (cover := next(covering(view, indexed), None)) is not None:
                report.actions.append(Action("mark", view.tenant, view.id,
                                             f"not indexed; its records are in indexed block {cover[0].id}"))
        for block_id in sorted(result.orphan_marks):
            report.actions.append(Action("delete-orphan-mark", result.tenant, block_id, "block already removed"))
        return report

    def run(self, tenant: str, *, dry_run: bool = False, protected: Collection[str] = ()) -> CleanupReport:
        result = self.fetcher.sync(tenant)
        report = self.plan(result, protected)
        report.dry_run = dry_run
        if dry_run:
            return report
        for action in report.actions:
            extra = {"tenant": action.tenant, "block": action.block_id, "reason": action.reason}
            if action.kind == "mark":
                write_deletion_mark(self.bucket, action.tenant, action.block_id, self.clock(), action.reason)
                log.info("marked block for deletion", extra=extra)
            elif action.kind == "delete":
                delete_block(self.bucket, result.blocks[action.block_id])
                log.info("deleted block", extra=extra)
            else:
                self.bucket.delete(deletion_mark_key(action.tenant, action.block_id))
                log.info("deleted orphan deletion mark", extra=extra)
        return report
