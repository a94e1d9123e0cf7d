"""The driver's ingest lease (issue 30) against the real state machine: a standby waits and takes over when the
holder's lease expires; the old holder's heartbeat and commits are then fenced, and it stops writing."""

from __future__ import annotations

import contextlib
import tempfile
import threading
import uuid
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tests.factories import Clock
from tests.waiting import eventually

from shale.config import BucketConfig
from shale.errors import MetastoreUnavailableError
from shale.index import OffsetRow
from shale.ingest.committer import Committer, LeaseLostError
from shale.ingest.lease import TAKEOVERS, IngestLease
from shale.metastore import (
    Command,
    CommitIngestBatch,
    DeadLetterQueue,
    MetastoreService,
    Noop,
    OffsetRange,
    Result,
    SetIngestShards,
    SingleNodeLog,
    StateMachine,
)
from shale.objstore import open_bucket


def _service(tmp_path: Path, clock: Clock) -> MetastoreService:
    state = StateMachine(tmp_path / "state.db")
    return MetastoreService(state, SingleNodeLog(state, clock=clock), clock=clock)  # type: ignore[arg-type]


def _entries(service: MetastoreService) -> int:
    return service.log.status().applied_index


def _batch(start: int, end: int, token: int | None) -> CommitIngestBatch:
    return CommitIngestBatch(group="backup", lease=token, blocks=[],
                             ranges=[OffsetRange(topic="app", partition=0, start=start, end=end)])


def test_a_standby_takes_over_an_expired_lease_and_the_old_holder_is_fenced(tmp_path: Path) -> None:
    clock = Clock(1_800_000_000.0)
    service = _service(tmp_path, clock)
    active = IngestLease(service, "backup", 1, duration=10, holder="active")
    standby = IngestLease(service, "backup", 1, duration=10, holder="standby")
    stop = threading.Event()
    assert active.wait(stop)
    old = Committer(service, None, "backup", 1)
    old.load()
    assert old.commit(_batch(0, 10, active.token)) == "committed"
    before = TAKEOVERS.labels("backup", "0")._value.get()
    waiting = threading.Thread(target=standby.wait, args=(stop,))
    waiting.start()
    waiting.join(timeout=0.5)
    assert waiting.is_alive()  # the lease is held: the standby waits
    for _ in range(10):  # the active driver dies: no renewal, no commit for a whole lease, while the log runs
        clock.now += 1
        service.submit(Noop())
    waiting.join(timeout=30)
    assert not waiting.is_alive()
    assert standby.token is not None
    assert active.token is not None
    assert standby.token > active.token
    assert TAKEOVERS.labels("backup", "0")._value.get() == before + 1
    with pytest.raises(LeaseLostError, match="fenced"):
        old.commit(_batch(10, 20, active.token))  # the old driver resumes: its commit is refused
    with pytest.raises(LeaseLostError):
        active.renew()
    new = Committer(service, None, "backup", 1)
    assert new.load() == {("app", 0): (10, "")}
    assert new.commit(_batch(10, 20, standby.token)) == "committed"
    standby.renew()
    (row,) = service.ingest_leases()  # what the metastore's gauge and the no-holder alert read
    assert (row["holder"], row["token"], row["takeovers"]) == ("standby", standby.token, 1)
    standby.release()
    assert service.ingest_leases()[0]["holder"] == ""
    assert IngestLease(service, "backup", 1, duration=10, holder="third").wait(stop)  # released: at once


class Unreachable:
    """The service as a driver cut off from the metastore sees it while ``cut`` (the committer's target)."""

    def __init__(self, service: MetastoreService) -> None:
        self.service = service
        self.cut = False

    def submit(self, command: Command) -> Result:
        if self.cut:
            raise MetastoreUnavailableError("cut off")
        return self.service.submit(command)

    def offsets(self, group: str | None = None, generation: int | None = None) -> list[OffsetRow]:
        return self.service.offsets(group, generation)


def test_a_holder_fenced_while_cut_off_stops_on_its_dead_lettered_commit_as_a_lost_lease(tmp_path: Path) -> None:
    """The partition test's lease holder cut off from the metastore: its commit went to the dead letter queue, the
    standby took the shard, and when the holder gets through again the replay refuses the commit for its lease.
    That is a lost lease (the new holder reads those offsets again), not a conflict for an operator."""
    clock = Clock(1_800_000_000.0)
    service = _service(tmp_path, clock)
    active = IngestLease(service, "backup", 1, duration=10, holder="active")
    stop = threading.Event()
    assert active.wait(stop)
    link = Unreachable(service)
    old = Committer(link, DeadLetterQueue(open_bucket(BucketConfig(url=f"memory://dlq-{uuid.uuid4().hex}"))),
                    "backup", 1)
    old.load()
    assert old.commit(_batch(0, 10, active.token)) == "committed"
    link.cut = True
    assert old.commit(_batch(10, 20, active.token)) == "dead-lettered"
    for _ in range(11):  # a whole lease without a renewal while the log runs
        clock.now += 1
        service.submit(Noop())
    standby = IngestLease(service, "backup", 1, duration=10, holder="standby")
    assert standby.wait(stop)
    link.cut = False
    with pytest.raises(LeaseLostError, match="fenced off on replay \\(stale-lease\\)"):
        old.commit(_batch(20, 30, active.token))
    assert service.offsets("backup", 1)[0].committed_end == 10  # the fenced commits applied nothing


def test_a_stopped_standby_gives_up_waiting(tmp_path: Path) -> None:
    clock = Clock(1_800_000_000.0)
    service = _service(tmp_path, clock)
    stop = threading.Event()
    assert IngestLease(service, "backup", 1, duration=10, holder="a").wait(stop)
    stop.set()
    assert not IngestLease(service, "backup", 1, duration=10, holder="b").wait(stop)


def test_drivers_of_any_shard_take_free_shards_and_acquire_again_after_the_count_changes(tmp_path: Path) -> None:
    clock = Clock(1_800_000_000.0)
    service = _service(tmp_path, clock)
    stop = threading.Event()
    first, second = (IngestLease(service, "backup", 1, duration=10, holder=h, shards=2) for h in "ab")
    assert first.wait(stop)
    assert second.wait(stop)
    assert (first.shard, second.shard, first.shards) == (0, 1, 2)
    fixed = IngestLease(service, "backup", 1, duration=10, holder="c", shard=1, shards=2)
    waiting = threading.Thread(target=fixed.wait, args=(stop,))
    waiting.start()
    waiting.join(timeout=0.5)
    assert waiting.is_alive()  # --shard 1 waits for shard 1 only
    service.submit(SetIngestShards(group="backup", shards=3)).raise_for_rejection()
    with pytest.raises(LeaseLostError) as lost:
        first.renew()
    assert lost.value.reason == "resharded"
    waiting.join(timeout=30)
    assert not waiting.is_alive()  # the old map's lease of shard 1 no longer holds it: --shard 1 takes it
    assert (fixed.shard, fixed.shards) == (1, 3)
    first.reset()
    assert first.wait(stop)
    assert (first.shard, first.shards) == (0, 3)
    rows = {r["shard"]: r["holder"] for r in service.ingest_leases()}
    assert rows == {0: "a", 1: "c", 2: ""}  # shard 2 has no holder yet: the alert sees it


@settings(max_examples=40, deadline=None)
@given(duration=st.integers(3, 60), beats=st.integers(1, 12), latency=st.floats(0, 0.06),
       phase=st.floats(0, 1))
@example(duration=3, beats=3, latency=0.06, phase=0.99)  # the shortest lease, read periods at their floor
def test_a_standby_writes_nothing_while_the_holder_renews_and_takes_over_within_a_lease_and_an_ask(
        duration: int, beats: int, latency: float, phase: float) -> None:
    """Simulated time (the log's clock and the standby's): the holder renews every third of a lease plus a latency
    (up to a fifteenth); the standby reads the lease rows every poll period. While the holder renews, the log holds
    its acquire and renewals only; once it dies, the standby holds the lease within a lease, an ask period and a
    poll period of the holder's last renewal, and never before the lease expired."""
    with tempfile.TemporaryDirectory() as scratch:
        clock = Clock(1_800_000_000.0)
        start = clock.now
        service = _service(Path(scratch), clock)
        holder = IngestLease(service, "backup", 1, duration=duration, holder="holder")
        standby = IngestLease(service, "backup", 1, duration=duration, holder="standby")
        assert holder.step(0.0) is not None
        renewals = [k * duration * (1 / 3 + latency) for k in range(1, beats + 1)]
        now = phase * standby.poll_period
        while renewals:
            if renewals[0] <= now:
                clock.now = start + renewals.pop(0)
                holder.renew()
                continue
            clock.now = start + now
            assert standby.step(now) is None
            now += standby.poll_period
        assert _entries(service) == 1 + beats  # the holder's acquire and renewals: the standby wrote nothing
        last = clock.now - start  # the holder dies after its last renewal
        while True:
            clock.now = start + now
            if standby.step(now) is not None:
                break
            assert now - last < 2 * duration, "the standby never took the lease over"
            now += standby.poll_period
        assert standby.token is not None
        assert holder.token is not None
        assert standby.token > holder.token
        # the log's times are whole milliseconds
        assert duration - 0.001 <= now - last <= duration + standby.ask_period + standby.poll_period
        with pytest.raises(LeaseLostError):
            holder.renew()


class _Driver:
    """A simulated ``shale ingest`` process of an automatic group: it waits (``step``) until it holds a shard, then
    renews every third of a lease; a lost lease (the map changed) makes it acquire again at its next look."""

    def __init__(self, service: MetastoreService, name: str, duration: int) -> None:
        self.lease = IngestLease(service, "backup", 1, duration=duration, holder=name, shards="auto")
        self.beat = 0.0
        self.alive = True

    @property
    def holding(self) -> bool:
        return self.lease.token is not None and self.lease.lost is None

    def tick(self, now: float) -> None:
        if not self.holding:
            self.lease.reset()
            if self.lease.step(now) is not None:
                self.beat = now + self.lease.duration_ms / 3000
        elif now >= self.beat:
            self.beat = now + self.lease.duration_ms / 3000
            with contextlib.suppress(LeaseLostError):
                self.lease.renew()


@settings(max_examples=25, deadline=None)
@given(events=st.lists(st.tuples(st.floats(0.1, 12.0), st.sampled_from(["join", "release", "kill"]),
                                 st.integers(0, 7)), min_size=1, max_size=8))
def test_an_automatic_group_has_one_shard_per_live_driver_after_drivers_join_release_and_die(
        events: list[tuple[float, str, int]]) -> None:
    """Simulated time: drivers of ``ingest.shards = auto`` join, stop cleanly (release) or die (silent) at random;
    four leases after the last change, every live driver holds its own shard of a map whose count is the number
    of live drivers, and no driver that left holds one."""
    duration = 6
    with tempfile.TemporaryDirectory() as scratch:
        clock = Clock(1_800_000_000.0)
        start = clock.now
        service = _service(Path(scratch), clock)
        drivers = [_Driver(service, "d0", duration)]
        now, step = 0.0, drivers[0].lease.poll_period
        plan = [(sum(e[0] for e in events[:i + 1]), e[1], e[2]) for i, e in enumerate(events)]
        end = plan[-1][0] + 4 * duration
        while now < end:
            while plan and plan[0][0] <= now:
                _, action, which = plan.pop(0)
                alive = [d for d in drivers if d.alive]
                if action == "join":
                    drivers.append(_Driver(service, f"d{len(drivers)}", duration))
                elif alive:
                    leaving = alive[which % len(alive)]
                    leaving.alive = False
                    if action == "release":
                        leaving.lease.release()
            clock.now = start + now
            for driver in drivers:
                if driver.alive:
                    driver.tick(now)
            now += step
        alive = [d for d in drivers if d.alive]
        rows = service.ingest_leases("backup")
        holders = {r["holder"]: r["shard"] for r in rows if r["holder"]}
        assert holders == {d.lease.holder: d.lease.shard for d in alive}, rows
        assert all(d.holding for d in alive)
        if alive:  # with nobody left, nobody writes to shrink the map: the next driver to come does
            assert len(rows) == len(alive), rows  # one shard per live driver


class _Process:
    """A driver's lease loop as ``IngestJob.run`` has it, on the real clock: wait for a shard, heartbeat while
    "ingesting" until the lease is lost (then acquire again) or the process stops (``stop``: it releases) or dies
    (``die``: it just stops, its lease left to expire)."""

    def __init__(self, service: MetastoreService, name: str) -> None:
        self.lease = IngestLease(service, "backup", 1, duration=3, holder=name, shards="auto")
        self.stop, self.die = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while self.lease.wait(self.stop):
            ending = threading.Event()
            beat = self.lease.heartbeat(ending)
            while self.lease.lost is None and not self.stop.is_set() and not self.die.wait(0.05):
                pass
            ending.set()
            beat.join()
            if self.die.is_set():
                return
            if self.lease.lost is None:
                self.lease.release()
                return
            self.lease.reset()


def _settled(service: MetastoreService, processes: list[_Process]) -> bool:
    rows = service.ingest_leases("backup")
    return (len(rows) == len(processes)
            and {r["holder"]: r["shard"] for r in rows} == {p.lease.holder: p.lease.shard for p in processes})


def test_drivers_that_join_die_and_stop_rebalance_an_automatic_group_on_the_real_clock(tmp_path: Path) -> None:
    """The driver's own loops (``wait``, the heartbeat thread, ``reset``) with 3 s leases: two drivers split the
    group, a third joins and takes the new shard, one dies and its shard is dropped once its lease expired, one
    stops and releases: each time the group settles at one shard per live driver."""
    state = StateMachine(tmp_path / "state.db")
    service = MetastoreService(state, SingleNodeLog(state))  # type: ignore[arg-type]
    a, b = _Process(service, "a"), _Process(service, "b")
    try:
        eventually(lambda: _settled(service, [a, b]), 60, lambda: f"two drivers on two shards: "
                   f"{service.ingest_leases('backup')}")
        c = _Process(service, "c")
        eventually(lambda: _settled(service, [a, b, c]), 60, lambda: f"the third driver to take the third shard: "
                   f"{service.ingest_leases('backup')}")
        assert c.lease.shard == 2
        b.die.set()
        eventually(lambda: _settled(service, [a, c]), 60, lambda: f"the dead driver's shard to go: "
                   f"{service.ingest_leases('backup')}")
        c.stop.set()
        c.thread.join(timeout=30)
        eventually(lambda: _settled(service, [a]), 60, lambda: f"the stopped driver's shard to go: "
                   f"{service.ingest_leases('backup')}")
    finally:
        for process in (a, b):
            process.stop.set()


def test_automatic_drivers_read_the_partitions_the_metastore_placed_and_a_joiner_takes_only_moved_ones(
        tmp_path: Path) -> None:
    """``IngestLease.owner``: a driver reads the partitions its grant placed on its shard (and the unplaced ones that
    hash to it); every driver of a map sees the same owners, each partition has exactly one, and each commits
    only its own without a ``wrong-shard`` refusal."""
    clock = Clock(1_800_000_000.0)
    service = _service(tmp_path, clock)
    stop = threading.Event()
    partitions = [("app", p) for p in range(12)]
    ends = dict.fromkeys(partitions, 0)

    def commit_own(lease: IngestLease) -> set[tuple[str, int]]:
        own = {k for k in partitions if lease.owner(*k) == lease.shard}
        ranges = [OffsetRange(topic=t, partition=p, start=ends[(t, p)], end=ends[(t, p)] + 5, bytes=1000 * (p + 1))
                  for t, p in sorted(own)]
        result = service.submit(CommitIngestBatch(group="backup", lease=lease.token, shard=lease.shard, blocks=[],
                                                  ranges=ranges))
        assert result.ok, result
        for k in own:
            ends[k] += 5
        return own

    a, b = (IngestLease(service, "backup", 1, duration=10, holder=h, shards="auto") for h in "ab")
    assert a.wait(stop)
    assert b.wait(stop)
    with pytest.raises(LeaseLostError):
        a.renew()  # b's join resharded a's lease
    a.reset()
    assert a.wait(stop)
    for _ in range(2):
        two = {a.shard: commit_own(a), b.shard: commit_own(b)}
        clock.now += 61  # a load window later
    assert sorted(k for ks in two.values() for k in ks) == partitions  # one owner each
    c = IngestLease(service, "backup", 1, duration=10, holder="c", shards="auto")
    assert c.wait(stop)
    assert (c.shard, c.shards) == (2, 3)
    for lease in (a, b):
        with pytest.raises(LeaseLostError):
            lease.renew()
        lease.reset()
        assert lease.wait(stop)
    assert a.placement == b.placement == c.placement
    assert set(a.placement) == set(partitions)  # every committed partition was placed at the join
    three = {x.shard: commit_own(x) for x in (a, b, c)}
    assert sorted(k for ks in three.values() for k in ks) == partitions
    assert three[a.shard] <= two[a.shard]  # only the joiner gained partitions
    assert three[b.shard] <= two[b.shard]
    assert three[c.shard]


class _SparkCalls:
    """What an ingest job asked of its Spark side (no Spark application in a unit test)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def session(self) -> None:
        self.calls.append("session")

    def rehearse(self, plan: object) -> dict[str, float]:
        self.calls.append("rehearse")
        return {}


def test_a_driver_that_finds_the_lease_free_takes_it_without_a_rehearsal_and_a_standby_rehearses(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from shale.config import load_config
    from shale.ingest.job import IngestJob

    monkeypatch.setattr("shale.ingest.job.describe_topics", lambda *args, **kwargs: {})  # no Kafka here
    service = _service(tmp_path, Clock(1_800_000_000.0))
    config = load_config(env={}, overrides=["bucket.url=memory://", f"metastore.data_dir={tmp_path}",
                                            "ingest.topic_pattern=app"])
    first, second = IngestJob(config, "backup", metastore=service), IngestJob(config, "backup", metastore=service)
    first.spark, second.spark = _SparkCalls(), _SparkCalls()  # type: ignore[assignment]
    assert first._warm() is True  # the lease was free: taken at once, its first batch pays the cold start
    assert first.spark.calls == ["session"]  # type: ignore[attr-defined]
    assert first.lease.token is not None
    assert second._warm() is False  # held by the first: the standby rehearses while it waits
    assert second.spark.calls == ["session", "rehearse"]  # type: ignore[attr-defined]
    assert second.lease.token is None
