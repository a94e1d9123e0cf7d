"""The driver's ingest lease (issue 30) against the real state machine: a standby waits and takes over when the
holder's lease expires; the old holder's heartbeat and commits are then fenced, and it stops writing."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pytest
from tests.factories import Clock

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
    return MetastoreService(state, SingleNodeLog(state, clock=clock))  # type: ignore[arg-type]


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
