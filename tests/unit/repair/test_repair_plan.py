"""The repair planner's rules, table-tested: a pure function from one scan's facts to steps."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from tests.unit.repair.helpers import JSON, blk, block_id, facts

from shale.block import ParserInfo
from shale.repair.model import BlockFacts, KafkaPartition, Sources
from shale.repair.plan import merge_output, plan_repair, rebuild_output

KAFKA = Sources(kafka={("app", 0): KafkaPartition("inc1", 0, 10_000)}, parsers={"app": JSON})
DAMAGED = ("checksum-mismatch: records-0.parquet: CRC32 0badc0de, meta.json says 00000000",)
BAD = ("size-mismatch: records-0.parquet: 10 bytes, meta.json says 1000",)


@dataclass
class Case:
    name: str
    facts: list[BlockFacts]
    expected: list[tuple[str, list[str]]]
    """(action, block names) of every step, in plan order."""
    metastore: bool = True
    sources: Sources = KAFKA
    checks: dict[str, Any] = field(default_factory=dict)
    """More to check: ``unrecoverable`` (names), ``in_flight``, ``notes`` (substrings), ``step0`` (field values)."""


def names(ids: list[str]) -> list[str]:
    by_id = {block_id(n): n for n in [*"abcdefghijklmnopqrstuvwxyz", "aa"]}
    return [by_id.get(i, i) for i in ids]


P1 = {"dt": "2026-11-18"}
P2 = {"dt": "2026-11-19"}

CASES = [
    Case("nothing wrong: adjacent blocks", [facts(blk("a", 0, 50)), facts(blk("b", 50, 100))], []),
    Case("a block held by a larger one is dropped", [facts(blk("a", 0, 100)), facts(blk("b", 10, 20))],
         [("drop", ["b"])], checks={"step0": {"evidence.held_by": ["a"]}}),
    Case("of two equal copies the smaller id is dropped", [facts(blk("a", 0, 100)), facts(blk("b", 0, 100))],
         [("drop", ["a"])]),
    Case("a block held by two others together is dropped",
         [facts(blk("a", 0, 50)), facts(blk("b", 50, 100)), facts(blk("c", 40, 60))],
         [("drop", ["c"])], checks={"step0": {"evidence.held_by": ["a", "b"]}}),
    Case("partially overlapping blocks are merged", [facts(blk("a", 0, 60)), facts(blk("b", 40, 100))],
         [("merge", ["a", "b"])]),
    Case("a duplicate beside a partial overlap: dropped, then the rest merged",
         [facts(blk("a", 0, 60)), facts(blk("b", 40, 100)), facts(blk("c", 45, 55))],
         [("drop", ["c"]), ("merge", ["a", "b"])]),
    Case("other incarnations, generations or topics never overlap",
         [facts(blk("a", 0, 100)), facts(blk("b", 0, 100, incarnation="inc2")), facts(blk("c", 0, 100, generation=2)),
          facts(blk("d", 0, 100, topic="web"))], []),
    Case("partition-group blocks of one batch share a range",
         [facts(blk("a", 0, 100, group="partition", pv=P1, parser=JSON)),
          facts(blk("b", 0, 100, group="partition", pv=P2, parser=JSON)),
          facts(blk("c", 0, 100, group="partition", kind="quarantine"))], []),
    Case("a compaction across days is not judged by its offsets",
         [facts(blk("a", 0, 100, group="partition", pv=P1, parser=JSON)),
          facts(blk("b", 0, 200, group="partition", level=1, sources=["x", "y"], parser=JSON))], []),
    Case("records and quarantine mixed: not judged by offsets",
         [facts(blk("a", 0, 100, kinds=("records", "quarantine"), level=1, sources=["x", "y"])),
          facts(blk("b", 0, 100))], []),
    Case("a compaction output and its live sources: the sources are dropped (lineage)",
         [facts(blk("a", 0, 50)), facts(blk("b", 50, 100)), facts(blk("c", 0, 100, level=1, sources=["a", "b"]))],
         [("drop", ["a"]), ("drop", ["b"])]),
    Case("two compactions sharing a source are merged",
         [facts(blk("d", 0, 100, level=1, sources=["a", "b"])),
          facts(blk("e", 50, 150, level=1, sources=["b", "c"], incarnation="other"))],
         [("merge", ["d", "e"])]),
    Case("a block without records inside another's range is dropped",
         [facts(blk("a", 0, 100)), facts(blk("b", 10, 20, kind=None))], [("drop", ["b"])]),
    Case("a damaged block held by a healthy one is dropped, never kept as a holder",
         [facts(blk("a", 0, 100), damage=DAMAGED), facts(blk("b", 0, 100))], [("drop", ["a"])]),
    Case("two damaged copies with nothing else: neither holds the other",
         [facts(blk("a", 0, 100), damage=DAMAGED), facts(blk("b", 0, 100), damage=DAMAGED)],
         [("rebuild", ["a"]), ("rebuild", ["b"])]),
    Case("a damaged backup block is rebuilt from Kafka", [facts(blk("a", 0, 100), damage=DAMAGED)],
         [("rebuild", ["a"])], checks={"step0": {"source": "kafka", "output": rebuild_output(blk("a", 0, 100), 0)}}),
    Case("a damaged partition block is re-parsed from the backup group",
         [facts(blk("a", 0, 100, group="partition", pv=P1, parser=JSON), damage=DAMAGED),
          facts(blk("b", 0, 60)), facts(blk("c", 60, 120)), facts(blk("d", 200, 300))],
         [("rebuild", ["a"])], checks={"step0": {"source": "backup", "source_blocks": ["b", "c"]}}),
    Case("a damaged partition block whose topic's parser changed is quarantined",
         [facts(blk("a", 0, 100, group="partition", pv=P1, parser=JSON), damage=DAMAGED), facts(blk("b", 0, 100))],
         [("quarantine", ["a"])],
         sources=Sources(kafka=KAFKA.kafka, parsers={"app": ParserInfo(name="json", version="2",
                                                                       options_digest="d1")}),
         checks={"unrecoverable": ["a"], "why": "reprocess"}),
    Case("Kafka deleted the offsets and no backup holds them: quarantined, listed unrecoverable",
         [facts(blk("a", 0, 100), damage=DAMAGED)], [("quarantine", ["a"])],
         sources=Sources(kafka={("app", 0): KafkaPartition("inc1", 50, 10_000)}), checks={"unrecoverable": ["a"]}),
    Case("the topic was recreated: its records are not the block's",
         [facts(blk("a", 0, 100), damage=DAMAGED)], [("quarantine", ["a"])],
         sources=Sources(kafka={("app", 0): KafkaPartition("inc9", 0, 10_000)}),
         checks={"why": "incarnation", "unrecoverable": ["a"]}),
    Case("Kafka did not answer: quarantined, and the plan says to run again",
         [facts(blk("a", 0, 100), damage=BAD)], [("quarantine", ["a"])], sources=Sources(kafka_error="timed out"),
         checks={"why": "timed out"}),
    Case("an indexed block with no object in the bucket is rebuilt",
         [facts(blk("a", 0, 100), "absent", damage=("missing-object: no object",))], [("rebuild", ["a"])]),
    Case("an uncommitted block held by committed ones is dropped (no index command)",
         [facts(blk("a", 0, 100)), facts(blk("b", 10, 90), indexed=False, unclaimed="offsets committed")],
         [("drop", ["b"])], checks={"step0": {"indexed": []}}),
    Case("an uncommitted block with records held nowhere is left to the leader's scan",
         [facts(blk("a", 0, 100)), facts(blk("b", 50, 150), indexed=False, unclaimed="offsets committed")],
         [], checks={"notes": ["leader's bucket scan"]}),
    Case("a block a commit may still claim is in flight, never judged",
         [facts(blk("a", 0, 100)), facts(blk("b", 0, 100), indexed=False)], [], checks={"in_flight": 1}),
    Case("a tombstoned block without a mark gets one",
         [facts(blk("a", 0, 100), indexed=False, tombstoned="compacted into x")], [("mark", ["a"])]),
    Case("an indexed block marked by retention is left to the metastore, and holds nothing for others",
         [facts(blk("a", 0, 100), "marked-for-deletion", mark="retention"), facts(blk("b", 10, 20))],
         [], checks={"notes": ["retention"]}),
    Case("an indexed block a stopped repair marked is dropped again",
         [facts(blk("a", 0, 100)), facts(blk("b", 10, 20), "marked-for-deletion", mark="repair: its records are in a")],
         [("drop", ["b"])], checks={"step0": {"indexed": ["b"]}}),
    Case("a quarantined block still indexed is taken out of the index",
         [facts(blk("a", 0, 100), "quarantined", damage=DAMAGED, quarantine="bad")], [("quarantine", ["a"])],
         sources=Sources(kafka={}), checks={"unrecoverable": ["a"]}),
    Case("a quarantined block whose records Kafka holds again is rebuilt",
         [facts(blk("a", 0, 100), "quarantined", indexed=False, damage=DAMAGED, quarantine="bad")],
         [("rebuild", ["a"])], checks={"step0": {"indexed": []}}),
    Case("a quarantined block no longer indexed and still unrecoverable: nothing to do",
         [facts(blk("a", 0, 100), "quarantined", indexed=False, damage=DAMAGED, quarantine="bad")], [],
         sources=Sources(kafka={}), checks={"unrecoverable": ["a"]}),
    Case("without the metastore every complete unmarked block counts; overlapped sources are dropped",
         [facts(blk("a", 0, 50), "healthy-overlapped", indexed=False),
          facts(blk("b", 0, 100, level=1, sources=["a", "z"]), indexed=False),
          facts(blk("c", 0, 100), "fresh", indexed=False)],
         [("drop", ["a"])], metastore=False, checks={"in_flight": 1, "step0": {"indexed": []}}),
]


def _get(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
    return obj


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_planner_rules(case: Case) -> None:
    plan = plan_repair("acme", case.facts, metastore=case.metastore, sources=case.sources)
    assert [(s.action, names(s.blocks)) for s in plan.steps] == case.expected, plan.model_dump_json(indent=1)
    for key, want in case.checks.get("step0", {}).items():
        got = _get(plan.steps[0], key)
        assert (names(got) if isinstance(got, list) else got) == want, key
    if "unrecoverable" in case.checks:
        assert names([u["block"] for u in plan.unrecoverable]) == case.checks["unrecoverable"]
    else:
        assert plan.unrecoverable == []
    if "why" in case.checks:
        assert case.checks["why"] in plan.steps[0].reason if plan.steps else plan.unrecoverable[0]["why"]
    assert plan.in_flight == case.checks.get("in_flight", 0)
    for note in case.checks.get("notes", []):
        assert any(note in n for n in plan.notes), plan.notes
    # Never a step that deletes records no other block holds: every drop names its holders.
    for step in plan.steps:
        if step.action == "drop":
            assert step.evidence["held_by"]


def test_a_merge_output_already_written_is_reused_and_a_marked_one_never() -> None:
    a, b = blk("a", 0, 60), blk("b", 40, 100)
    first = merge_output([a, b], 0)
    written = plan_repair("acme", [facts(a), facts(b), facts(_named(first, 0, 100), indexed=False,
                                                                  unclaimed="no job")],
                          metastore=True, sources=KAFKA)
    assert [(s.action, s.output, s.attempt, s.written) for s in written.steps] == [("merge", first, 0, True)]
    assert written.notes == []  # the earlier run's output is not judged as an uncommitted block
    collected = plan_repair("acme", [facts(a), facts(b), facts(_named(first, 0, 100), "marked-for-deletion",
                                                                indexed=False, mark="uncommitted")],
                            metastore=True, sources=KAFKA)
    assert [(s.output, s.attempt, s.written) for s in collected.steps] == [(merge_output([a, b], 1), 1, False)]


def test_a_rebuild_output_marked_by_the_leader_is_not_reused() -> None:
    a = blk("a", 0, 100)
    first = rebuild_output(a, 0)
    plan = plan_repair("acme", [facts(a, damage=DAMAGED), facts(_named(first, 0, 100), "marked-for-deletion",
                                                                    indexed=False, mark="uncommitted")],
                       metastore=True, sources=KAFKA)
    assert [(s.action, s.output, s.attempt) for s in plan.steps] == [("rebuild", rebuild_output(a, 1), 1)]


def _named(block: str, start: int, end: int) -> Any:
    meta = blk("z", start, end, level=1)
    return meta.model_copy(update={"id": block})
