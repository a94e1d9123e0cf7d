"""The compaction service in the metastore: two-step plan updates, leases, fencing tokens, completion."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.factories import BASE_MS
from tests.unit.metastore.helpers import meta

from shale.compaction.protocol import JobUpdate, PollRequest
from shale.config import CompactionConfig
from shale.errors import MetastoreUnavailableError
from shale.index.compaction_state import CompactionState
from shale.metastore import AddBlocks, MetastoreService, SingleNodeLog, StateMachine, encode
from shale.metastore.commands import PartitionKey, SetCompactionFailureLimit, TruncateIndex
from shale.metastore.compaction import plan_command, prepare_plan
from shale.metastore.fsm import Entry


class Clock:
    def __init__(self) -> None:
        self.now = BASE_MS / 1000 + 3600

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def service(tmp_path: Path, clock: Clock) -> MetastoreService:
    state = StateMachine(tmp_path / "s.db")
    config = CompactionConfig(blocks_per_job=[3, 2], lease_duration=10, max_age=10_000)
    svc = MetastoreService(state, SingleNodeLog(state, clock=clock), compaction=config, clock=clock)
    svc.submit(AddBlocks(blocks=[meta(start=i * 10, end=i * 10 + 10) for i in range(7)]))
    return svc


def _output(job_sources: list[str], level: int = 1, key: str = "out"):  # type: ignore[no-untyped-def]
    return meta(start=0, end=30, level=level, sources=job_sources, key=key)


def test_poll_plans_and_assigns_up_to_the_workers_capacity(service: MetastoreService) -> None:
    first = service.poll_compaction(PollRequest(worker="w1", capacity=1))
    assert len(first.assigned) == 1
    job = first.assigned[0]
    assert job.level == 0
    assert len(job.sources) == 3
    applied, _ = service.state.applied()
    assert job.token == applied  # the fencing token is the log index of the applying entry
    second = service.poll_compaction(PollRequest(worker="w2", capacity=5))
    assert [len(a.sources) for a in second.assigned] == [3]  # one more full job; one block is left queued
    assert second.assigned[0].token > job.token
    assert sum(service.compaction_queue().values()) == 1


def test_completion_replaces_sources_and_queues_the_output_one_level_up(service: MetastoreService) -> None:
    (job,) = service.poll_compaction(PollRequest(worker="w1", capacity=1)).assigned
    sources = [s.id for s in job.sources]
    out = _output(sources)
    done = service.poll_compaction(PollRequest(worker="w1", capacity=0, updates=[
        JobUpdate(job=job.job, token=job.token, status="success", outputs=[out])]))
    assert done.updates == {job.job: "completed"}
    ids = {m.id for m in service.state.reader.tenant_blocks("acme")}
    assert out.id in ids
    assert not ids & set(sources)
    assert {t.block_id for t in service.tombstones()} == set(sources)
    assert service.compaction_jobs() == []
    assert "acme/L1" in service.compaction_queue()


def test_expired_lease_is_reassigned_and_the_stale_report_is_refused(service: MetastoreService,
                                                                     clock: Clock) -> None:
    (job,) = service.poll_compaction(PollRequest(worker="w1", capacity=1)).assigned
    refreshed = service.poll_compaction(PollRequest(worker="w1", capacity=0, updates=[
        JobUpdate(job=job.job, token=job.token, status="in_progress")]))
    assert refreshed.updates == {job.job: "refreshed"}
    clock.now += 11  # the lease (10 s) expires without a refresh
    taken = service.poll_compaction(PollRequest(worker="w2", capacity=2)).assigned
    again = next(a for a in taken if a.job == job.job)
    assert again.token > job.token
    stale = service.poll_compaction(PollRequest(worker="w1", capacity=0, updates=[
        JobUpdate(job=job.job, token=job.token, status="success", outputs=[_output([s.id for s in job.sources])])]))
    assert stale.updates == {job.job: "lost"}
    assert [j["failures"] for j in service.compaction_jobs() if j["name"] == job.job] == [1]
    ok = service.poll_compaction(PollRequest(worker="w2", capacity=0, updates=[
        JobUpdate(job=job.job, token=again.token, status="success",
                  outputs=[_output([s.id for s in job.sources], key="w2")])]))
    assert ok.updates == {job.job: "completed"}


def test_failure_threshold_excludes_and_the_admin_limit_brings_it_back(service: MetastoreService,
                                                                       clock: Clock) -> None:
    (job,) = service.poll_compaction(PollRequest(worker="w", capacity=1)).assigned
    for _ in range(3):
        clock.now += 11
        service.poll_compaction(PollRequest(worker="w", capacity=3))
    clock.now += 11
    states = {j["name"]: (j["status"], j["failures"]) for j in service.compaction_jobs()}
    assert states[job.job] == ("excluded", 3)
    assigned = {a.job for a in service.poll_compaction(PollRequest(worker="w", capacity=5)).assigned}
    assert job.job not in assigned
    assert service.submit(SetCompactionFailureLimit(limit=5)).ok
    clock.now += 11
    assigned = {a.job for a in service.poll_compaction(PollRequest(worker="w", capacity=5)).assigned}
    assert job.job in assigned


def test_retention_removed_sources_are_never_resurrected(service: MetastoreService) -> None:
    (job,) = service.poll_compaction(PollRequest(worker="w1", capacity=1)).assigned
    window = job.sources[0].time_ms - job.sources[0].time_ms % (6 * 3600 * 1000)
    assert service.submit(TruncateIndex(prepared_term=1, partitions=[
        PartitionKey(tenant="acme", shard=0, window_start=window)])).ok
    late = service.poll_compaction(PollRequest(worker="w1", capacity=0, updates=[
        JobUpdate(job=job.job, token=job.token, status="success", outputs=[_output([s.id for s in job.sources])])]))
    assert late.updates == {job.job: "sources-missing"}
    assert service.state.reader.tenant_blocks("acme") == []


def test_the_plan_command_is_idempotent_and_refuses_an_older_term(service: MetastoreService, clock: Clock,
                                                                  tmp_path: Path) -> None:
    state = CompactionState(service.state.reader.conn)
    request = PollRequest(worker="w1", capacity=2)
    plan = prepare_plan(state, request, int(clock() * 1000), service.limits)
    command = encode(plan_command(plan, request, 1, service.limits))
    applied, _ = service.state.applied()
    first = service.state.apply(Entry(applied + 1, 1, int(clock() * 1000)), command)
    hash1 = service.state.reader.state_hash()
    second = service.state.apply(Entry(applied + 2, 1, int(clock() * 1000)), command)
    assert len(first.data["assigned"]) == 2
    assert second.data["assigned"] == []  # the jobs no longer have the token the plan expected
    jobs_after = service.compaction_jobs()
    assert [(j["name"], j["token"]) for j in jobs_after] == [(a["job"], a["token"]) for a in first.data["assigned"]]
    assert hash1 != service.state.reader.state_hash()  # only the applied index moved
    stale = service.state.apply(Entry(applied + 3, 2, int(clock() * 1000)), command)  # a new term began
    assert stale.reason == "stale-term"


def test_polls_need_a_plan_that_applies(service: MetastoreService) -> None:
    class Refusing(SingleNodeLog):
        def status(self):  # type: ignore[no-untyped-def]
            s = super().status()
            s.term = 7  # the leader thinks it is in term 7, but the log applies in term 1
            return s

    service.log = Refusing(service.state)
    with pytest.raises(MetastoreUnavailableError, match="stale-term"):
        service.poll_compaction(PollRequest(worker="w", capacity=1))
