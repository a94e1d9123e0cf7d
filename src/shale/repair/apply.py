"""Applying a repair plan, step by step, through the same commit paths as compaction.

Each step is safe to stop anywhere (SIGKILL), and the plan a second run computes from the new state finishes it:

* **mark** (a block the index removed): its deletion mark, put-if-absent.
* **drop**: the deletion mark first (so a bucket reader never sees a block the index removed without its mark),
  then ``ReplaceBlocks`` with no outputs if the index holds it (a replay is a no-op). Stopped in between, the
  block is indexed and marked by a repair: the next plan drops it again.
* **merge** and **rebuild**: the new block is written (data objects, meta.json last, put-if-absent, under a
  deterministic id), then ``ReplaceBlocks`` swaps it for the inputs in the index atomically, then the inputs get
  their deletion marks. Stopped before the swap, the next plan finds the block written and reuses it; after it,
  the inputs are tombstoned and the next plan marks them.
* **quarantine**: the quarantine mark first, then ``QuarantineBlocks`` if the index holds it.

A step that fails is reported and the others go on; nothing is deleted here: the cleaner and the metastore's
leader remove marked blocks after the delete delay, as they do for compaction.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from shale.block import BlockMeta, quarantine_mark_key, write_deletion_mark, write_quarantine_mark
from shale.errors import ShaleError
from shale.failpoints import failpoint
from shale.metastore import Commands, QuarantineBlocks, ReplaceBlocks, Result
from shale.objstore import Bucket
from shale.repair.build import Builder
from shale.repair.model import REPAIR, BuildRequest, Plan, Step

log = logging.getLogger(__name__)


@dataclass
class ApplyReport:
    done: list[Step] = field(default_factory=list)
    failed: list[tuple[Step, str]] = field(default_factory=list)
    quarantined_instead: list[tuple[Step, str]] = field(default_factory=list)
    """Rebuilds whose records did not match the damaged block: it was quarantined instead."""


class Applier:
    def __init__(self, plan: Plan, metas: Mapping[str, BlockMeta], bucket: Bucket, index: Commands,
                 builder: Builder, clock: Callable[[], float] = time.time) -> None:
        self.plan, self.metas, self.bucket, self.index, self.builder, self.clock = (
            plan, metas, bucket, index, builder, clock)
        self.tenant = plan.tenant
        self.report = ApplyReport()

    def run(self) -> ApplyReport:
        for step in self.plan.steps:
            extra = {"tenant": self.tenant, "action": step.action, "blocks": ",".join(step.blocks),
                     "output": step.output or ""}
            try:
                getattr(self, f"_{step.action}")(step)
            except ShaleError as exc:
                self.report.failed.append((step, str(exc)))
                log.error("repair step failed; the other steps go on", extra={**extra, "error": str(exc)[:500]})
                continue
            self.report.done.append(step)
            log.info("repair step done", extra={**extra, "reason": step.reason})
        return self.report

    def _submit(self, command: ReplaceBlocks | QuarantineBlocks) -> Result:
        result = self.index.submit(command)
        if not result.ok:
            raise ShaleError(f"the metastore refused {type(command).__name__}: {result.reason}: {result.message}")
        return result

    def _mark(self, step: Step, reason: str | None = None) -> None:
        for block_id in step.blocks:
            write_deletion_mark(self.bucket, self.tenant, block_id, self.clock(), reason or REPAIR + step.reason)
            self.bucket.delete(quarantine_mark_key(self.tenant, block_id))  # a recovered quarantined block

    def _drop(self, step: Step) -> None:
        self._mark(step)
        failpoint("repair.drop.marked")
        if step.indexed:
            self._submit(ReplaceBlocks(tenant=self.tenant, sources=step.indexed, blocks=[],
                                       reason=REPAIR + step.reason))

    def _merge(self, step: Step) -> None:
        self._swap(step, BuildRequest(action="merge", output=self._output(step), attempt=step.attempt,
                                      inputs=[self.metas[b] for b in step.blocks]))

    def _rebuild(self, step: Step) -> None:
        self._swap(step, BuildRequest(action="rebuild", output=self._output(step), attempt=step.attempt,
                                      inputs=[self.metas[b] for b in step.blocks], source=step.source,
                                      source_blocks=[self.metas[b] for b in step.source_blocks]))

    @staticmethod
    def _output(step: Step) -> str:
        assert step.output is not None
        return step.output

    def _swap(self, step: Step, request: BuildRequest) -> None:
        if step.written:
            output = self.metas[request.output]  # the scan found it written
        else:
            result = self.builder.build(request)
            if result.output is None:
                self._quarantine_instead(step, result.problem)
                return
            output = result.output
        failpoint(f"repair.{step.action}.built")
        self._submit(ReplaceBlocks(tenant=self.tenant, sources=step.indexed, blocks=[output],
                                   reason=f"{REPAIR}{step.action} into {output.id}"))
        failpoint(f"repair.{step.action}.indexed")
        self._mark(step, f"{REPAIR}{step.action}d into {output.id}" if step.action == "merge"
                   else f"{REPAIR}rebuilt as {output.id}")

    def _quarantine_instead(self, step: Step, problem: str) -> None:
        self.report.quarantined_instead.append((step, problem))
        log.warning("a rebuild did not find exactly the damaged block's records; it is quarantined instead",
                    extra={"tenant": self.tenant, "block": step.blocks[0], "problem": problem})
        self._quarantine(step.model_copy(update={"reason": f"rebuild refused: {problem}"}))

    def _quarantine(self, step: Step) -> None:
        damage = [str(d) for d in step.evidence.get("damage", [])]
        for block_id in step.blocks:
            write_quarantine_mark(self.bucket, self.tenant, block_id, self.clock(), damage, step.reason)
        failpoint("repair.quarantine.marked")
        if step.indexed:
            self._submit(QuarantineBlocks(tenant=self.tenant, block_ids=step.indexed, reason=step.reason))


def apply_plan(plan: Plan, metas: Mapping[str, BlockMeta], bucket: Bucket, index: Commands,
               builder: Builder, clock: Callable[[], float] = time.time) -> ApplyReport:
    """Apply every step of ``plan`` (see the module docstring). ``metas`` holds the scan's metadata of every
    block the steps name."""
    return Applier(plan, metas, bucket, index, builder, clock).run()
