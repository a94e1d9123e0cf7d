"""The compaction service in the metastore: two-step plan updates, leases, fencing tokens, completion."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from tests.factories import BASE_MS, Clock
from tests.unit.metastore.helpers import meta, output_of

from shale.block import BlockMeta, Compaction, deletion_mark_key
from shale.compaction.messages import Assigned, JobUpdate, PollRequest
from shale.config import CompactionConfig, RetentionConfig
from shale.errors import MetastoreUnavailableError
from shale.index.compaction_state import CompactionState
from shale.metastore import AddBlocks, MetastoreService, SingleNodeLog, StateMachine, encode
from shale.metastore.api.maintenance import Maintenance
from shale.metastore.rules.commands import (
    PartitionKey,
    ReplaceBlocks,
    Result,
    SetCompactionFailureLimit,
    TruncateIndex,
)
from shale.metastore.rules.compaction_service import plan_command, prepare_plan
from shale.metastore.rules.fsm import Entry
from shale.objstore import open_bucket_url


@pytest.fixture
def clock() -> Clock:
    return Clock(BASE_MS / 1000 + 3600)


@pytest.fixture
def service(tmp_path: Path, clock: Clock) -> MetastoreService:
    state = StateMachine(tmp_path / "s.db")
    config = CompactionConfig(blocks_per_job=[3, 2], lease_duration=10, max_age=10_000)
    svc = MetastoreService(state, SingleNodeLog(state, clock=clock), compaction=config, clock=clock)
    svc.submit(AddBlocks(blocks=[meta(start=i * 10, end=i * 10 + 10) for i in range(7)]))
    return svc


def _output(job: Assigned, key: str = "out") -> BlockMeta:
    return output_of(job.sources, key=key)


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
    out = _output(job)
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
        JobUpdate(job=job.job, token=job.token, status="success", outputs=[_output(job)])]))
    assert stale.updates == {job.job: "lost"}
    assert [j["failures"] for j in service.compaction_jobs() if j["name"] == job.job] == [1]
    ok = service.poll_compaction(PollRequest(worker="w2", capacity=0, updates=[
        JobUpdate(job=job.job, token=again.token, status="success",
                  outputs=[_output(job, key="w2")])]))
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
    assert service.submit(TruncateIndex(prepared_term=1, cutoffs={"acme": 2**53}, partitions=[
        PartitionKey(tenant="acme", shard=0, window_start=window)])).ok
    late = service.poll_compaction(PollRequest(worker="w1", capacity=0, updates=[
        JobUpdate(job=job.job, token=job.token, status="success", outputs=[_output(job)])]))
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


def _apply_twice(service: MetastoreService, request: PollRequest, clock: Clock) -> tuple[Result, Result]:
    """Prepare the poll's plan and apply its command at two log entries (every command is applied twice)."""
    plan = prepare_plan(CompactionState(service.state.reader.conn), request, int(clock() * 1000), service.limits)
    command = encode(plan_command(plan, request, 1, service.limits))
    applied, _ = service.state.applied()
    first = service.state.apply(Entry(applied + 1, 1, int(clock() * 1000)), command)
    second = service.state.apply(Entry(applied + 2, 1, int(clock() * 1000)), command)
    return first, second


def test_a_retried_poll_gets_the_answer_it_got_the_first_time(service: MetastoreService, clock: Clock) -> None:
    # The client's first attempt was applied but its answer lost; the retry (same request id) must neither take
    # more jobs nor lose the ones the lost answer assigned, and its success report must answer "completed".
    first, again = _apply_twice(service, PollRequest(worker="w1", request="r1", capacity=1), clock)
    assert first.data == again.data
    (job,) = [Assigned.model_validate(a) for a in first.data["assigned"]]
    assert len(service.compaction_jobs()) == 1
    out = _output(job)
    report = PollRequest(worker="w1", request="r2", capacity=0, updates=[
        JobUpdate(job=job.job, token=job.token, status="success", outputs=[out])])
    done, retried = _apply_twice(service, report, clock)
    assert done.data["updates"] == retried.data["updates"] == {job.job: "completed"}
    assert service.get_block(out.id) == out
    # The same report in a new poll (the request id forgotten, or a client without one): its effect is in the
    # index, so it answers as applied.
    assert service.poll_compaction(report.model_copy(update={"request": ""})).updates == {job.job: "completed"}
    assert service.poll_compaction(report.model_copy(update={"request": "r3"})).updates == {job.job: "completed"}
    # A report for a job that is gone whose outputs are not in the index is still refused.
    other = _output(job, key="other")
    refused = service.poll_compaction(PollRequest(worker="w1", capacity=0, updates=[
        JobUpdate(job=job.job, token=job.token, status="success", outputs=[other])]))
    assert refused.updates == {job.job: "unknown-job"}


def test_failed_job_sources_go_back_to_the_queue(service: MetastoreService, clock: Clock) -> None:
    (job,) = service.poll_compaction(PollRequest(worker="w1", capacity=1)).assigned
    gone, *survivors = [s.id for s in job.sources]
    assert service.submit(ReplaceBlocks(tenant="acme", sources=[gone], blocks=[], reason="deleted by test")).ok
    queued = sum(service.compaction_queue().values())
    report = PollRequest(worker="w1", capacity=0, updates=[
        JobUpdate(job=job.job, token=job.token, status="success", outputs=[_output(job)])])
    first, second = _apply_twice(service, report, clock)
    assert first.data["updates"] == {job.job: "sources-missing"}
    assert second.data["updates"] == {job.job: "unknown-job"}
    assert service.compaction_jobs() == []
    state = CompactionState(service.state.reader.conn)
    assert state.queued_ids(survivors) == set(survivors)
    assert sum(service.compaction_queue().values()) == queued + len(survivors)
    # They are planned again: with the four other queued blocks they make two new jobs.
    taken = {s.id for a in service.poll_compaction(PollRequest(worker="w2", capacity=5)).assigned for s in a.sources}
    assert set(survivors) <= taken


def test_an_abandoned_job_whose_source_left_is_dropped_not_reassigned(service: MetastoreService,
                                                                      clock: Clock) -> None:
    (job,) = service.poll_compaction(PollRequest(worker="w1", capacity=1)).assigned  # w1 then dies
    gone, *survivors = [s.id for s in job.sources]
    assert service.submit(ReplaceBlocks(tenant="acme", sources=[gone], blocks=[], reason="deleted by test")).ok
    clock.now += 11  # the lease expires
    first, second = _apply_twice(service, PollRequest(worker="w2", capacity=5), clock)
    assert job.job not in {a["job"] for a in first.data["assigned"] + second.data["assigned"]}
    assert job.job not in {j["name"] for j in service.compaction_jobs()}
    assert CompactionState(service.state.reader.conn).queued_ids(survivors) == set(survivors)


@pytest.mark.parametrize(("change", "problem"), [
    (lambda o, j: [], "no outputs for sources holding 30 rows"),
    (lambda o, j: [o.model_copy(update={"tenant": "beta"})], "the job needs acme/0"),
    (lambda o, j: [o.model_copy(update={"level": 0})], "level 0"),
    (lambda o, j: [o.model_copy(update={"group": "partition"})], "partition generation"),
    (lambda o, j: [o.model_copy(update={"generation": 2})], "generation 2"),
    (lambda o, j: [o.model_copy(update={"compaction": Compaction(sources=o.compaction.sources,
                                                                 parents=o.compaction.parents[:2])})],
     "names parents other than the job's sources"),
    (lambda o, j: [o.model_copy(update={"compaction": Compaction(sources=o.compaction.sources[:1],
                                                                 parents=o.compaction.parents)})],
     "lineage"),
    (lambda o, j: [o.model_copy(update={"kafka": [o.kafka[0].model_copy(update={"end": 20})]})], "Kafka offsets"),
    (lambda o, j: [o.model_copy(update={"datasets": [o.datasets[0].model_copy(update={"rows": 31})]})],
     "31 rows for 30 source rows"),
    (lambda o, j: [o.model_copy(update={"id": j.sources[0].id})], "reuse a source's"),
])
def test_a_report_whose_outputs_do_not_account_for_the_sources_is_refused(
        service: MetastoreService, clock: Clock, change: Any, problem: str) -> None:
    (job,) = service.poll_compaction(PollRequest(worker="w1", capacity=1)).assigned
    outputs = change(_output(job), job)
    report = PollRequest(worker="w1", capacity=0, updates=[
        JobUpdate(job=job.job, token=job.token, status="success", outputs=outputs)])
    first, second = _apply_twice(service, report, clock)
    assert first.data["updates"][job.job].startswith("invalid-outputs: ")
    assert problem in first.data["updates"][job.job]
    assert second.data["updates"] == first.data["updates"]
    assert {m.id for m in service.state.reader.tenant_blocks("acme")} >= {s.id for s in job.sources}
    assert service.tombstones() == []


def test_retention_racing_a_compaction_keeps_the_fresh_records(tmp_path: Path, clock: Clock) -> None:
    # Retention reads the state and marks an expired old block; before its TruncateIndex applies, a compaction
    # merges that old block with a fresh one. The output's ULID time is the old block's (the old creation
    # window), its data is fresh: the apply must keep it, and the fresh records with it.
    day_ms = 86_400_000
    old = meta(start=0, end=10, time_ms=BASE_MS)
    fresh = meta(start=10, end=20, time_ms=BASE_MS + 40 * day_ms)
    clock.now = (BASE_MS + 40 * day_ms) / 1000 + 60
    state = StateMachine(tmp_path / "race.db")
    service = MetastoreService(state, SingleNodeLog(state, clock=clock), clock=clock,
                               compaction=CompactionConfig(blocks_per_job=[2]))
    assert service.submit(AddBlocks(blocks=[old, fresh])).ok
    bucket = open_bucket_url(f"memory://race-{uuid.uuid4().hex}")
    maintenance = Maintenance(service, bucket, RetentionConfig(default=30 * 86_400), delete_delay=600,
                              is_leader=lambda: True, term=lambda: 1, clock=clock)
    prepared = maintenance.prepare_retention()
    assert prepared is not None
    command, marks = prepared
    assert [m.id for m in marks["acme"]] == [old.id]

    (job,) = service.poll_compaction(PollRequest(worker="w", capacity=1)).assigned
    out = _output(job)
    assert out.time_ms == old.time_ms
    done = service.poll_compaction(PollRequest(worker="w", capacity=0, updates=[
        JobUpdate(job=job.job, token=job.token, status="success", outputs=[out])]))
    assert done.updates == {job.job: "completed"}

    first, second = service.submit(command), service.submit(command)
    assert (first.data, second.data) == ({"removed": 0, "tombstoned": {}, "links": {}},
                                         {"removed": 0, "tombstoned": {}, "links": {}})
    assert [m.id for m in service.state.reader.tenant_blocks("acme")] == [out.id]
    assert [(r.start, r.end) for r in service.get_block(out.id).kafka] == [(0, 20)]  # type: ignore[union-attr]
    assert [i.key for i in bucket.list("acme/markers/")] == [deletion_mark_key("acme", old.id)]


def test_partition_group_jobs_hold_one_day(tmp_path: Path, clock: Clock) -> None:
    """Blocks of the partition group queue per day (of their smallest event time): a job never mixes days, so a
    compaction output keeps its day (and its key's dt=); the backup group queues as one."""
    state = StateMachine(tmp_path / "s.db")
    svc = MetastoreService(state, SingleNodeLog(state, clock=clock),
                           compaction=CompactionConfig(blocks_per_job=[2], max_age=10_000), clock=clock)
    day = 86_400_000
    start = BASE_MS // day * day
    svc.submit(AddBlocks(blocks=[
        meta(group=group, start=i * 10, end=i * 10 + 10, min_time=start + (i % 2) * day + i)
        for group in ("partition", "backup") for i in range(4)]))
    jobs = svc.poll_compaction(PollRequest(worker="w", capacity=10)).assigned
    days = [{s.min_time // day for s in j.sources} for j in jobs if j.sources[0].group == "partition"]
    assert sorted(len(d) for d in days) == [1, 1]
    assert len({d.pop() for d in days}) == 2
    backup = [{s.min_time // day for s in j.sources} for j in jobs if j.sources[0].group == "backup"]
    assert [len(d) for d in backup] == [2, 2]  # in arrival order, whatever the days
