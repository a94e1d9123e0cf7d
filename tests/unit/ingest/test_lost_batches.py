"""A lost batch's blocks (issue 54, point 15): a driver killed after its tasks wrote a batch's blocks and before its
commit leaves complete blocks no commit holds. Right after the next holder's commit takes the same offsets, a
reader of the bucket alone (a bucket index built from a bucket scan) must read every record once, without waiting
for the leader's bucket scan. Against the real state machine and lease, the real chunk writer, and a bucket in
memory; Spark and Kafka are left out (the tasks' chunk writer is run in the test's process)."""

from __future__ import annotations

import json
import tempfile
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tests.factories import Clock, backup_table

from shale.block import BlockFetcher, BlockMeta, BlockState, KafkaRange, read_dataset
from shale.bucketindex import live_blocks, scan_index
from shale.config import ShaleConfig, load_config
from shale.encoder import Written
from shale.ingest.job import IngestJob
from shale.ingest.orphans import superseded
from shale.ingest.plan import BatchPlan, PartitionRange
from shale.ingest.task import ChunkWriter
from shale.metastore import MetastoreService, Noop, SingleNodeLog, StateMachine
from shale.objstore import Bucket

INC = "AAAAAAAAAAAAAAAAAAAAAA"  # the topic's Kafka id: its incarnation
T0 = 1_760_000_000.0  # the metastore's clock at the start, seconds (in the past: a block of the future is Fresh)
DAY0_S = int(T0) - 2 * 86_400  # the records' event times: from two days before, an hour apart
LEASE_S = 10


def _records(partition: int, start: int, end: int) -> pa.Table:
    table = backup_table("app", partition, start, end - start, base_ms=int(T0 * 1000))
    values = [json.dumps({"ts": DAY0_S + o * 3600, "msg": f"event {o}"}).encode() for o in range(start, end)]
    return table.set_column(table.schema.get_field_index("value"), "value", pa.array(values, pa.binary()))


def _config(tmp: Path) -> ShaleConfig:
    file = tmp / "shale.toml"
    file.write_text(
        f'[bucket]\nurl = "memory://lost-{uuid.uuid4().hex}"\n[metastore]\ndata_dir = "{tmp}"\n'
        f'[ingest]\ntopics = ["app"]\nlease_duration = "{LEASE_S}s"\n'
        '[[ingest.parsers]]\nparser = "json"\noptions = { time_field = "ts", time_format = "epoch_s" }\n')
    return load_config(file, env={})


class _Tasks:
    """A batch's Spark tasks without Spark: the chunk writer a task runs, over each planned partition's records
    (chunks of a few records, so a batch writes several blocks of several partitions each)."""

    def __init__(self, job: IngestJob, chunk_bytes: int) -> None:
        self.job, self.chunk_bytes = job, chunk_bytes

    def read(self, plan: BatchPlan) -> tuple[list[Written], list[object]]:
        writer = ChunkWriter(self.job.spec, self.job.bucket, plan, self.chunk_bytes)
        written = [w for r in plan.ranges for w in writer.add_table(_records(r.partition, r.start, r.end))]
        return written + writer.finish(), []


def _plan(job: IngestJob, read_ms: int, ends: dict[int, int]) -> BatchPlan:
    """The batch from the job's committed offsets to ``ends`` (partition: end offset), read at ``read_ms``."""
    ranges = [PartitionRange("app", p, INC, start, end) for p, end in sorted(ends.items())
              if end > (start := job.committer.committed.get(("app", p), (0, INC))[0])]
    return BatchPlan(read_ms, ranges, lag={("app", p): 0 for p in ends})


def _job(config: ShaleConfig, group: str, service: MetastoreService, chunk_bytes: int) -> IngestJob:
    job = IngestJob(config, group, metastore=service)
    job.spark = _Tasks(job, chunk_bytes)  # type: ignore[assignment]
    job._check_rules = lambda: None  # type: ignore[method-assign]  # no schema registry here
    job._targets = dict  # type: ignore[method-assign]  # no Kafka either
    return job


def _run(job: IngestJob, plans: Iterator[BatchPlan]) -> None:
    """``shale ingest --available-now`` over the planned batches (each planned when the job asks, from its
    committed offsets; an empty one is passed over): the lease, the committed offsets, each batch and its commit,
    then the lease released."""
    job.plan = lambda targets=None: next((p for p in plans if p.ranges), BatchPlan(0))  # type: ignore[method-assign]
    job.run(available_now=True, stop=threading.Event())


def _expire(service: MetastoreService, clock: Clock) -> None:
    """A lease and a second pass with nobody renewing it, while the log runs (a standby's asks)."""
    for _ in range(LEASE_S + 1):
        clock.now += 1
        service.submit(Noop())


def _read_from_bucket(bucket: Bucket) -> Counter[tuple[int, int]]:
    """Every (partition, offset) a reader of the bucket alone reads: the live blocks of a bucket index built from a
    bucket scan that trusts every complete block at once (sync delay 0), records datasets only."""
    seen: Counter[tuple[int, int]] = Counter()
    for tenant in BlockFetcher(bucket, 0).tenants():
        for meta in live_blocks(scan_index(bucket, tenant, 0, deltas=False)):
            for dataset in meta.datasets:
                if dataset.kind == "records":
                    table = read_dataset(bucket, meta, dataset, columns=["partition", "offset"])
                    seen.update(zip(table["partition"].to_pylist(), table["offset"].to_pylist(), strict=True))
    return seen


def _service(tmp: Path, clock: Clock) -> MetastoreService:
    state = StateMachine(tmp / "state.db")
    return MetastoreService(state, SingleNodeLog(state, clock=clock), clock=clock)


def _takeover(tmp: Path, group: str, committed: dict[int, int], lost: dict[int, int], retaken: list[dict[int, int]],
              chunk_bytes: int) -> tuple[Bucket, MetastoreService, list[str]]:
    """A driver commits up to ``committed``, writes a batch up to ``lost`` and is killed before its commit; after
    its lease expired the next holder runs the ``retaken`` batches. The bucket, the metastore and the lost batch's
    block ids."""
    clock = Clock(T0)
    service = _service(tmp, clock)
    config = _config(tmp)
    killed = _job(config, group, service, chunk_bytes)
    assert killed.lease.wait(threading.Event())
    killed.committer.load()
    if _plan(killed, int(T0 * 1000), committed).ranges:
        assert killed.run_batch(_plan(killed, int(T0 * 1000), committed)) == "committed"
    clock.now += 1
    written, _ = killed.spark.read(_plan(killed, int(clock.now * 1000), lost))  # ... and kill -9: no commit
    _expire(service, clock)
    nxt = _job(config, group, service, chunk_bytes)
    _run(nxt, (_plan(nxt, int((clock.now + 1 + i) * 1000), ends) for i, ends in enumerate(retaken)))
    return nxt.bucket, service, sorted({b.id for w in written for b in w.blocks})


@pytest.mark.parametrize("group", ["partition", "backup"])
def test_a_bucket_only_reader_reads_each_record_once_right_after_the_next_holders_first_commit(
        tmp_path: Path, group: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shale.ingest.job.describe_topics", lambda *args, **kwargs: {})
    bucket, service, lost = _takeover(tmp_path, group, {0: 10, 1: 10}, {0: 25, 1: 18}, [{0: 30, 1: 30}], 600)
    assert {row.partition: row.committed_end for row in service.offsets(group)} == {0: 30, 1: 30}
    seen = _read_from_bucket(bucket)
    assert sorted(seen) == [(p, o) for p in (0, 1) for o in range(30)]
    assert [key for key, n in seen.items() if n > 1] == []  # before the fix: the lost batch's records, twice
    fetcher = BlockFetcher(bucket, 0)
    states = {v.id: v for t in fetcher.tenants() for v in fetcher.sync(t).blocks.values()}
    assert lost
    for block in lost:
        mark = states[block].mark
        assert states[block].state is BlockState.MARKED_FOR_DELETION
        assert mark is not None
        assert mark.reason.startswith("uncommitted: offsets")  # the leader's scan counts these


def test_a_lost_block_that_still_holds_offsets_nobody_committed_is_kept_until_they_are(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lost batch's blocks span partitions 0 and 1; the next holder's first batch reads partition 0 only (1
    paused on the registry, say): a block holding offsets of 1 nobody committed may be their only copy and is kept;
    once the next batch commits them, it is marked with no new LIST."""
    monkeypatch.setattr("shale.ingest.job.describe_topics", lambda *args, **kwargs: {})
    bucket, service, _ = _takeover(tmp_path, "backup", {0: 10, 1: 10}, {0: 14, 1: 14}, [{0: 20}, {0: 20, 1: 20}],
                                   10**6)
    assert {row.partition: row.committed_end for row in service.offsets("backup")} == {0: 20, 1: 20}
    seen = _read_from_bucket(bucket)
    assert sorted(seen) == [(p, o) for p in (0, 1) for o in range(20)]
    assert [key for key, n in seen.items() if n > 1] == []


def test_the_first_driver_of_a_shard_has_nothing_to_look_for_and_lists_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new group or generation (an upgrade's, beside months of the old one's blocks): no lease before, no
    offsets, so no batch can be lost and the bucket is not listed; the next driver looks only from the time its
    predecessor took the lease (less the clock margin), or from the shard's last commit if later."""
    monkeypatch.setattr("shale.ingest.job.describe_topics", lambda *args, **kwargs: {})
    clock = Clock(T0)
    service = _service(tmp_path, clock)
    first = _job(_config(tmp_path), "backup", service, 600)
    listed: list[str] = []
    monkeypatch.setattr(first.orphans.fetcher, "sync", lambda tenant, **kwargs: listed.append(tenant))
    _run(first, (_plan(first, int(T0 * 1000), {0: 10}) for _ in range(1)))
    assert listed == []
    assert not first.orphans.armed
    assert first.lease.previous_ms is None
    clock.now += 5
    second = _job(first.config, "backup", service, 600)
    armed: list[int] = []
    monkeypatch.setattr(second.orphans, "arm", armed.append)
    _run(second, iter([]))
    (last,) = [row.updated_at for row in service.offsets("backup")]
    assert second.lease.previous_ms is not None
    assert second.lease.previous_ms <= last
    assert armed == [last - 60_000]


# --- the rule, as data ------------------------------------------------------------------------------------------

def _meta(*ranges: tuple[int, int, int, str], level: int = 0, parents: tuple[str, ...] = (), generation: int = 1,
          key: str = "") -> BlockMeta:
    from tests.unit.metastore.helpers import meta
    block = meta(key=f"{ranges}{level}{parents}{key}")
    return block.model_copy(update={"level": level, "generation": generation, "group": "backup", "kafka": [
        KafkaRange(topic="app", partition=p, start=s, end=e, incarnation=i) for p, s, e, i in ranges],
        "compaction": block.compaction.model_copy(update={"parents": list(parents)})})


SPANS = {("app", 0, INC): [(10, 30)]}


@pytest.mark.parametrize(("block", "lost"), [
    (_meta((0, 10, 25, INC)), True),  # the lost batch: its offsets are in this holder's commit
    (_meta((0, 25, 40, INC)), True),  # overlapping the commit's end
    (_meta((0, 0, 10, INC)), False),  # committed before the takeover: touches the commit's start, no overlap
    (_meta((0, 30, 40, INC)), False),  # past it
    (_meta((0, 10, 25, "BBBBBBBBBBBBBBBBBBBBBB")), False),  # another incarnation of the topic
    (_meta((0, 10, 25, "")), False),  # incarnation not recorded: the offsets may be another incarnation's
    (_meta((1, 10, 25, INC)), False),  # another partition
    (_meta((0, 10, 25, INC), generation=2), False),  # another generation
    (_meta((0, 10, 25, INC), level=1), False),  # a compaction output
    (_meta((0, 10, 25, INC), parents=("01JD0Z8Q2Y3N4M5P6Q7R8S9T0V",)), False),  # an erasure's or a repair's output
])
def test_what_a_commit_supersedes(block: BlockMeta, lost: bool) -> None:
    assert superseded(block, "backup", 1, SPANS, set()) is lost
    assert superseded(block, "backup", 1, SPANS, {block.id}) is False  # the commit's own block


# --- whatever was lost, once it is committed again a bucket-only reader reads each record once ------------------

@st.composite
def _histories(draw: st.DrawFn) -> tuple[dict[int, int], dict[int, int], list[dict[int, int]], int]:
    """Committed ends before the kill, the lost batch's ends, the next holder's batches (a partition left out of
    one: paused on the registry), the last one reading past everything lost; and the chunk size."""
    partitions = range(draw(st.integers(1, 3)))
    committed = {p: draw(st.integers(0, 8)) for p in partitions}
    lost = {p: committed[p] + draw(st.integers(0, 12)) for p in partitions}
    final = {p: lost[p] + draw(st.integers(0, 6)) for p in partitions}
    batches = [{p: draw(st.integers(committed[p], final[p])) for p in partitions if draw(st.booleans())}
               for _ in range(draw(st.integers(0, 2)))]
    return committed, lost, [*batches, final], draw(st.sampled_from([300, 600, 10**6]))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=_histories(), group=st.sampled_from(["backup", "partition"]))
@example(history=({0: 10, 1: 10}, {0: 25, 1: 18}, [{0: 30, 1: 30}], 600), group="partition")
@example(history=({0: 0}, {0: 5}, [{0: 5}], 600), group="backup")  # killed before its first commit ever
# Found by this property: the next holder's first batch read partition 1 alone, and the lost block of partition 0
# was forgotten after the first sweep (it overlapped nothing committed yet) and never marked.
@example(history=({0: 0, 1: 0}, {0: 1, 1: 0}, [{1: 1}, {0: 1, 1: 1}], 300), group="backup")
def test_whatever_was_lost_a_bucket_only_reader_reads_each_committed_record_once(
        history: tuple[dict[int, int], dict[int, int], list[dict[int, int]], int], group: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shale.ingest.job.describe_topics", lambda *args, **kwargs: {})
    committed, lost, retaken, chunk = history
    with tempfile.TemporaryDirectory() as tmp:
        bucket, service, _ = _takeover(Path(tmp), group, committed, lost, retaken, chunk)
        ends = {row.partition: row.committed_end for row in service.offsets(group)}
        assert ends == {p: e for p, e in retaken[-1].items() if e > 0}
        seen = _read_from_bucket(bucket)
        assert sorted(seen) == [(p, o) for p, e in sorted(ends.items()) for o in range(e)]
        assert [key for key, n in seen.items() if n > 1] == []
        indexed = {b.id for t in service.tenants() for b in service.tenant_blocks(t)}
        fetcher = BlockFetcher(bucket, 0)
        marked = {v.id for t in fetcher.tenants() for v in fetcher.sync(t).blocks.values() if v.mark is not None}
        assert not marked & indexed  # no committed block is ever marked
