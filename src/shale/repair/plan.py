"""The repair planner: pure, from the facts of one scan to steps (table-tested in tests/unit/repair).

Which blocks it judges:

* *committed* blocks: with the metastore, those the index holds (whatever the bucket shows: an index entry with
  damaged or missing objects is damage); without it, every complete unmarked block;
* *uncommitted* blocks (with the metastore only): not indexed, not tombstoned, and no commit can claim them any
  more (``garbage.unclaimed``). Blocks a commit may still claim are in flight and never touched;
* *quarantined* blocks: judged again, in case their records can be recovered now.

Rules, in this order:

1. **Duplicates.** Committed blocks are taken largest first (rows, then level, then the greater id); one whose
   records the blocks kept before it hold (``overlap.Holders``: by lineage, or by offsets within one scope) is
   dropped, the others are kept. Kept blocks are never dropped later, so every dropped block's records are in a
   kept one. A damaged block is never kept as a holder.
2. **Partial overlaps.** Kept blocks that may hold one record twice (``overlap.overlaps``) are merged, per
   connected group, into one deduplicated block whose lineage names them all.
3. **Damage.** A damaged block that no kept block holds is rebuilt from the backup group (a partition-group
   block: its records re-parsed, as reprocess does, by the parser that parsed them) or from Kafka (the same
   offsets of the same topic incarnation, still there); otherwise it is quarantined, and if its records are
   nowhere else it is listed as unrecoverable. Nothing is ever deleted that is not held elsewhere.
4. **Uncommitted blocks** held by committed blocks are dropped; the others are left to the leader's bucket scan.
5. Tombstoned blocks without a deletion mark get one (the index removed them; bucket readers must skip them too).

A merge or rebuild writes a block with a deterministic id (the inputs and an attempt number), so a run that
stopped after writing it finds it and goes on; an attempt whose output was marked since (by the leader's scan,
which collects uncommitted blocks) is never reused: the next attempt number is taken.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from shale.block import (
    BlockMeta,
    BlockState,
    Holders,
    KafkaRange,
    Scope,
    deterministic_block_id,
    overlaps,
    scopes,
    spans,
)
from shale.compactor import output_id
from shale.repair.model import ABSENT, REPAIR, BlockFacts, Plan, Sources, Step

LIVE = (BlockState.HEALTHY.value, BlockState.HEALTHY_OVERLAPPED.value)
KAFKA_UNKNOWN = "Kafka could not be asked"
ORDER = {"mark": 0, "drop": 1, "merge": 2, "rebuild": 3, "quarantine": 4}


def ranges_of(meta: BlockMeta) -> list[str]:
    return [_range(r) for r in meta.kafka if r.end > r.start]


def _range(r: KafkaRange) -> str:
    return f"{r.topic}[{r.partition}] [{r.start},{r.end})" + (f" incarnation {r.incarnation}" if r.incarnation else "")


def merge_output(inputs: Sequence[BlockMeta], attempt: int) -> str:
    return output_id(list(inputs), f"repair-{attempt}", 0)


def rebuild_output(block: BlockMeta, attempt: int) -> str:
    return deterministic_block_id(block.time_ms, f"repair/rebuild/{block.id}/{attempt}")


def _attempt(facts: dict[str, BlockFacts], make: Callable[[int], str]) -> tuple[int, str, bool]:
    """The first attempt whose output is unspoiled: (attempt, id, already written)."""
    attempt = 0
    while True:
        out = make(attempt)
        found = facts.get(out)
        if found is None:
            return attempt, out, False
        spoiled = found.mark is not None or found.quarantine is not None or found.tombstoned is not None \
            or bool(found.damage)
        if not spoiled:
            return attempt, out, found.meta is not None and found.state != BlockState.PARTIAL.value
        attempt += 1


class _Planner:
    def __init__(self, tenant: str, facts: Sequence[BlockFacts], metastore: bool, sources: Sources) -> None:
        self.plan = Plan(tenant=tenant, metastore=metastore)
        self.facts = {f.id: f for f in facts}
        self.metastore = metastore
        self.sources = sources
        self.scope_of = scopes(f.meta for f in facts if f.meta is not None)
        self.holders = Holders(self.scope_of)
        self.kept: list[BlockMeta] = []
        self.outputs: set[str] = set()

    def step(self, action: str, f: BlockFacts | list[BlockFacts], reason: str, **fields: Any) -> None:
        blocks = f if isinstance(f, list) else [f]
        self.plan.steps.append(Step.model_validate({
            "action": action, "blocks": [b.id for b in blocks], "reason": reason,
            "indexed": [b.id for b in blocks if b.indexed], **fields}))

    def classify(self) -> tuple[list[BlockFacts], list[BlockFacts], list[BlockFacts]]:
        committed, uncommitted, quarantined = [], [], []
        for f in sorted(self.facts.values(), key=lambda f: f.id):
            if f.state == BlockState.QUARANTINED.value:
                quarantined.append(f)
            elif not self.metastore:
                if f.state in LIVE and f.meta is not None:
                    committed.append(f)
                elif f.state == BlockState.FRESH.value:
                    self.plan.in_flight += 1
            elif f.indexed:
                if f.meta is None:
                    self.plan.notes.append(f"{f.id}: indexed, but neither the bucket nor the index has its metadata")
                elif f.mark is not None and not f.mark.startswith(REPAIR):
                    self.plan.notes.append(f"{f.id}: indexed and marked for deletion ({f.mark}): left to the "
                                           "metastore, which removes it")
                else:
                    committed.append(f)
            elif f.tombstoned is not None:
                if f.mark is None and f.state != BlockState.PARTIAL.value:
                    self.step("mark", f, f"the index removed it ({f.tombstoned}); bucket readers must skip it too",
                              evidence={"tombstone": f.tombstoned, "objects": list(f.objects)})
            elif f.state == BlockState.FRESH.value or (f.state in LIVE and f.unclaimed is None):
                self.plan.in_flight += 1
            elif f.state in LIVE and f.meta is not None:
                uncommitted.append(f)
        return committed, uncommitted, quarantined

    def duplicates(self, committed: list[BlockFacts]) -> list[BlockFacts]:
        """Rule 1; returns the damaged blocks no kept block holds."""
        healthy = sorted((f for f in committed if not f.damage), key=lambda f: f.id, reverse=True)
        healthy.sort(key=lambda f: (-(f.meta.rows if f.meta else 0), -(f.meta.level if f.meta else 0)))
        for f in healthy:
            assert f.meta is not None
            if covers := self.holders.held(f.meta):
                self.drop(f, covers)
            else:
                self.holders.add(f.meta)
                self.kept.append(f.meta)
        damaged = []
        for f in (f for f in committed if f.damage):
            assert f.meta is not None
            if covers := self.holders.held(f.meta):
                self.drop(f, covers)
            else:
                damaged.append(f)
        return damaged

    def drop(self, f: BlockFacts, covers: list[str], why: str = "") -> None:
        assert f.meta is not None
        held = " and ".join(covers)
        reason = why or f"its records are all in {held}"
        evidence: dict[str, Any] = {"held_by": covers, "ranges": ranges_of(f.meta),
                                    "held_by_ranges": {c: ranges_of(self._meta(c)) for c in covers},
                                    "objects": list(f.objects)}
        if f.damage:
            evidence["damage"] = list(f.damage)
        self.step("drop", f, reason, evidence=evidence)

    def _meta(self, block_id: str) -> BlockMeta:
        meta = self.facts[block_id].meta
        assert meta is not None
        return meta

    def merges(self) -> None:
        """Rule 2."""
        parent = {m.id: m.id for m in self.kept}

        def root(x: str) -> str:
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        found = overlaps(self.kept)
        for o in found:
            parent[root(o.first)] = root(o.second)
        groups: dict[str, list[str]] = defaultdict(list)
        for block_id in parent:
            groups[root(block_id)].append(block_id)
        for members in sorted(sorted(g) for g in groups.values() if len(g) > 1):
            inputs = [self._meta(m) for m in members]
            attempt, out, written = _attempt(self.facts, functools.partial(merge_output, inputs))
            self.outputs.add(out)
            details = [o.detail for o in found if o.first in members]
            self.step("merge", [self.facts[m] for m in members],
                      f"they may hold the same records ({len(details)} overlaps); one block holds each record once",
                      output=out, attempt=attempt, written=written,
                      evidence={"inputs": {m.id: ranges_of(m) for m in inputs}, "overlaps": details})

    def recover(self, f: BlockFacts, quarantined: bool = False) -> None:
        """Rule 3, for a damaged committed block or a quarantined one."""
        meta = f.meta
        if meta is None:
            return  # a quarantined block whose meta.json cannot be read: nothing to judge it by
        if covers := self.holders.held(meta):
            self.drop(f, covers)
            return
        source, source_blocks, why = self._source(meta)
        evidence: dict[str, Any] = {"damage": list(f.damage), "ranges": ranges_of(meta), "objects": list(f.objects)}
        if source is not None and not (quarantined and not f.damage):
            attempt, out, written = _attempt(self.facts, functools.partial(rebuild_output, meta))
            self.outputs.add(out)
            where = {"backup": f"the backup group's blocks {', '.join(source_blocks)} (re-parsed)",
                     "kafka": "Kafka (the same offsets of the same topic incarnation)",
                     "none": "its ranges alone (it held no records)"}[source]
            self.step("rebuild", f, f"its objects are damaged; its records are rebuilt from {where}", output=out,
                      attempt=attempt, written=written, source=source, source_blocks=source_blocks,
                      evidence=evidence)
            return
        lost = {"block": f.id, "ranges": ranges_of(meta), "damage": list(f.damage), "why": why,
                "quarantined": quarantined}
        if quarantined:
            if f.indexed:
                self.step("quarantine", f, f"quarantined; the index must stop serving it ({f.quarantine})",
                          evidence=evidence)
            if not f.damage:
                self.plan.notes.append(f"{f.id}: quarantined, but its objects check out now; remove its quarantine "
                                       "mark to let readers see it again")
            elif self.sources.kafka is not None or KAFKA_UNKNOWN not in why:
                self.plan.unrecoverable.append(lost)
            return
        if self.sources.kafka is not None or KAFKA_UNKNOWN not in why:
            self.plan.unrecoverable.append(lost)  # its records are nowhere else (not: Kafka could not be asked)
        self.step("quarantine", f, f"its objects are damaged and {why}: readers skip it, nothing deletes it",
                  evidence={**evidence, "why": why})

    def _source(self, meta: BlockMeta) -> tuple[str | None, list[str], str]:
        """Where the block's records can be rebuilt from: ("backup" | "kafka" | "none", backup blocks, ""), or
        (None, [], why not)."""
        if meta.rows == 0:
            return "none", [], ""
        scope = self.scope_of.get(meta.id)
        if scope is None:
            return None, [], ("its Kafka ranges do not say which of their records it holds (datasets of several "
                              "kinds, or fewer partition values than its partition's), so it cannot be rebuilt "
                              "exactly")
        if meta.group == "partition":
            if scope.kind == "records" and (why := self._parser_changed(meta)):
                return None, [], why
            if backup := self._backup(meta):
                return "backup", backup, ""
        kafka = self.sources.kafka
        if kafka is None:
            return None, [], (f"{KAFKA_UNKNOWN} ({self.sources.kafka_error or 'not reachable'}); "
                              "run the repair again when it answers")
        for r in (r for r in meta.kafka if r.end > r.start):
            now_at = kafka.get((r.topic, r.partition))
            if not r.incarnation:
                return None, [], f"{_range(r)}: its topic incarnation was not recorded, so Kafka's records cannot be " \
                                 "known to be the same"
            if now_at is None or now_at.incarnation != r.incarnation:
                return None, [], f"{_range(r)}: that topic incarnation is gone from Kafka"
            if now_at.earliest > r.start or now_at.end < r.end:
                return None, [], (f"{_range(r)}: Kafka holds only [{now_at.earliest},{now_at.end}) of that partition "
                                  "now, and no backup-group block holds them")
        return "kafka", [], ""

    def _parser_changed(self, meta: BlockMeta) -> str:
        """Why re-parsing the block's records would not give the same rows: its topic's parser is not the one
        that parsed them ("" if it is)."""
        for topic in sorted({d.topic for d in meta.datasets}):
            now = self.sources.parsers.get(topic)
            if meta.parser is None or now != meta.parser:
                then = f"{meta.parser.name} {meta.parser.version}" if meta.parser else "several parsers"
                current = now if isinstance(now, str) else f"{now.name} {now.version}" if now else "unknown"
                return (f"its records were parsed by {then}, and topic {topic}'s parser now is {current}; "
                        "`shale reprocess` re-parses the backup group into a new generation")
        return ""

    def _backup(self, meta: BlockMeta) -> list[str]:
        """Kept backup-group blocks of records that together hold every offset of the block's ranges."""
        backup = [m for m in self.kept if m.group == "backup"
                  and isinstance(s := self.scope_of.get(m.id), Scope) and s.kind == "records"]
        union = spans(backup)
        for r in (r for r in meta.kafka if r.end > r.start):
            if not any(s <= r.start and r.end <= e for s, e in union.get((r.topic, r.partition, r.incarnation), [])):
                return []
        wanted = [r for r in meta.kafka if r.end > r.start]
        return sorted(m.id for m in backup if any(
            (q.topic, q.partition, q.incarnation) == (r.topic, r.partition, r.incarnation)
            and q.start < r.end and r.start < q.end for q in m.kafka for r in wanted))

    def uncommitted(self, blocks: list[BlockFacts]) -> None:
        """Rule 4."""
        for f in blocks:
            if f.id in self.outputs:
                continue
            assert f.meta is not None
            if covers := self.holders.held(f.meta):
                self.drop(f, covers, f"not committed ({f.unclaimed}), and its records are all in committed "
                                     f"{' and '.join(covers)}")
            else:
                self.plan.notes.append(f"{f.id}: not committed ({f.unclaimed}); holds records no committed block "
                                       "holds; the leader's bucket scan collects it")


def plan_repair(tenant: str, facts: Sequence[BlockFacts], *, metastore: bool, sources: Sources) -> Plan:
    """The repair plan for one tenant's blocks (see the module docstring). Pure and deterministic."""
    planner = _Planner(tenant, facts, metastore, sources)
    committed, uncommitted, quarantined = planner.classify()
    damaged = planner.duplicates(committed)
    planner.merges()
    for f in damaged:
        planner.recover(f)
    for f in quarantined:
        planner.recover(f, quarantined=True)
    planner.uncommitted(uncommitted)
    planner.plan.steps.sort(key=lambda s: (ORDER[s.action], s.blocks))
    return planner.plan


__all__ = ["ABSENT", "merge_output", "plan_repair", "rebuild_output"]
