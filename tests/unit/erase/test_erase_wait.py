"""An erasure request waits until its scanned group has indexed every record below its watermarks (DESIGN 19.1):
what ``unindexed`` calls behind, on a real embedded metastore fed real ingest commits (``Committer``, through the
dead letter queue in an outage) and an in-memory bucket; ``await_indexed``'s deadline on a fake clock."""

from __future__ import annotations

import uuid
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.factories import Clock
from tests.unit.erase.model_world import KEYS, PARTITIONS, TOPIC, CutOff, commit_of, write

from shale.block import DLQ_PREFIX
from shale.config import BucketConfig, KafkaConfig
from shale.erase import ErasureNotReadyError, ErasureRequest, erase
from shale.erase import api as erase_api
from shale.erase.api import await_indexed, unindexed
from shale.ingest.committer import Committer
from shale.metastore import DeadLetterQueue, ErasureWatermark, MetastoreService, SingleNodeLog, StateMachine, Watermarks
from shale.objstore import Bucket, open_bucket

A, B = "A" * 22, "B" * 22
KAFKA = KafkaConfig(bootstrap_servers="127.0.0.1:1")


class World:
    """A metastore and a bucket, and each group's ingest driver committing ``app``'s batches."""

    def __init__(self, tmp: Path) -> None:
        self.clock = Clock()
        self.config = BucketConfig(url=f"memory://erase-wait-{uuid.uuid4().hex}")
        self.bucket: Bucket = open_bucket(self.config)
        state = StateMachine(tmp / f"{uuid.uuid4().hex}.db")
        self.service = MetastoreService(state, SingleNodeLog(state, clock=self.clock), clock=self.clock)
        self.cut_off = CutOff(self.service)
        self.dlq = DeadLetterQueue(self.bucket, clock=self.clock)
        self.committers = {g: Committer(self.cut_off, self.dlq, g, 1) for g in ("backup", "partition")}
        self.batches = 0

    def ingest(self, group: str, partition: int, start: int, count: int, incarnation: str = A,
               reachable: bool = True) -> None:
        block = write(self.bucket, group, partition, start, [KEYS[0]] * count, incarnation)
        self.batches += 1
        self.cut_off.down = not reachable
        try:
            self.committers[group].commit(commit_of(block, f"b{self.batches}"))
        finally:
            self.cut_off.down = False

    def lag(self, group: str, marks: list[ErasureWatermark]) -> list[dict[str, object]]:
        return unindexed(self.service, group, Watermarks(marks, unnamed="later"), [TOPIC],
                         self.dlq.queued(DLQ_PREFIX))


def mark(partition: int, end: int, incarnation: str = A, older: bool = False) -> ErasureWatermark:
    return ErasureWatermark(topic=TOPIC, partition=partition, end=end, incarnation=incarnation, older=older)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.tuples(st.sampled_from(["backup", "partition"]), st.sampled_from(PARTITIONS),
                                  st.integers(1, 4), st.booleans()), max_size=8),
       marks=st.dictionaries(st.sampled_from(PARTITIONS), st.integers(0, 12)))
def test_a_partition_is_behind_exactly_while_its_group_has_not_committed_up_to_its_watermark(
        tmp_path: Path, batches: list[tuple[str, int, int, bool]], marks: dict[int, int]) -> None:
    """Batches of either group, some through the dead letter queue (a driver drains its queue before its next
    commit that reaches the metastore): the backup group is behind on a partition exactly when its committed end
    is below the watermark, and one of its queued commits is behind when it holds an offset below one; the
    partition group's commits never count for it. Replaying the queue leaves only what the group never read."""
    world = World(tmp_path)
    ends = {(g, p): 0 for g in ("backup", "partition") for p in PARTITIONS}
    committed = dict.fromkeys(PARTITIONS, 0)
    """The backup group's committed ends: every batch up to its last commit that reached the metastore."""
    queued: list[tuple[int, int]] = []
    """The backup group's batches in the queue since: partition and start."""
    for group, partition, count, reachable in batches:
        start = ends[(group, partition)]
        world.ingest(group, partition, start, count, reachable=reachable)
        ends[(group, partition)] = start + count
        if group == "backup":
            queued.append((partition, start))
            if reachable:
                committed, queued = {p: ends[("backup", p)] for p in PARTITIONS}, []
    ever = any(reachable for g, _, _, reachable in batches if g == "backup")
    lag = world.lag("backup", [mark(p, end) for p, end in marks.items()])
    behind = {x["partition"] for x in lag if "partition" in x}
    assert behind == ({p for p, end in marks.items() if committed[p] < end} if ever else set())
    assert len([x for x in lag if "queued" in x]) == len([1 for p, start in queued if start < marks.get(p, 0)])
    world.dlq.replay(world.service.submit_bytes)
    after = world.lag("backup", [mark(p, end) for p, end in marks.items()])
    assert {x["partition"] for x in after} == (
        {p for p, end in marks.items() if ends[("backup", p)] < end} if ever or queued else set())
    assert all("queued" not in x for x in after)


def test_watermarks_the_group_cannot_reach_any_more_are_not_waited_for(tmp_path: Path) -> None:
    """An older incarnation (the index's ``older`` mark), a partition whose incarnation the group has moved past
    (the topic recreated), a topic the group never committed, an empty partition: none is behind."""
    world = World(tmp_path)
    world.ingest("backup", 0, 0, 3, incarnation=A)
    world.ingest("backup", 0, 0, 2, incarnation=B)  # recreated: B's commit replaces A's row
    assert world.lag("backup", [mark(0, 9, A), mark(1, 0, B), mark(0, 5, A, older=True)]) == []
    assert world.lag("backup", [mark(0, 3, B)]) == [
        {"topic": TOPIC, "partition": 0, "incarnation": B, "watermark": 3, "committed": 2}]
    other = World(tmp_path)  # nothing ever committed
    assert other.lag("backup", [mark(0, 9)]) == []


def test_the_wait_ends_when_the_group_catches_up_and_refuses_past_its_deadline(tmp_path: Path) -> None:
    """``await_indexed`` asks once a second: it returns once the lagging commit lands, and past ``wait`` raises
    an ``ErasureNotReadyError`` naming the partition and its committed end, never the key."""
    world = World(tmp_path)
    world.ingest("backup", 0, 0, 2)
    marks = Watermarks([mark(0, 5)], unnamed="later")
    clock = Clock()
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.advance(seconds)
        if len(slept) == 3:
            world.ingest("backup", 0, 2, 3)

    await_indexed(world.service, world.bucket, "backup", marks, [TOPIC], 60, sleep=sleep, clock=clock)
    assert slept == [1.0, 1.0, 1.0]
    with pytest.raises(ErasureNotReadyError, match=r"app\[0\] committed 5 of 7") as refused:
        await_indexed(world.service, world.bucket, "backup", Watermarks([mark(0, 7)], unnamed="later"), [TOPIC],
                      2.5, sleep=sleep, clock=clock)
    assert "k0" not in str(refused.value)
    assert slept[3:] == [1.0, 1.0, 0.5]


def test_a_refused_request_commits_nothing_and_a_dry_run_names_what_is_behind(tmp_path: Path) -> None:
    """The driver, through its public API: a dry run lists the queued commit it would wait for; the run refuses
    with nothing committed; once the leader replays the queue the same request is made and finds every record."""
    world = World(tmp_path)
    world.ingest("backup", 0, 0, 2)
    world.ingest("partition", 0, 0, 2)
    world.ingest("backup", 0, 2, 3, reachable=False)
    world.ingest("partition", 0, 2, 3, reachable=False)
    request = ErasureRequest("acme", KEYS[0], topics=[TOPIC])
    with mock.patch.object(erase_api, "high_watermarks", return_value=[mark(0, 5)]):
        dry = erase(world.service, world.config, request, kafka=KAFKA)
        assert [u.get("committed", "queued") for u in dry.unindexed] == [2, "queued"]
        assert dry.matches == 2
        with pytest.raises(ErasureNotReadyError, match="dead letter queue"):
            erase(world.service, world.config, request, kafka=KAFKA, dry_run=False, wait=0)
        assert world.service.erasures() == []
        world.dlq.replay(world.service.submit_bytes)
        report = erase(world.service, world.config, request, kafka=KAFKA, dry_run=False)
    assert report.matches == 5
    assert report.state == "rewriting"  # its erase jobs given to the compaction workers
