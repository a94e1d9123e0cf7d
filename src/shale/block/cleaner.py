"""Lazy deletion (seed 000, rules 4, 7 and 8): mark, wait the delete delay, then remove.

Removal goes in reverse order of upload: meta.json first, then the data objects, then the mark. An
interrupted removal therefore leaves a block without meta.json but with its mark: Partial and marked, which
the next run finishes.

The cleaner, per tenant:

* marks Partial blocks (no loadable meta.json after the sync delay);
* removes marked blocks whose mark is older than the delete delay;
* removes orphan marks (their block's objects are all gone);
* with the metastore's view (``MetastoreView``, read *after* the bucket was listed): never touches a block the
  index holds, except to write back the meta.json of one that lost it, recovered from its objects' footers
  (``shale.block.recover``); marks a block it does not hold whose records are all in one it does (the
  full-overlap rule with the index breaking the tie); marks a block the view says no commit can claim
  (uncommitted garbage);
* without it: refuses every overlap-based mark (HealthyOverlapped, including the seed's tie-break between equal
  source sets), because nobody then knows which copy is committed (even a strict superset can be an uncommitted
  compaction output), unless forced.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from shale.block.fetcher import BlockFetcher, BlockState, BlockView, FetchResult, by_source, covering
from shale.block.layout import META_FILENAME, deletion_mark_key, meta_key
from shale.block.marks import write_deletion_mark
from shale.block.meta import BlockMeta
from shale.block.recover import recover_meta
from shale.errors import ConflictError
from shale.objstore import Bucket

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Action:
    kind: str  # "mark", "delete", "delete-orphan-mark" or "recover"
    tenant: str
    block_id: str
    reason: str


@dataclass
class CleanupReport:
    actions: list[Action] = field(default_factory=list)
    protected: list[str] = field(default_factory=list)
    refused: list[Action] = field(default_factory=list)
    """Marks not made: overlap-based marks without the metastore's view (and not forced)."""
    recovered: dict[str, BlockMeta] = field(default_factory=dict)
    """The meta.json to write back, per block of a "recover" action."""
    dry_run: bool = False


def _nothing_unclaimed(meta: BlockMeta) -> str | None:
    return None


@dataclass(frozen=True)
class MetastoreView:
    """What the metastore knows of one tenant, read after the bucket was listed (so a block committed after the
    listing is indexed here or still claimable). ``unclaimed`` says why no commit can ever claim a block the
    index does not hold (None: keep it); the default judges nothing (protection only)."""

    indexed: frozenset[str]
    tombstoned: frozenset[str] = frozenset()
    unclaimed: Callable[[BlockMeta], str | None] = _nothing_unclaimed


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

    def plan(self, result: FetchResult, metastore: MetastoreView | None = None, *,
             force: bool = False) -> CleanupReport:
        """What to do with ``result``'s blocks (see the module docstring)."""
        report = CleanupReport()
        now = self.clock()
        indexed = metastore.indexed if metastore is not None else frozenset()
        covers = by_source(v for v in result.blocks.values() if v.id in indexed)
        for view in sorted(result.blocks.values(), key=lambda v: v.id):
            if view.id in indexed:
                if view.state is BlockState.PARTIAL:
                    meta, why = recover_meta(self.bucket, view.tenant, view.id, view.objects)
                    if meta is not None:
                        report.recovered[view.id] = meta
                        report.actions.append(Action("recover", view.tenant, view.id, f"indexed, no meta.json: {why}"))
                        continue
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
            elif metastore is None:
                if view.state is BlockState.HEALTHY_OVERLAPPED:
                    mark = Action("mark", view.tenant, view.id, f"overlapped by {view.overlapped_by}")
                    if force:
                        report.actions.append(mark)
                    else:
                        report.refused.append(Action(
                            "mark", view.tenant, view.id, f"overlapped by {view.overlapped_by}, but without the "
                            "metastore nobody knows which copy is committed (--force marks it anyway)"))
            elif view.state in (BlockState.HEALTHY, BlockState.HEALTHY_OVERLAPPED) and view.meta is not None \
                    and view.id not in metastore.tombstoned:
                if (cover := next(covering(view, covers), None)) is not None:
                    report.actions.append(Action("mark", view.tenant, view.id,
                                                 f"not indexed; its records are in indexed block {cover[0].id}"))
                elif (unclaimed := metastore.unclaimed(view.meta)) is not None:
                    report.actions.append(Action("mark", view.tenant, view.id, unclaimed))
        for block_id in sorted(result.orphan_marks):
            report.actions.append(Action("delete-orphan-mark", result.tenant, block_id, "block already removed"))
        return report

    def run(self, tenant: str, *, dry_run: bool = False, metastore: Callable[[], MetastoreView] | None = None,
            force: bool = False) -> CleanupReport:
        """List the tenant's blocks, then (if given) read the metastore's view, plan, and act unless ``dry_run``."""
        result = self.fetcher.sync(tenant)
        report = self.plan(result, metastore() if metastore is not None else None, force=force)
        report.dry_run = dry_run
        if not dry_run:
            self.execute(result, report)
        return report

    def execute(self, result: FetchResult, report: CleanupReport) -> None:
        for action in report.actions:
            extra = {"tenant": action.tenant, "block": action.block_id, "reason": action.reason}
            if action.kind == "recover":
                meta = report.recovered[action.block_id]
                with contextlib.suppress(ConflictError):  # written meanwhile: whoever wrote it, it is whole
                    self.bucket.put_if_absent(meta_key(meta), meta.to_json())
                log.warning("wrote back a lost meta.json from the block's footers", extra=extra)
            elif action.kind == "mark":
                write_deletion_mark(self.bucket, action.tenant, action.block_id, self.clock(), action.reason)
                log.info("marked block for deletion", extra=extra)
            elif action.kind == "delete":
                delete_block(self.bucket, result.blocks[action.block_id])
                log.info("deleted block", extra=extra)
            else:
                self.bucket.delete(deletion_mark_key(action.tenant, action.block_id))
                log.info("deleted orphan deletion mark", extra=extra)
