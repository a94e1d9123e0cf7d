"""Restore over topic incarnations, compaction merges, retention, ``--until`` and offset translation: named cases
and a stateful model. The blocks are real (an in-memory bucket, the block writer, the compactor's merge); the
target is ``StubKafka``. A restore gives back exactly the records the model says, or stops naming why."""

from __future__ import annotations

import uuid
from collections import defaultdict
from dataclasses import dataclass

import pyarrow as pa
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from tests.factories import BASE_MS
from tests.unit.restore.kafka_stub import Killed, StubKafka, StubProducer

from shale.block import BlockMeta, BlockSpec, DatasetInput, KafkaRange, deterministic_block_id, write_block
from shale.block.schemas import BACKUP_SCHEMA
from shale.compactor.merge import merge_blocks, merge_ranges
from shale.config import BucketConfig
from shale.objstore import task_bucket
from shale.restore import RestoreRange, build_plan
from shale.restore.job import RestoreRequest, partition_work
from shale.restore.offsets import anchored_offset, records_between, translate
from shale.restore.plan import RestorePlan
from shale.restore.task import PartitionOutcome, restore_partition

TOPIC, TARGET = "app", "restored"
INCARNATIONS = ["A" * 22, "B" * 22, "C" * 22]


@dataclass(frozen=True)
class Record:
    incarnation: str
    partition: int
    offset: int
    time_ms: int

    @property
    def value(self) -> bytes:
        return f"{self.incarnation[0]}/{self.partition}/{self.offset}".encode()


def write_records(config: BucketConfig, records: list[Record], ranges: list[KafkaRange], seed: str) -> BlockMeta:
    """A level-0 backup block holding ``records`` and accounting for ``ranges``."""
    n = len(records)
    table = pa.table({
        "topic": [TOPIC] * n, "partition": pa.array([r.partition for r in records], pa.int32()),
        "offset": pa.array([r.offset for r in records], pa.int64()),
        "timestamp": pa.array([r.time_ms for r in records], pa.timestamp("ms", tz="UTC")),
        "timestamp_type": pa.array([0] * n, pa.int8()), "key": [r.value for r in records],
        "value": [r.value for r in records],
        "headers": pa.array([None] * n, BACKUP_SCHEMA.field("headers").type)}, schema=BACKUP_SCHEMA)
    spec = BlockSpec(id=deterministic_block_id(min(r.time_ms for r in records), seed), tenant="acme",
                     group="backup", kafka=ranges)
    return write_block(task_bucket(config), spec, [DatasetInput("records", TOPIC, table, "timestamp",
                                                                labels=[{"topic": TOPIC}])])


def restore(config: BucketConfig, blocks: list[BlockMeta], incarnation: str, *, until_ms: int | None = None,
            recorded: set[int] | frozenset[int] = frozenset(), target: StubKafka | None = None,
            commit_every: int = 3, kill_after: int | None = None
            ) -> tuple[RestorePlan, dict[int, PartitionOutcome], StubKafka]:
    """Plan and run a restore of ``incarnation`` into ``target`` (a new empty one by default). With
    ``kill_after``, each partition's task dies after sending that many records and the restore runs again."""
    target = target or StubKafka()
    plan = build_plan(blocks, tenant="acme", topic=TOPIC, incarnation=incarnation, target_partitions=None,
                      range_=RestoreRange(until_ms=until_ms), recorded=recorded)
    request = RestoreRequest(tenant="acme", topic=TOPIC, target_topic=TARGET, commit_every=commit_every)
    outcomes = {}
    for p in plan.partitions:
        if p.end > p.start or p.gaps:
            work = partition_work("job", plan, p, request)
            if kill_after is not None:
                producer = StubProducer(target, kill_after)
                try:
                    restore_partition(work, producer, target.progress("job").get(p.partition, (p.start, 0)),
                                      config)
                except Killed:
                    producer.fence()
            progress = target.progress("job").get(p.partition, (p.start, 0))
            outcomes[p.partition] = restore_partition(work, StubProducer(target), progress, config)
    return plan, outcomes, target


def restored(target: StubKafka, partition: int) -> list[bytes]:
    return [e.value or b"" for e in target.committed(TARGET, partition)
            if e.key != b"other"]


@pytest.fixture
def config() -> BucketConfig:
    return BucketConfig(url=f"memory://{uuid.uuid4().hex}")


def records(incarnation: str, partition: int, offsets: range, t0: int) -> list[Record]:
    return [Record(incarnation, partition, o, BASE_MS + t0 + 1000 * i) for i, o in enumerate(offsets)]


def test_case6_a_block_merged_from_two_incarnations_restores_only_the_chosen_one(config: BucketConfig) -> None:
    """Incarnation A's records sit at offsets 0-4 of a range [0, 10) (the rest were transaction markers); the
    recreated topic B wrote offsets 5-7. Compaction merged both blocks: the ranges intersect. A restore of A sends
    A's records only, a restore of B sends B's, each complete."""
    a, b = INCARNATIONS[:2]
    old = records(a, 0, range(5), 0)
    new = records(b, 0, range(5, 8), 100_000)
    blocks = [write_records(config, old, [KafkaRange(topic=TOPIC, partition=0, start=0, end=10, incarnation=a)], "a"),
              write_records(config, new, [KafkaRange(topic=TOPIC, partition=0, start=5, end=8, incarnation=b)], "b")]
    merged = merge_blocks(task_bucket(config), blocks, job="j", token=1, level=0).output
    for incarnation, want in ((a, old), (b, new)):
        _, outcomes, target = restore(config, [merged], incarnation)
        assert restored(target, 0) == [r.value for r in want]
        assert outcomes[0].error == ""


def test_case6_colliding_offsets_of_two_incarnations_restore_each_one(config: BucketConfig) -> None:
    """Both incarnations wrote offsets 0-4 and compaction merged their blocks, then merged the result again with a
    newer block: each restore gives back its own incarnation's records, none of the other's, and no "corrupt
    block"."""
    a, b = INCARNATIONS[:2]
    old, new = records(a, 0, range(5), 0), records(b, 0, range(5), 100_000)
    newer = records(b, 0, range(5, 7), 200_000)
    blocks = [write_records(config, rows, [KafkaRange(topic=TOPIC, partition=0, start=rows[0].offset,
                                                      end=rows[-1].offset + 1, incarnation=rows[0].incarnation)],
                            seed) for rows, seed in ((old, "a"), (new, "b"), (newer, "c"))]
    merged = merge_blocks(task_bucket(config), blocks[:2], job="j", token=1, level=0).output
    again = merge_blocks(task_bucket(config), [merged, blocks[2]], job="k", token=1, level=1).output
    for incarnation, want in ((a, old), (b, new + newer)):
        _, outcomes, target = restore(config, [again], incarnation)
        assert restored(target, 0) == [r.value for r in want]
        assert outcomes[0].error == ""


def test_case6_a_block_that_cannot_tell_whose_a_row_is_stops_naming_both(config: BucketConfig) -> None:
    """A block merged before compaction named each row's incarnation: where both incarnations' ranges cover a row,
    nothing is sent as either; the partition stops there naming the block and the other incarnation."""
    a, b = INCARNATIONS[:2]
    old, new = records(a, 0, range(5), 0), records(b, 0, range(3, 6), 100_000)
    legacy = write_records(config, old + new, [KafkaRange(topic=TOPIC, partition=0, start=0, end=5, incarnation=a),
                                               KafkaRange(topic=TOPIC, partition=0, start=3, end=6, incarnation=b)],
                           "legacy")
    _, outcomes, target = restore(config, [legacy], a)
    assert restored(target, 0) == [r.value for r in old[:3]]
    assert "do not say whose" in outcomes[0].error
    assert repr(b) in outcomes[0].error
    assert "corrupt" not in outcomes[0].error


def test_case7_the_source_partition_count_comes_from_the_recorded_offsets(config: BucketConfig) -> None:
    """Partition 2's blocks expired: the plan still counts three source partitions (the metastore recorded
    commits of partition 2), so the created target has three and each record keeps its partition."""
    a = INCARNATIONS[0]
    blocks = [write_records(config, records(a, p, range(3), 0),
                            [KafkaRange(topic=TOPIC, partition=p, start=0, end=3, incarnation=a)], f"p{p}")
              for p in (0, 1)]
    plan, _, _ = restore(config, blocks, a, recorded={0, 1, 2})
    assert plan.mapping.source_partitions == 3
    assert not plan.mapping.by_key


def test_case8_until_reached_before_a_gap_is_done(config: BucketConfig) -> None:
    """Offsets 0-9 are backed up, 10-14 are lost, --until falls at offset 5: the partition is done, with no error,
    and says where it stopped."""
    a = INCARNATIONS[0]
    rows = records(a, 0, range(10), 0)
    blocks = [write_records(config, rows, [KafkaRange(topic=TOPIC, partition=0, start=0, end=10, incarnation=a)],
                            "a"),
              write_records(config, records(a, 0, range(15, 20), 50_000),
                            [KafkaRange(topic=TOPIC, partition=0, start=15, end=20, incarnation=a)], "b")]
    _, outcomes, target = restore(config, blocks, a, until_ms=rows[5].time_ms)
    assert restored(target, 0) == [r.value for r in rows[:5]]
    assert outcomes[0].error == ""
    assert outcomes[0].reached_until
    assert outcomes[0].next == 5


def test_case8_offsets_translate_by_what_the_restore_wrote(config: BucketConfig) -> None:
    """The target held 7 records before the restore, another producer wrote between the restored ones, and
    retention then removed the first restored records: a group at source offset S resumes at the first record
    restored from S on."""
    a = INCARNATIONS[0]
    rows = records(a, 0, range(0, 40, 2), 0)  # offsets 0, 2, 4, ...: Kafka offsets are not contiguous
    blocks = [write_records(config, rows, [KafkaRange(topic=TOPIC, partition=0, start=0, end=40, incarnation=a)],
                            "a")]
    target = StubKafka(interleave=4)
    for _ in range(7):
        target.append(TARGET, 0, b"other", b"before", "committed")
    plan, _, target = restore(config, blocks, a, target=target)
    target.retain_from(TARGET, 0, 12)
    where = {e.value: e.offset for e in target.committed(TARGET, 0)}
    for source in (0, 7, 8, 21, 38, 39, 40):
        got = anchored_offset(target.anchors("job")[0], source,
                              lambda lo, hi: records_between(plan, config, 0, lo, hi))
        first = next((r for r in rows if r.offset >= source), None)
        if first is None:
            assert got == max(e.offset for e in target.logs[(TARGET, 0)] if e.value == rows[-1].value) + 1
        elif first.value in where:
            assert got == where[first.value]


def test_translation_reads_no_block_past_where_the_restore_stopped(config: BucketConfig) -> None:
    """Found by the state machine: incarnation B's partition stopped at a row a legacy merged block could not
    attribute; translating a group position beyond it read that block again and raised. The translation counts
    the backup's records only below the job's progress, where the restore itself read them."""
    b, c = INCARNATIONS[1:]
    first = records(b, 1, range(1), 0)
    legacy = write_records(config, records(b, 1, range(1, 2), 1000) + records(c, 1, range(1), 2000),
                           [KafkaRange(topic=TOPIC, partition=1, start=1, end=2, incarnation=b),
                            KafkaRange(topic=TOPIC, partition=1, start=0, end=2, incarnation=c)], "legacy")
    blocks = [write_records(config, first, [KafkaRange(topic=TOPIC, partition=1, start=0, end=1, incarnation=b)],
                            "first"), legacy]
    plan, outcomes, target = restore(config, blocks, b)
    assert restored(target, 1) == [first[0].value]
    assert "do not say whose" in outcomes[1].error
    done = {p: n for p, (n, _) in target.progress("job").items()}
    got = translate(plan, config, {}, TARGET, {1: 2}, anchors=target.anchors("job"), restored=done)
    assert got == {1: target.committed(TARGET, 1)[0].offset + 1}


class RestoreModel(RuleBasedStateMachine):
    """A topic of three partitions, deleted and recreated; ingest writes blocks, compaction merges them, retention
    deletes the oldest; a restore of any incarnation, any --until, into a target that holds records already."""

    def __init__(self) -> None:
        super().__init__()
        self.config = BucketConfig(url=f"memory://{uuid.uuid4().hex}")
        self.blocks: list[BlockMeta] = []
        self.truth: dict[str, list[tuple[Record, bool]]] = {}
        """Per live block id: the records it holds, and whether it names each one's incarnation."""
        self.incarnation = 0
        self.next: dict[tuple[str, int], int] = defaultdict(int)
        self.recorded: dict[str, set[int]] = defaultdict(set)
        self.clock = 0
        self.seq = 0

    @initialize()
    def start(self) -> None:
        self.incarnation = 0

    @rule(partition=st.integers(0, 2), count=st.integers(1, 4), markers=st.integers(0, 2),
          lost=st.sampled_from([0, 0, 0, 2]))
    def ingest(self, partition: int, count: int, markers: int, lost: int) -> None:
        """A batch of ``count`` records ``markers`` offsets apart; ``lost`` offsets before it were deleted by Kafka
        before they were read (an acknowledged loss: a gap in the backup)."""
        inc = INCARNATIONS[self.incarnation]
        start = self.next[(inc, partition)] + (lost if self.next[(inc, partition)] else 0)
        rows = []
        for i in range(count):
            self.clock += 1000
            rows.append(Record(inc, partition, start + i * (markers + 1), BASE_MS + self.clock))
        end = rows[-1].offset + 1 + markers
        self.seq += 1
        meta = write_records(self.config, rows, [KafkaRange(topic=TOPIC, partition=partition, start=start, end=end,
                                                            incarnation=inc)], f"{self.seq}")
        self.next[(inc, partition)] = end
        self.recorded[inc].add(partition)
        self.blocks.append(meta)
        self.truth[meta.id] = [(r, True) for r in rows]

    @precondition(lambda self: self.incarnation < len(INCARNATIONS) - 1)
    @rule()
    def recreate(self) -> None:
        self.incarnation += 1

    @precondition(lambda self: len(self.blocks) >= 2)
    @rule(data=st.data())
    def compact(self, data: st.DataObject) -> None:
        picked = data.draw(st.lists(st.sampled_from(self.blocks), min_size=2, max_size=3, unique_by=lambda m: m.id))
        self.seq += 1
        merged = merge_blocks(task_bucket(self.config), picked, job=f"j{self.seq}", token=1,
                              level=max(m.level for m in picked)).output
        self.truth[merged.id] = [row for m in picked for row in self.truth.pop(m.id)]
        self.blocks = [m for m in self.blocks if m not in picked] + [merged]

    @precondition(lambda self: len(self.blocks) >= 3)
    @rule()
    def expire(self) -> None:
        oldest = min(self.blocks, key=lambda m: (m.min_time, m.id))
        self.blocks.remove(oldest)
        del self.truth[oldest.id]

    @precondition(lambda self: len(self.blocks) >= 2)
    @rule(data=st.data())
    def legacy_merge(self, data: st.DataObject) -> None:
        """A block merged by a compactor that did not name rows' incarnations: the merged ranges only."""
        pairs = [(a, b) for i, a in enumerate(self.blocks) for b in self.blocks[i + 1:]
                 if {(k.partition, k.incarnation) for k in a.kafka} != {(k.partition, k.incarnation) for k in b.kafka}
                 and {k.partition for k in a.kafka} & {k.partition for k in b.kafka}]
        if not pairs:
            return
        picked = list(data.draw(st.sampled_from(pairs)))  # two incarnations (or ranges) of one partition
        rows = [r for m in picked for r, _ in self.truth[m.id]]
        ranges = merge_ranges([k for m in picked for k in m.kafka])
        if len({(r.incarnation, r.partition, r.offset) for r in rows}) < len(rows) or any(
                not named for m in picked for _, named in self.truth[m.id]):
            return
        self.seq += 1
        meta = write_records(self.config, rows, ranges, f"legacy{self.seq}")
        for m in picked:
            del self.truth[m.id]
        self.truth[meta.id] = [(r, len({k.incarnation for k in ranges if k.partition == r.partition
                                        and k.start <= r.offset < k.end}) == 1) for r in rows]
        self.blocks = [m for m in self.blocks if m not in picked] + [meta]

    def expected(self, inc: str, partition: int, until_ms: int | None) -> tuple[list[Record], str]:
        """What the model says a restore of (inc, partition) gives: the records up to the first gap in the live
        ranges, the first offset a block cannot attribute, or the first record at or after --until; and the
        reason it stops short ("" when it is done)."""
        ranges = sorted((r.start, r.end) for m in self.blocks for r in m.kafka
                        if r.incarnation == inc and r.partition == partition)
        mine = sorted((r for rows in self.truth.values() for r, _ in rows
                       if r.incarnation == inc and r.partition == partition), key=lambda r: r.offset)
        if not ranges:
            return [], ""
        gap, covered = None, ranges[0][0]
        for start, end in ranges:
            if start > covered:
                gap = covered
                break
            covered = max(covered, end)
        ambiguous = [r.offset for m in self.blocks for r, named in self.truth[m.id]
                     if not named and r.partition == partition and r.offset >= ranges[0][0]
                     and any(k.incarnation == inc and k.partition == partition and k.start <= r.offset < k.end
                             for k in m.kafka)]
        until = next((r.offset for r in mine if until_ms is not None and r.time_ms >= until_ms), None)
        others = {"gap": gap, "do not say whose": min(ambiguous, default=None)}
        known = {why: o for why, o in others.items() if o is not None}
        stop = min([*known.values(), *([until] if until is not None else [])], default=None)
        if stop is None:
            return mine, ""
        # The --until record itself unattributable: the restore may stop there cleanly (the plan saw that its block
        # holds only later records) or name the block; the records sent are the same.
        why = "" if until == stop and stop not in known.values() else min(known, key=lambda k: known[k])
        if until == stop and why:
            why = "either " + why
        return [r for r in mine if r.offset < stop], why

    @rule(which=st.integers(0, 2), until=st.one_of(st.none(), st.integers(0, 60_000)), before=st.integers(0, 3),
          interleave=st.sampled_from([0, 2, 5]), source=st.integers(0, 30),
          kill_after=st.one_of(st.none(), st.integers(0, 6)))
    def restore_and_translate(self, which: int, until: int | None, before: int, interleave: int,
                              source: int, kill_after: int | None) -> None:
        inc = INCARNATIONS[min(which, self.incarnation)]
        if not any(r.incarnation == inc for m in self.blocks for r in m.kafka):
            return
        until_ms = None if until is None else BASE_MS + until
        target = StubKafka(interleave=interleave)
        for p in range(3):
            for _ in range(before):
                target.append(TARGET, p, b"other", b"before", "committed")
        plan, outcomes, target = restore(self.config, self.blocks, inc, until_ms=until_ms,
                                         recorded=self.recorded[inc], target=target, kill_after=kill_after)
        assert plan.mapping.source_partitions == max(self.recorded[inc]) + 1
        for p in range(3):
            want, why = self.expected(inc, p, until_ms)
            assert restored(target, p) == [r.value for r in want], (p, outcomes.get(p))
            error = outcomes[p].error if p in outcomes else ""
            if why.startswith("either "):
                assert error == "" or why.removeprefix("either ") in error, (why, error)
            else:
                assert (why == "") == (error == ""), (why, error)
                assert why in error or (why == "gap" and "a gap in the backup" in error), (why, error)
            anchors = target.anchors("job").get(p)
            if want and anchors:
                done = target.progress("job")[p][0]
                got = translate(plan, self.config, {}, TARGET, {p: source}, anchors={p: anchors},
                                restored={p: done})[p]
                where = {e.value: e.offset for e in target.committed(TARGET, p)}
                first = next((r for r in want if r.offset >= source), None)
                if first is not None:
                    assert got == where[first.value]
                else:
                    assert got == where[want[-1].value] + 1

    @invariant()
    def blocks_hold_what_the_model_says(self) -> None:
        assert sum(len(rows) for rows in self.truth.values()) == sum(m.rows for m in self.blocks)


TestRestoreModel = RestoreModel.TestCase
TestRestoreModel.settings = settings(stateful_step_count=30, deadline=None)  # examples: the profile's
