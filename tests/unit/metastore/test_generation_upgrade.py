"""A generation upgrade (seed 002): ``ingest.generation`` raised, the new generation ingesting beside the serving one.

The rule under test (``shale.metastore.rules.generations``, DESIGN 10.5): the new generation becomes active only at the
commit that finds it caught up (by offsets, in every partition), from the time after which it holds every offset
readers see of another generation; never over an operator's switch that binds it. Queries never lose a record in
between, and an operator's switch back stays.

``Upgrade`` is the real state machine beside one topic's Kafka log (two partitions; each record's event time drawn
freely, so times do not follow offsets) and the generations that ingest it; what readers see is computed by the
real query planner from the index's switches.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule
from tests.factories import BASE_MS
from tests.unit.metastore.model import active_generation

from shale.block import BlockMeta, Compaction, Dataset, FileInfo, KafkaRange, deterministic_block_id
from shale.metastore.rules.commands import CommitIngestBatch, OffsetRange, Result, SetActiveGeneration, encode
from shale.metastore.rules.fsm import Entry, StateMachine
from shale.metastore.rules.generations import OPEN_END
from shale.query.plan import plan_query

TENANT, TOPIC = "acme", "app"
MINUTE = 60_000
SCRATCH = "/dev/shm" if Path("/dev/shm").is_dir() else None
Record = tuple[int, int]
"""(partition, offset)"""


def block(generation: int, partition: int, start: int, times: list[int]) -> BlockMeta:
    """The level-0 partition-group block of one ingest chunk: offsets ``[start, start + len(times))`` of one
    partition, one records dataset whose time range is its records'."""
    block_id = deterministic_block_id(BASE_MS, f"partition/{generation}/{TOPIC}/{partition}/{start}")
    datasets = [Dataset(name=f"records/{TOPIC}", kind="records", topic=TOPIC, file="records-0.parquet",
                        rows=len(times), bytes=len(times) * 100, min_time=min(times), max_time=max(times),
                        labels=[{"topic": TOPIC}])]
    return BlockMeta(id=block_id, tenant=TENANT, shard=0, level=0, group="partition", generation=generation,
                     min_time=min(times), max_time=max(times),
                     kafka=[KafkaRange(topic=TOPIC, partition=partition, start=start, end=start + len(times))],
                     datasets=datasets, files=[FileInfo(name="records-0.parquet", size=10, crc32="00000000")],
                     compaction=Compaction(sources=[block_id]))


class Upgrade:
    """The state machine, one topic's Kafka log, and the generations ingesting it; the reference of what each holds."""

    def __init__(self, path: Path) -> None:
        self.sm = StateMachine(path)
        self.log: list[tuple[Entry, bytes]] = []
        self.kafka: dict[int, list[int]] = {0: [], 1: []}  # per partition, each offset's event time
        self.earliest = {0: 0, 1: 0}  # Kafka's retention moves the log start
        self.committed: dict[tuple[int, int], int] = {}  # (generation, partition) -> committed end
        self.records: dict[str, list[tuple[Record, int]]] = {}  # block id -> its records and their times
        self.pins: list[tuple[int, int, int]] = []  # the operator's switches: (start, end, generations they bind)

    def apply(self, command: object) -> Result:
        entry = Entry(len(self.log) + 1, 1, BASE_MS + len(self.log) + 1)
        data = encode(command)  # type: ignore[arg-type]
        self.log.append((entry, data))
        return self.sm.apply(entry, data)

    def produce(self, partition: int, minutes: list[int]) -> None:
        self.kafka[partition] += [BASE_MS + m * MINUTE for m in minutes]

    def ingest(self, generation: int, partition: int, count: int) -> Result | None:
        """The next ``count`` records of one partition, read by ``generation`` from its committed end (a generation
        that never read it starts at Kafka's log start); None when there is nothing to read."""
        start = self.committed.get((generation, partition), self.earliest[partition])
        end = min(start + count, len(self.kafka[partition]))
        if end <= start:
            return None
        times = self.kafka[partition][start:end]
        meta = block(generation, partition, start, times)
        result = self.apply(CommitIngestBatch(
            group="partition", generation=generation, writer="ingest", blocks=[meta],
            ranges=[OffsetRange(topic=TOPIC, partition=partition, start=start, end=end, stored=end - start)]))
        assert result.ok, result
        self.committed[(generation, partition)] = end
        self.records[meta.id] = [((partition, start + i), t) for i, t in enumerate(times)]
        return result

    def switch(self, generation: int, start: int, end: int) -> Result:
        result = self.apply(SetActiveGeneration(tenant=TENANT, topic=TOPIC, generation=generation, start=start,
                                                end=end))
        assert result.ok, result
        self.pins.append((start, end, max([generation, *(g for g, _ in self.committed)])))
        return result

    def rules(self) -> list[tuple[str, int, int, int]]:
        return self.sm.reader.generation_rules(TENANT)

    def active(self, time_ms: int) -> int:
        return active_generation(self.rules(), TOPIC, time_ms, default=1)

    def visible(self) -> set[Record]:
        """The records a query of all time returns: the real planner over the index's blocks and switches."""
        blocks = self.sm.reader.query_blocks([TENANT], 0, OPEN_END, group="partition")
        plan = plan_query(blocks, "partition", "records", rules=self.rules(), default_generation=1, start=0,
                          end=OPEN_END)
        return {record for part in plan.parts for record, t in self.records[part.block.id]
                if part.intervals is None or any(low <= t <= high for low, high in part.intervals)}

    def close(self) -> None:
        self.sm.close()


@pytest.fixture
def up(tmp_path: Path) -> Upgrade:
    return Upgrade(tmp_path / "state.db")


def _ten_records(up: Upgrade) -> None:
    """Generation 1 ingests ten records of two partitions (times out of offset order), all of them queryable."""
    up.produce(0, [5, 1, 9, 3, 7])
    up.produce(1, [2, 8, 4, 6, 0])
    for partition in (0, 1):
        up.ingest(1, partition, 5)
    assert len(up.visible()) == 10


def test_case9_a_new_generation_is_not_active_until_it_has_caught_up(up: Upgrade) -> None:
    """Issue 39 case 9: the new generation's first small commit made it active from its first record's time, so a
    query that returned 10 records returned 4 until it caught up. Now the serving generation stays active until the
    new one has committed as far in every partition; then the new one takes over, and the query still returns 10."""
    _ten_records(up)
    first = up.ingest(2, 0, 2)
    assert len(up.visible()) == 10
    assert {g for _, _, _, g in up.rules()} == {1}
    assert first is not None
    assert first.data["switches"] == {}
    up.ingest(2, 0, 3)  # partition 0 caught up, partition 1 not yet
    assert len(up.visible()) == 10
    assert {g for _, _, _, g in up.rules()} == {1}
    caught_up = up.ingest(2, 1, 5)
    assert caught_up is not None
    assert caught_up.data["switches"] == {TENANT: [[TOPIC, 0, OPEN_END, 2]]}  # it holds every offset: all time
    assert caught_up.data["links"][TENANT][1] == len(up.log)  # the tenant's readers learn of the switch
    assert up.rules()[-1] == (TOPIC, 0, OPEN_END, 2)
    assert len(up.visible()) == 10
    blocks = up.sm.reader.query_blocks([TENANT], 0, OPEN_END, group="partition")
    plan = plan_query(blocks, "partition", "records", rules=up.rules(), start=0, end=OPEN_END)
    assert {p.block.generation for p in plan.parts} == {2}  # read from generation 2 alone now


def test_case9_an_operator_switch_back_is_not_undone_by_the_next_batch(up: Upgrade) -> None:
    """Issue 39 case 9: an operator's switch back to generation 1 was undone by generation 2's next batch. An
    operator's switch binds the generations that existed when it was made: their batches never switch over it."""
    _ten_records(up)
    for partition in (0, 1):
        up.ingest(2, partition, 5)
    assert up.active(OPEN_END) == 2
    up.switch(1, 0, OPEN_END)
    up.produce(0, [12, 11])
    results = [up.ingest(generation, 0, 1) for generation in (2, 1, 2)]
    assert up.active(OPEN_END) == 1
    assert up.rules()[-1] == (TOPIC, 0, OPEN_END, 1)
    assert all(r is not None and r.data["switches"] == {} for r in results)
    assert len(up.visible()) == 11  # generation 1 read offset 5 of partition 0; offset 6 waits for it


def test_case9_a_generation_started_after_a_switch_back_takes_over_when_caught_up(up: Upgrade) -> None:
    """The fix of the bug that made the operator switch back: generation 3, started after the switch, is a new
    upgrade, and becomes active when it has caught up with generation 1."""
    _ten_records(up)
    for partition in (0, 1):
        up.ingest(2, partition, 5)
    up.switch(1, 0, OPEN_END)
    up.ingest(3, 0, 5)
    assert up.active(OPEN_END) == 1
    up.ingest(3, 1, 5)
    assert up.active(OPEN_END) == 3
    assert len(up.visible()) == 10


def test_case9_an_operator_switch_while_catching_up_holds(up: Upgrade) -> None:
    """An operator who keeps generation 1 while generation 2 catches up (``generation switch --generation 1``)
    is not overridden when it has caught up: an explicit switch is never undone by the generations it binds."""
    _ten_records(up)
    up.ingest(2, 0, 1)
    up.switch(1, 0, OPEN_END)
    for partition in (0, 1):
        up.ingest(2, partition, 5)
    assert up.active(OPEN_END) == 1
    up.switch(2, 0, OPEN_END)  # and the operator's switch forward is a switch like any other
    assert up.active(OPEN_END) == 2


def test_case9_the_switch_keeps_the_records_the_new_generation_lacks(up: Upgrade) -> None:
    """Kafka had deleted the first offsets of partition 0 when generation 2 started: it holds only offsets 3-4
    there. It becomes active only after the newest time of generation 1's block that holds offsets it lacks, so
    every record stays queryable (partition 1 and offsets 3-4 from generation 2 after that time)."""
    _ten_records(up)
    up.earliest[0] = 3
    for partition in (0, 1):
        up.ingest(2, partition, 5)
    newest = max(up.kafka[0])  # generation 1's block of partition 0 holds offsets 0-4, the newest at minute 9
    assert up.rules()[-1] == (TOPIC, newest + 1, OPEN_END, 2)
    assert len(up.visible()) == 10
    up.produce(0, [20])
    up.ingest(2, 0, 1)  # a record after the switch: generation 2 serves it alone
    assert (0, 5) in up.visible()


def test_case9_switches_applied_twice_are_applied_once(up: Upgrade) -> None:
    """Every command applied twice (a new log entry each time) leaves the state as applied once: the catching-up
    commit's replay makes no second switch, an operator's switch records its rule and its binding once."""
    _ten_records(up)
    up.ingest(2, 0, 5)
    meta = block(2, 1, 0, up.kafka[1][:5])
    commit = CommitIngestBatch(group="partition", generation=2, writer="ingest", blocks=[meta],
                               ranges=[OffsetRange(topic=TOPIC, partition=1, start=0, end=5, stored=5)])
    assert up.apply(commit).data["switches"] == {TENANT: [[TOPIC, 0, OPEN_END, 2]]}
    once = up.sm.state_hash(with_applied=False)
    assert up.apply(commit).data["replay"] is True
    assert up.sm.state_hash(with_applied=False) == once
    switch = SetActiveGeneration(tenant=TENANT, topic=TOPIC, generation=1, start=0, end=OPEN_END)
    assert up.apply(switch).data["switched"] is True
    once = up.sm.state_hash(with_applied=False)
    assert up.apply(switch).data["switched"] is False
    assert up.sm.state_hash(with_applied=False) == once


def test_case9_a_replica_applying_the_same_log_reaches_the_same_state(up: Upgrade, tmp_path: Path) -> None:
    _ten_records(up)
    up.ingest(2, 0, 2)
    up.switch(1, BASE_MS, BASE_MS + 3 * MINUTE)
    up.ingest(2, 0, 3)
    up.ingest(2, 1, 5)
    replica = StateMachine(tmp_path / "replica.db")
    for entry, data in up.log:
        replica.apply(entry, data)
    assert replica.state_hash() == up.sm.state_hash()
    # the operator's closed range binds generation 2: the switch went around it
    assert [r for r in up.rules() if r[3] == 2] == [(TOPIC, 0, BASE_MS - 1, 2), (TOPIC, BASE_MS + 3 * MINUTE + 1,
                                                                              OPEN_END, 2)]


def test_case9_a_state_without_switches_keeps_its_data_until_the_new_generation_has_caught_up(up: Upgrade) -> None:
    """A state whose commits predate recorded switches (readers configured with generation 1 decide): no switch
    names a serving generation, so generation 2 must catch up with every other generation live ingestion writes
    before it is switched in (its first commit used to make it active at every time, hiding the older data)."""
    _ten_records(up)
    up.sm.conn.execute("DELETE FROM generations")  # as a state from before switches were recorded
    up.ingest(2, 0, 5)
    assert up.rules() == []
    assert len(up.visible()) == 10
    up.ingest(2, 1, 5)
    assert up.rules() == [(TOPIC, 0, OPEN_END, 2)]
    assert len(up.visible()) == 10


# -- the property: every interleaving of batches of three generations, Kafka's retention and operator switches ----

SPANS = [(0, OPEN_END), (BASE_MS, BASE_MS + 10 * MINUTE), (BASE_MS + 10 * MINUTE, OPEN_END)]


class UpgradeMachine(RuleBasedStateMachine):
    """After every ingest commit: the records a query returns are a superset of those before (never shrinks); the
    active generation changed only to the committing one, and nowhere an operator's switch binding it covers; and a
    generation that has caught up with the serving one (and is newer, and not held back by an operator) serves."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="gen-upgrade-", dir=SCRATCH))
        self.up = Upgrade(self.dir / "state.db")

    def teardown(self) -> None:
        try:
            replica = StateMachine(self.dir / "replica.db")
            for entry, data in self.up.log:
                replica.apply(entry, data)
            assert replica.state_hash() == self.up.sm.state_hash(), "a replica applying the same log differs"
            replica.close()
            self.up.close()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    @rule(partition=st.sampled_from([0, 1]), minutes=st.lists(st.integers(0, 20), min_size=1, max_size=4))
    def produce(self, partition: int, minutes: list[int]) -> None:
        self.up.produce(partition, minutes)

    @rule(partition=st.sampled_from([0, 1]), count=st.integers(1, 3))
    def kafka_retention(self, partition: int, count: int) -> None:
        """Kafka deletes the oldest offsets, never ones a started generation has still to read (a loss is another
        case): a generation that starts later holds fewer."""
        ends = [end for (_, p), end in self.up.committed.items() if p == partition]
        self.up.earliest[partition] = max(self.up.earliest[partition],
                                          min([self.up.earliest[partition] + count, *ends]))

    @rule(generation=st.sampled_from([1, 1, 2, 2, 3]), partition=st.sampled_from([0, 1]), count=st.integers(1, 4))
    def ingest(self, generation: int, partition: int, count: int) -> None:
        up = self.up
        before, rules = up.visible(), up.rules()
        serving = active_generation(rules, TOPIC, OPEN_END, default=0) if rules else 0
        if up.ingest(generation, partition, count) is None:
            return
        after = up.visible()
        assert before <= after, ("a query lost records", sorted(before - after), rules, up.rules())
        times = sorted({t for log in up.kafka.values() for t in log}
                       | {x for s, e, _ in up.pins for x in (s, e)} | {0, OPEN_END})
        bound = [(s, e) for s, e, binds in up.pins if binds >= generation]
        for t in times:
            old = active_generation(rules, TOPIC, t)
            new = up.active(t)
            assert new in (old, generation), (t, old, new)
            if new != old:
                assert not any(s <= t <= e for s, e in bound), ("an operator's switch was undone", t, up.pins)
        caught_up = all(up.committed.get((generation, p), -1) >= end for (g, p), end in up.committed.items()
                        if g == serving)
        held_back = any(s <= OPEN_END <= e for s, e in bound)
        if serving and generation > serving and caught_up and not held_back:
            assert up.active(OPEN_END) == generation, ("caught up but not switched", up.committed, up.rules())

    @precondition(lambda self: self.up.committed)
    @rule(generation=st.sampled_from([1, 2, 3]), span=st.sampled_from(SPANS))
    def operator_switch(self, generation: int, span: tuple[int, int]) -> None:
        self.up.switch(generation, *span)
        assert self.up.active(span[0]) == generation


TestGenerationUpgrade = settings(stateful_step_count=30)(UpgradeMachine).TestCase


@given(st.lists(st.integers(0, 20), min_size=1, max_size=6), st.integers(0, 5), st.integers(1, 6))
@example(minutes=[5, 1], first=1, batch=1)  # out of time order: generation 2 lacks the newer offset-0 record
@settings(max_examples=40)
def test_case9_an_upgrade_never_shrinks_a_query(minutes: list[int], first: int, batch: int) -> None:
    """One partition, generation 1 ingested all, generation 2 starting at offset ``first`` (Kafka's retention) in
    batches of ``batch``: after every batch the query returns every record, and at the end generation 2 serves."""
    directory = Path(tempfile.mkdtemp(prefix="gen-upgrade-", dir=SCRATCH))
    try:
        up = Upgrade(directory / "state.db")
        up.produce(0, minutes)
        up.ingest(1, 0, len(minutes))
        up.earliest[0] = min(first, len(minutes) - 1)
        while up.ingest(2, 0, batch) is not None:
            assert len(up.visible()) == len(minutes)
        assert up.active(OPEN_END) == 2
        up.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
