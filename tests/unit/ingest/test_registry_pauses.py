"""A Schema Registry that does not answer pauses only the partitions that need a schema their task has not cached.

In memory, beside the real Kafka/Apicurio/Spark test (tests/integration/test_typed_tables.py): ingest tasks
(``ChunkWriter``, as Spark runs them) over Avro records against a registry address where nothing listens, schemas
"cached" by remembering them in the process's cache; the batch's commit goes through the real state machine. For
any mix of partitions, exactly the ones that reach an uncached schema id pause, at the first chunk that holds one;
every other offset is committed; once the registry answers, a second batch planned from the committed offsets
stores the rest, and every offset is in the bucket exactly once.
"""

from __future__ import annotations

import io
import itertools
import json
import logging
import socket
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.factories import BASE_MS, backup_table
from tests.unit.bucketindex.helpers import sample

from shale.block import read_dataset
from shale.config import BucketConfig, IngestConfig, ParserRule, SchemaRegistryConfig, load_config
from shale.encoder.chunks import GroupSpec, Written
from shale.errors import RetryableError
from shale.ingest.committer import IngestConflictError, batch_commit
from shale.ingest.job import IngestJob
from shale.ingest.pauses import MAX_DELAY, RegistryBackoff, commit_ranges
from shale.ingest.plan import BatchPlan, Limits, PartitionRange, plan_batch
from shale.ingest.task import ChunkWriter, Paused
from shale.metastore import MetastoreService, SingleNodeLog, StateMachine
from shale.objstore import open_bucket
from shale.schemas import frame
from shale.schemas.registry import RegisteredSchema, RegistryClient, RegistryUnavailableError

READ_MS = BASE_MS + 7 * 86_400_000
DOWN = SchemaRegistryConfig(url="http://127.0.0.1:1/apis/ccompat/v7", timeout=2.0)
"""Nothing listens there: a schema id not remembered in the cache finds the registry down (connection refused)."""
SCHEMA: dict[str, Any] = {"type": "record", "name": "Payment", "fields": [{"name": "n", "type": "long"}]}
_ids = itertools.count(5_000_000)


# --- the pure decision ------------------------------------------------------------------------------------------

@st.composite
def planned_and_paused(draw: st.DrawFn) -> tuple[list[PartitionRange], list[Paused]]:
    count = draw(st.integers(1, 6))
    ranges, paused = [], []
    for partition in range(count):
        start = draw(st.integers(0, 10**9))
        end = start + draw(st.integers(1, 10**6))
        ranges.append(PartitionRange("t", partition, "inc", start, end))
        if draw(st.booleans()):
            paused.append(Paused(topic="t", partition=partition, incarnation="inc",
                                 at=draw(st.integers(start, end)), registry=DOWN.url, error="refused"))
    return ranges, paused


@given(planned_and_paused())
def test_exactly_the_paused_partitions_are_cut_and_every_other_range_is_committed_whole(
        case: tuple[list[PartitionRange], list[Paused]]) -> None:
    ranges, paused = case
    committed = {(r.topic, r.partition): r for r in commit_ranges(ranges, paused)}
    at = {(p.topic, p.partition): p.at for p in paused}
    for r in ranges:
        tp = (r.topic, r.partition)
        if tp not in at:
            assert committed[tp] == r  # not paused: its whole planned range
        elif at[tp] == r.start:
            assert tp not in committed  # paused at its first chunk: nothing to commit, the offset stays
        else:
            assert committed[tp] == PartitionRange(r.topic, r.partition, r.incarnation, r.start, at[tp])


def test_a_pause_outside_the_planned_range_or_of_an_unplanned_partition_is_refused() -> None:
    ranges = [PartitionRange("t", 0, "", 10, 20)]
    for topic, partition, offset in (("t", 0, 21), ("t", 0, 9), ("t", 1, 10), ("u", 0, 10)):
        with pytest.raises(IngestConflictError, match="outside the batch's planned range"):
            commit_ranges(ranges, [Paused(topic=topic, partition=partition, at=offset)])


def test_a_paused_partition_waits_with_a_doubling_delay_and_resumes_once_it_commits() -> None:
    backoff = RegistryBackoff(base=1.0)
    tp = ("t", 0)
    pause = Paused(topic="t", partition=0, at=5, registry=DOWN.url)
    delays = []
    now = 0.0
    for _ in range(8):
        assert backoff.record([pause], [tp, ("t", 1)], now) == []
        delays.append(backoff.held[tp].retry_at - now)
        assert backoff.waiting(now) == {tp}
        assert backoff.waiting(now + delays[-1]) == set()  # due again: the next plan tries it
        now += delays[-1]
    assert delays == [2.0, 4.0, 8.0, 16.0, 32.0, MAX_DELAY, MAX_DELAY, MAX_DELAY]
    assert backoff.record([], [tp], now) == [tp]  # it was planned and nothing paused: the registry answered
    assert backoff.held == {}


def test_a_held_partition_keeps_its_lag_and_reads_nothing() -> None:
    bounds = {("t", 0): (0, 100), ("t", 1): (0, 100)}
    committed = {("t", 0): (40, "inc"), ("t", 1): (40, "inc")}
    plan = plan_batch({"t": "inc"}, bounds, committed, {}, Limits(10_000, 2**30, {("t", 0): 10.0, ("t", 1): 10.0}),
                      READ_MS, held={("t", 1)})
    assert [(r.partition, r.start, r.end) for r in plan.ranges] == [(0, 40, 100)]
    assert plan.held == [("t", 1)]
    assert plan.lag == {("t", 0): 60, ("t", 1): 60}


# --- tasks, commits and the bucket ------------------------------------------------------------------------------

def _remember(schema: dict[str, Any]) -> int:
    sid = next(_ids)
    RegistryClient(DOWN).remember(RegisteredSchema(sid, "AVRO", json.dumps(schema)))
    return sid


def _encode(sid: int, n: int) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(SCHEMA), {"n": n})
    return frame(sid, out.getvalue())


def _records(partition: int, start: int, ids: list[int]) -> pa.Table:
    table = backup_table("pay", partition, start, len(ids))
    values = [_encode(sid, start + i) for i, sid in enumerate(ids)]
    return table.set_column(table.schema.get_field_index("value"), "value", pa.array(values, pa.binary()))


def _run_task(spec: GroupSpec, plan: BatchPlan, r: PartitionRange, table: pa.Table,
              rows_per_batch: int) -> tuple[list[Written], Paused | None]:
    """One ingest task over one partition's range, its records arriving a few at a time as Spark hands them over."""
    bucket = open_bucket(spec.bucket)
    writer = ChunkWriter(spec, bucket, plan, chunk_bytes=600, pausable=True)
    written: list[Written] = []
    piece = table.slice(r.start - int(table.column("offset")[0].as_py()), r.end - r.start)
    for batch in piece.to_batches(max_chunksize=rows_per_batch):
        written += writer.add_table(pa.Table.from_batches([batch]))
    written += writer.finish()
    return written, next(iter(writer.pauses), None)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(partitions=st.lists(st.tuples(st.integers(1, 40), st.one_of(st.none(), st.integers(0, 39))),
                           min_size=1, max_size=4),
       rows_per_batch=st.integers(1, 15))
def test_only_partitions_that_need_an_uncached_schema_pause_and_every_offset_is_stored_once(
        partitions: list[tuple[int, int | None]], rows_per_batch: int) -> None:
    """``partitions``: per partition, its record count and where a schema id no task has cached first appears
    (None: only the cached id)."""
    cached, fresh = _remember(SCHEMA), next(_ids)  # ``fresh`` is registered, but no process has read it yet
    spec = GroupSpec("partition", 1, BucketConfig(url=f"memory://pauses-{uuid.uuid4().hex}"),
                     IngestConfig(parsers=[ParserRule(parser="avro", options={})], schema_registry=DOWN))
    tables, first_fresh = {}, {}
    for p, (count, drawn) in enumerate(partitions):
        new_at = drawn if drawn is not None and drawn < count else None
        first_fresh[p] = new_at
        tables[p] = _records(p, 100, [fresh if new_at is not None and i >= new_at else cached for i in range(count)])
    with tempfile.TemporaryDirectory() as directory:
        state = StateMachine(Path(directory) / "state.db")
        metastore = MetastoreService(state, SingleNodeLog(state))  # the real commit rules
        committed: dict[tuple[str, int], tuple[int, str]] = {}
        blocks = []
        for attempt in ("registry down", "registry answers"):
            if attempt == "registry answers":  # as if the registry answered this process once
                RegistryClient(DOWN).remember(RegisteredSchema(fresh, "AVRO", json.dumps(SCHEMA)))
            bounds = {("pay", p): (100, 100 + t.num_rows) for p, t in tables.items()}
            plan = plan_batch({"pay": ""}, bounds, committed, {},
                              Limits(10**6, 2**40, dict.fromkeys(bounds, 10.0)), READ_MS)
            written, paused = [], []
            for r in plan.ranges:
                w, pause = _run_task(spec, plan, r, tables[r.partition], rows_per_batch)
                written += w
                paused += [pause] if pause is not None else []
            ranges = commit_ranges(plan.ranges, paused)
            if attempt == "registry down":
                assert sorted(p.partition for p in paused) == sorted(p for p, at in first_fresh.items()
                                                                      if at is not None)
                for pause in paused:  # at the chunk that holds the first fresh record, never past it
                    assert 100 <= pause.at <= 100 + (first_fresh[pause.partition] or 0)
                    assert "127.0.0.1:1" in pause.error
                    assert pause.registry == DOWN.url
            else:
                assert paused == []
            if ranges:
                command = batch_commit(written, ranges, group="partition", generation=1, writer="ingest",
                                       batch=attempt)
                result = metastore.submit(command)
                assert result.ok, result.message
                blocks += command.blocks
            committed = {(o.topic, o.partition): (o.committed_end, o.incarnation)
                         for o in metastore.offsets("partition", 1)}
            if attempt == "registry down":
                for p, at in first_fresh.items():
                    end = committed.get(("pay", p), (100, ""))[0]
                    assert end == (100 + tables[p].num_rows if at is None else
                                   next(x.at for x in paused if x.partition == p))
        assert {tp: end for tp, (end, _) in committed.items()} == {
            ("pay", p): 100 + t.num_rows for p, t in tables.items()}
        state.close()
    bucket = open_bucket(spec.bucket)
    stored: dict[int, list[int]] = {p: [] for p in tables}
    for meta in blocks:
        for dataset in meta.datasets:
            assert dataset.kind == "records"  # nothing quarantined for the registry's outage
            rows = read_dataset(bucket, meta, dataset)
            stored[meta.kafka[0].partition] += rows.column("offset").to_pylist()
            assert rows.column("n").to_pylist() == rows.column("offset").to_pylist()
    for p, table in tables.items():
        assert sorted(stored[p]) == list(range(100, 100 + table.num_rows))  # each offset exactly once


@pytest.fixture
def silent_registry() -> Iterator[str]:
    """A real server that accepts connections and never answers: a registry that is slow, not down."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in accepted:
        conn.close()
    server.close()


def test_a_registry_that_times_out_pauses_the_partition_as_one_that_is_down(silent_registry: str) -> None:
    slow = SchemaRegistryConfig(url=silent_registry, timeout=0.3)
    spec = GroupSpec("partition", 1, BucketConfig(url=f"memory://slow-{uuid.uuid4().hex}"),
                     IngestConfig(parsers=[ParserRule(parser="avro", options={})], schema_registry=slow))
    table = _records(0, 0, [next(_ids)] * 5)
    plan = BatchPlan(READ_MS, [PartitionRange("pay", 0, "", 0, 5)])
    written, paused = _run_task(spec, plan, plan.ranges[0], table, 5)
    assert written == []
    assert paused is not None
    assert (paused.at, paused.registry) == (0, silent_registry)
    assert "did not answer" in paused.error
    assert "Timeout" in paused.error


def test_a_reprocess_writer_still_raises_when_the_registry_does_not_answer() -> None:
    spec = GroupSpec("partition", 1, BucketConfig(url=f"memory://raise-{uuid.uuid4().hex}"),
                     IngestConfig(parsers=[ParserRule(parser="avro", options={})], schema_registry=DOWN))
    plan = BatchPlan(READ_MS, [PartitionRange("pay", 0, "", 0, 3)])
    writer = ChunkWriter(spec, open_bucket(spec.bucket), plan, chunk_bytes=600)  # not pausable
    writer.add_table(_records(0, 0, [next(_ids)] * 3))
    with pytest.raises(RegistryUnavailableError, match=r"127\.0\.0\.1:1"):
        writer.finish()


# --- the driver ---------------------------------------------------------------------------------------------------

def _job(tmp_path: Path) -> IngestJob:
    config = load_config(env={}, overrides=["bucket.url=memory://", f"metastore.data_dir={tmp_path}",
                                            "ingest.topic_pattern=pay", "ingest.trigger_interval=1s"])
    return IngestJob(config, "backup")


def test_the_driver_counts_and_logs_a_pause_naming_the_registry_and_the_partitions(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    job = _job(tmp_path)
    plan = BatchPlan(READ_MS, [PartitionRange("pay", 0, "", 0, 10), PartitionRange("pay", 1, "", 0, 10)])
    failures = sample("shale_ingest_registry_failures_total", group="backup")
    with caplog.at_level(logging.INFO, logger="shale.ingest.report"):
        job.report.pauses(plan, [Paused(topic="pay", partition=1, at=4, registry=DOWN.url, error="refused")])
        assert sample("shale_ingest_paused_partitions", group="backup", reason="registry") == 1
        assert sample("shale_ingest_registry_failures_total", group="backup") == failures + 1
        [line] = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert line.__dict__["registry"] == DOWN.url
        assert line.__dict__["partitions"] == ["pay[1]@4"]
        assert line.__dict__["retry_in"] == 2.0

        job.report.pauses(plan, [])  # both planned, none paused: the registry answered
        assert sample("shale_ingest_paused_partitions", group="backup", reason="registry") == 0
        assert any(r.getMessage().startswith("the schema registry answered") and r.__dict__["partitions"] == ["pay[1]"]
                   for r in caplog.records)


def _run_available_now(job: IngestJob, pause: Paused, monkeypatch: pytest.MonkeyPatch) -> list[BatchPlan]:
    """Run ``job`` with --available-now over one partition that pauses with ``pause`` at every batch, with time
    passing instead of being waited for; the batches it ran."""
    now = [1000.0]
    monkeypatch.setattr("shale.ingest.job.time.monotonic", lambda: now[0])
    batches = []

    def plan(targets: object = None) -> BatchPlan:
        held = job.pauses.waiting(now[0])
        return BatchPlan(READ_MS, [] if held else [PartitionRange("pay", 0, "", 0, 10)], lag={("pay", 0): 10},
                         held=sorted(held))

    def batch(planned: BatchPlan) -> str:
        batches.append(planned)
        job.report.pauses(planned, [pause])
        return "paused"

    class Clock(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            now[0] += timeout or 0.0  # time passes instead of being waited for
            return self.is_set()

    job._warm = lambda: None  # type: ignore[method-assign]  # no Spark application in a unit test
    job._targets = dict  # type: ignore[method-assign,assignment]  # no Kafka either
    job.plan = plan  # type: ignore[method-assign]
    job.run_batch = batch  # type: ignore[method-assign]
    job.run(available_now=True, stop=Clock())
    return batches


def test_available_now_reports_a_partition_that_keeps_pausing_instead_of_waiting_for_ever(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job = _job(tmp_path)
    pause = Paused(topic="pay", partition=0, at=0, registry=DOWN.url, error="refused")
    with pytest.raises(RetryableError, match=r"pay\[0\] paused 5 times in a row on the schema registry"):
        _run_available_now(job, pause, monkeypatch)
    assert job.pauses.held[("pay", 0)].failures == 5  # tried again after each delay, never given up on before


@pytest.mark.parametrize("attempts", [1, 2, 7])
def test_available_now_gives_up_after_the_configured_attempts_naming_the_registry_and_what_to_check(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, attempts: int) -> None:
    """Issue 45: a one-shot run against a wrong registry address must end, after a bounded retry the operator
    sets, with an error that names the URL (never a secret) and what to check."""
    config = load_config(env={}, overrides=[
        "bucket.url=memory://", f"metastore.data_dir={tmp_path}", "ingest.topic_pattern=pay",
        "ingest.trigger_interval=1s", "ingest.schema_registry.url=http://127.0.0.1:1/wrong",
        "ingest.schema_registry.username=ops", "ingest.schema_registry.password=hunter2-secret",
        f"ingest.schema_registry.available_now_attempts={attempts}"])
    job = IngestJob(config, "backup")
    with pytest.raises(RegistryUnavailableError) as exc:
        RegistryClient(config.ingest.schema_registry).schema(next(_ids))  # what a task's pause carries
    pause = Paused(topic="pay", partition=0, at=0, registry=exc.value.registry, error=str(exc.value))
    with pytest.raises(RegistryUnavailableError) as given_up:
        _run_available_now(job, pause, monkeypatch)
    message = str(given_up.value)
    assert f"pay[0] paused {attempts} times in a row on the schema registry http://127.0.0.1:1/wrong" in message
    assert "host and port" in message  # what to check, from the registry client's own error
    assert "available_now_attempts" in message
    assert "hunter2" not in message
    assert job.pauses.held[("pay", 0)].failures == attempts


def test_in_one_task_a_topic_whose_schema_is_not_cached_pauses_and_the_others_are_written() -> None:
    """One task reads two topics' partitions into one chunk (a block per topic): the topic whose schema this process
    has not cached pauses at its chunk's start, and the other topic's records are written and committed whole."""
    cached, fresh = _remember(SCHEMA), next(_ids)
    spec = GroupSpec("partition", 1, BucketConfig(url=f"memory://topics-{uuid.uuid4().hex}"),
                     IngestConfig(parsers=[ParserRule(parser="avro", options={})], schema_registry=DOWN))
    pay = _records(0, 0, [cached] * 12)
    refund = _records(0, 0, [fresh] * 8)
    refund = refund.set_column(refund.schema.get_field_index("topic"), "topic", pa.array(["refund"] * 8, pa.string()))
    plan = BatchPlan(READ_MS, [PartitionRange("pay", 0, "", 0, 12), PartitionRange("refund", 0, "", 0, 8)])
    writer = ChunkWriter(spec, open_bucket(spec.bucket), plan, chunk_bytes=10**6, pausable=True)
    written = writer.add_table(pay) + writer.add_table(refund) + writer.finish()
    assert [(p.topic, p.partition, p.at) for p in writer.pauses] == [("refund", 0, 0)]
    assert [(w.topic, w.start, w.end, w.records, w.quarantined) for w in written] == [("pay", 0, 12, 12, 0)]
    ranges = commit_ranges(plan.ranges, writer.pauses)
    command = batch_commit(written, ranges, group="partition", generation=1, writer="ingest", batch="b")
    assert [(r.topic, r.end) for r in command.ranges] == [("pay", 12)]
