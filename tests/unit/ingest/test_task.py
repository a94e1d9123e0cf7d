"""An ingest task's chunks: byte-bounded, tiling the planned range; the one commit built from them; and records
that must never stop a group (bad timestamps, a topic whose tenant rule gives no valid tenant)."""

from __future__ import annotations

import itertools
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.factories import BASE_MS, backup_table

from shale.block import backup_rows, read_dataset
from shale.block.layout import block_file_key
from shale.block.schemas import HEADERS
from shale.config import BucketConfig, IngestConfig, ParserRule, TenantRule
from shale.encoder.chunks import Chunk, GroupSpec, Written, decode_written, write_chunk
from shale.errors import ShaleError
from shale.ingest.committer import IngestConflictError, batch_commit
from shale.ingest.plan import BatchPlan, PartitionRange
from shale.ingest.source import COLUMNS
from shale.ingest.task import PHASES, ChunkWriter, make_task, make_warm_task, partition_runs, tasks
from shale.objstore import RequestReport, open_bucket

READ_MS = BASE_MS + 86_400_000
INC = "AAAAAAAAAAAAAAAAAAAAAA"


@pytest.fixture
def bucket_config() -> BucketConfig:
    return BucketConfig(url=f"memory://task-{uuid.uuid4().hex}")


def spark_batch(table: pa.Table) -> pa.RecordBatch:
    """Records as a task's Kafka consumer hands them on (``shale.ingest.source.COLUMNS``)."""
    records = pa.table({
        "key": table.column("key"), "value": table.column("value"), "topic": table.column("topic"),
        "partition": table.column("partition"), "offset": table.column("offset"),
        "timestamp": table.column("timestamp").cast(pa.timestamp("us", tz="UTC")),
        "timestampType": pa.array([0] * table.num_rows, pa.int32()),
        "headers": pa.nulls(table.num_rows, HEADERS)})
    return records.cast(COLUMNS).combine_chunks().to_batches()[0]


def _index(i: int = 0) -> Iterator[pa.RecordBatch]:
    """A task's input: its index, as ``spark.range`` gives it."""
    return iter([pa.RecordBatch.from_pydict({"id": pa.array([i], pa.int64())})])


def _plan(start: int, end: int, partition: int = 0) -> BatchPlan:
    return BatchPlan(READ_MS, [PartitionRange("app", partition, INC, start, end)])


def test_chunks_are_byte_bounded_and_tile_the_planned_range(bucket_config: BucketConfig) -> None:
    bucket = open_bucket(bucket_config)
    spec = GroupSpec("backup", 1, bucket_config, IngestConfig())
    plan = _plan(100, 1_010)  # the last offsets (1,000 to 1,009) hold no record: markers, aborted records
    writer = ChunkWriter(spec, bucket, plan, chunk_bytes=20_000)
    written: list[Written] = []
    for first in range(100, 1_000, 50):
        written += writer.add(spark_batch(backup_table("app", 0, first, 50)))
    written += writer.finish()
    assert len(written) >= 3
    assert written[0].start == 100
    assert written[-1].end == 1_010
    assert all(a.end == b.start for a, b in itertools.pairwise(written))
    assert sum(w.records for w in written) == 900
    for w in written:  # each chunk's blocks hold exactly its records
        rows = read_dataset(bucket, w.blocks[0], "records/app").column("offset").to_pylist()
        assert rows == list(range(w.start, min(w.end, 1_000)))
        assert w.blocks[0].kafka[0].incarnation == INC
    command = batch_commit(written, plan.ranges, group="backup", generation=1, writer="ingest", batch="b")
    [offsets] = command.ranges
    assert (offsets.start, offsets.end, offsets.stored, offsets.incarnation) == (100, 1_010, 900, INC)
    assert len(command.blocks) == len(written)


def test_chunks_shrink_when_the_process_keeps_more_memory_than_expected(bucket_config: BucketConfig) -> None:
    spec = GroupSpec("backup", 1, bucket_config, IngestConfig())
    held: list[int] = []

    def resize(pending: int) -> int:  # the process grew: the next chunks get a tenth of the first size
        held.append(pending)
        return 2_000

    writer = ChunkWriter(spec, open_bucket(bucket_config), _plan(0, 2_000), chunk_bytes=20_000, resize=resize)
    written: list[Written] = []
    for first in range(0, 2_000, 20):
        written += writer.add(spark_batch(backup_table("app", 0, first, 20)))
    written += writer.finish()
    assert held[0] > 0  # measured without the chunk still pending
    assert writer.chunk_bytes == 2_000  # never grows back
    sizes = [w.records for w in written]
    assert sizes[0] > 2 * max(sizes[2:-1])  # the first chunk at 20 kB, the following at about 2 kB
    assert all(a.end == b.start for a, b in itertools.pairwise(written))
    assert sum(sizes) == 2_000


def test_a_task_refuses_records_it_did_not_plan(bucket_config: BucketConfig) -> None:
    spec = GroupSpec("backup", 1, bucket_config, IngestConfig())
    writer = ChunkWriter(spec, open_bucket(bucket_config), _plan(0, 10), chunk_bytes=10**6)
    with pytest.raises(ShaleError, match="outside the planned range"):
        writer.add(spark_batch(backup_table("app", 0, 5, 10)))
    other = ChunkWriter(spec, open_bucket(bucket_config), _plan(0, 10), chunk_bytes=10**6)
    with pytest.raises(ShaleError, match="did not plan"):
        other.add(spark_batch(backup_table("app", 3, 0, 5)))


def test_the_commit_refuses_chunks_that_do_not_tile_the_plan(bucket_config: BucketConfig) -> None:
    spec = GroupSpec("backup", 1, bucket_config, IngestConfig())
    bucket = open_bucket(bucket_config)
    piece = write_chunk(spec, bucket, backup_table("app", 0, 0, 5), Chunk("app", 0, INC, 0, 5, READ_MS))
    with pytest.raises(IngestConflictError, match="do not cover the planned range"):
        batch_commit([piece], _plan(0, 9).ranges, group="backup", generation=1, writer="ingest", batch="b")
    with pytest.raises(IngestConflictError, match="did not plan"):
        batch_commit([piece], [], group="backup", generation=1, writer="ingest", batch="b")


def _stamped(times_ms: list[int]) -> pa.Table:
    table = backup_table("app", 0, 0, len(times_ms))
    return table.set_column(table.schema.get_field_index("timestamp"), "timestamp",
                            pa.array(times_ms, pa.int64()).cast(pa.timestamp("ms", tz="UTC")))


BAD_TIMES = [-1, 1_795_000_000_000_000, READ_MS + 400 * 86_400_000, BASE_MS]
"""No timestamp (-1), microseconds written as milliseconds, far in the future, and a normal one."""


def test_bad_kafka_timestamps_are_stored_as_they_are_with_bounded_block_times(bucket_config: BucketConfig) -> None:
    bucket = open_bucket(bucket_config)
    spec = GroupSpec("backup", 1, bucket_config, IngestConfig())
    result = write_chunk(spec, bucket, _stamped(BAD_TIMES), Chunk("app", 0, INC, 0, 4, READ_MS))
    (meta,) = result.blocks
    stored = read_dataset(bucket, meta, "records/app").column("timestamp").cast(pa.timestamp("ms", tz="UTC"))
    assert stored.cast(pa.int64()).to_pylist() == BAD_TIMES
    assert meta.time_ms == READ_MS  # the block's age counts from when it was read
    assert (meta.min_time, meta.max_time) == (0, READ_MS + 86_400_000)


def test_out_of_range_event_times_are_quarantined_with_the_reason(bucket_config: BucketConfig) -> None:
    bucket = open_bucket(bucket_config)
    parser = ParserRule(parser="json", options={"time_field": "t", "time_format": "epoch_ms"})
    spec = GroupSpec("partition", 1, bucket_config, IngestConfig(parsers=[parser]))
    table = _stamped(BAD_TIMES)
    values = [json.dumps({"t": t}).encode() for t in BAD_TIMES]
    table = table.set_column(table.schema.get_field_index("value"), "value", pa.array(values, pa.binary()))
    result = write_chunk(spec, bucket, table, Chunk("app", 0, INC, 0, 4, READ_MS))
    assert (result.records, result.quarantined) == (4, 3)
    quarantine = next(m for m in result.blocks if m.datasets[0].kind == "quarantine")
    rows = read_dataset(bucket, quarantine, "quarantine/app").select(["offset", "reason"]).to_pylist()
    assert [r["offset"] for r in rows] == [0, 1, 2]
    assert all("outside [1970-01-01, read time + 1 day]" in r["reason"] for r in rows)


def test_a_topic_whose_rule_gives_no_valid_tenant_is_quarantined(bucket_config: BucketConfig) -> None:
    bucket = open_bucket(bucket_config)
    ingest = IngestConfig(tenants=[TenantRule(topic_pattern=r"(?P<team>[A-Za-z]+)\..*", tenant="{team}")])
    spec = GroupSpec("backup", 1, bucket_config, ingest)
    table = backup_table("Billing.events", 0, 0, 3)
    result = write_chunk(spec, bucket, table, Chunk("Billing.events", 0, INC, 0, 3, READ_MS))
    [meta] = result.blocks
    assert (meta.tenant, meta.datasets[0].kind, result.quarantined) == ("default", "quarantine", 3)
    reason = read_dataset(bucket, meta, "quarantine/Billing.events").column("reason")[0].as_py()
    assert "gives no valid tenant for topic 'Billing.events'" in reason
    fine = write_chunk(spec, bucket, backup_table("billing.events", 0, 0, 3),
                       Chunk("billing.events", 0, INC, 0, 3, READ_MS))
    assert fine.blocks[0].tenant == "billing"


def test_a_chunk_whose_every_record_is_rejected(bucket_config: BucketConfig) -> None:
    parser = ParserRule(parser="json", options={"time_field": "t", "time_format": "epoch_ms"})
    spec = GroupSpec("partition", 1, bucket_config, IngestConfig(parsers=[parser]))
    result = write_chunk(spec, open_bucket(bucket_config), backup_table("app", 0, 0, 3),
                         Chunk("app", 0, INC, 0, 3, READ_MS))
    assert (result.records, result.quarantined) == (3, 3)


def test_a_task_reports_where_its_time_went_per_chunk(bucket_config: BucketConfig) -> None:
    spec = GroupSpec("backup", 1, bucket_config, IngestConfig())
    batches = [spark_batch(backup_table("app", 0, first, 50)) for first in range(0, 1_000, 50)]

    def slow_source() -> Iterator[pa.RecordBatch]:
        for batch in batches:
            time.sleep(0.01)  # Spark's JVM taking its time to hand over the next batch
            yield batch

    rows = list(make_task(spec, _plan(0, 1_000), 512 * 2**20, lambda _: slow_source())(_index()))
    written = [w for row in rows for text in row.column("written").to_pylist() if text for w in decode_written(text)]
    assert written
    assert all(set(w.seconds) <= set(PHASES) for w in written)
    total = {phase: sum(w.seconds.get(phase, 0.0) for w in written) for phase in PHASES}
    assert total["wait"] >= 0.2  # twenty batches, each 10 ms late, and no wait lost between chunks
    assert all(total[phase] > 0 for phase in ("normalize", "encode", "upload"))


@pytest.mark.parametrize("group", ["backup", "partition"])
def test_the_warm_up_rehearses_a_batch_and_writes_nothing_to_the_bucket(bucket_config: BucketConfig,
                                                                         group: str) -> None:
    ingest = IngestConfig(parsers=[ParserRule(topic_pattern="app", parser="json",
                                              options={"time_field": "ts", "time_format": "epoch_ms"})])
    spec = GroupSpec(group, 1, bucket_config, ingest)
    table = backup_table("app", 0, 500, 40)
    warm = make_warm_task(spec, _plan(500, 540), 512 * 2**20,
                          lambda _: iter([spark_batch(table.slice(0, 25)), spark_batch(table.slice(25))]))
    [out] = list(warm(_index()))
    [row] = out.to_pylist()
    assert row["records"] == 40
    seconds = json.loads(row["seconds"])
    assert set(seconds) <= set(PHASES)
    assert seconds["encode"] > 0  # the records were parsed and encoded
    assert list(open_bucket(bucket_config).list()) == []  # rehearsed in a scratch bucket only


@st.composite
def partitions_in_turn(draw: st.DrawFn) -> tuple[list[tuple[int, int, int]], list[int]]:
    """(partition, first offset, records) of the partitions one task reads in turn, and where Spark cuts the stream
    of their records into Arrow batches (a batch may hold the end of one partition and the start of the next)."""
    chosen = draw(st.lists(st.integers(0, 7), min_size=1, max_size=4, unique=True))
    parts = [(p, draw(st.integers(0, 50)), draw(st.integers(0, 120))) for p in chosen]
    total = sum(n for _, _, n in parts)
    cuts = sorted(draw(st.sets(st.integers(1, max(1, total - 1)), max_size=6))) if total > 1 else []
    return parts, cuts


@given(partitions_in_turn())
@settings(max_examples=40, deadline=None)
def test_a_task_of_several_partitions_tiles_each_one_s_range_whatever_the_batches(
        drawn: tuple[list[tuple[int, int, int]], list[int]]) -> None:
    parts, cuts = drawn
    bucket_config = BucketConfig(url=f"memory://task-{uuid.uuid4().hex}")
    spec = GroupSpec("backup", 1, bucket_config, IngestConfig(max_task_bytes=512 * 2**20))
    # Each planned range ends 3 offsets after its last record (commit markers), as a read_committed read does.
    plan = BatchPlan(READ_MS, [PartitionRange("app", p, INC, first, first + n + 3) for p, first, n in parts])
    stream = pa.concat_tables([backup_table("app", p, first, n) for p, first, n in parts])
    bounds = [0, *cuts, stream.num_rows] if stream.num_rows else []
    batches = [spark_batch(stream.slice(a, b - a)) for a, b in itertools.pairwise(bounds)]
    rows = list(make_task(spec, plan, 512 * 2**20, lambda _: iter(batches))(_index()))
    written = [w for r in rows for text in r.column("written").to_pylist() if text for w in decode_written(text)]
    bucket = open_bucket(bucket_config)
    for p, first, n in parts:
        mine = [w for w in written if w.partition == p]
        if n == 0:
            assert mine == []  # no record: the driver records the range with an empty block
            continue
        assert mine[0].start == first
        assert mine[-1].end == first + n + 3
        assert all(a.end == b.start for a, b in itertools.pairwise(mine))
        blocks = {m.id: m for w in mine for m in w.blocks}.values()
        stored = [o for m in blocks for part, o in zip(*read_dataset(bucket, m, "records/app").select(
            ["partition", "offset"]).to_pydict().values(), strict=True) if part == p]
        assert stored == list(range(first, first + n))
    # Everything fits one chunk here: one block for all the partitions read, whose row groups each hold one
    # partition's records, as its table of contents says.
    blocks = {m.id: m for w in written for m in w.blocks}
    assert len(blocks) == (1 if written else 0)
    for meta in blocks.values():
        assert sorted(r.partition for r in meta.kafka) == sorted(p for p, _, n in parts if n)
        for p, first, n in parts:  # a reader of one partition fetches its row groups only, and gets its records
            rows = backup_rows(bucket, meta, "app", p, first, first + n)
            assert [o for t in rows for o in t.column("offset").to_pylist()] == list(range(first, first + n))
        [dataset] = meta.datasets
        groups = pq.ParquetFile(pa.BufferReader(bucket.get(block_file_key(meta, dataset.file))))
        named = dataset.row_group_partitions or [meta.kafka[0].partition] * groups.num_row_groups
        assert [set(groups.read_row_group(i, columns=["partition"]).column(0).to_pylist())
                for i in range(groups.num_row_groups)] == [{p} for p in named]


class CountingReader:
    """A bucket reader that counts whole-object GETs."""

    def __init__(self, bucket: Any) -> None:
        self.bucket, self.gets = bucket, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.bucket, name)

    def get(self, key: str) -> bytes:
        self.gets += 1
        return bytes(self.bucket.get(key))


def test_reading_each_partition_of_a_small_block_fetches_it_once(bucket_config: BucketConfig) -> None:
    spec = GroupSpec("backup", 1, bucket_config, IngestConfig())
    plan = BatchPlan(READ_MS, [PartitionRange("app", p, INC, 0, 10) for p in range(4)])
    batches = [spark_batch(backup_table("app", p, 0, 10)) for p in range(4)]
    written = [w for r in make_task(spec, plan, 512 * 2**20, lambda _: iter(batches))(_index())
               for text in r.column("written").to_pylist() if text for w in decode_written(text)]
    [meta] = {m.id: m for w in written for m in w.blocks}.values()
    bucket = CountingReader(open_bucket(bucket_config))
    for p in range(4):  # as restore's and reprocess's tasks do, one partition each, in one worker
        rows = backup_rows(bucket, meta, "app", p, 0, 10)
        assert [(r["partition"], r["offset"]) for t in rows for r in t.select(["partition", "offset"]).to_pylist()
                ] == [(p, o) for o in range(10)]
    assert bucket.gets == 1


def test_a_partition_seen_again_after_another_fails_the_task(bucket_config: BucketConfig) -> None:
    spec = GroupSpec("backup", 1, bucket_config, IngestConfig())
    plan = BatchPlan(READ_MS, [PartitionRange("app", 0, INC, 0, 20), PartitionRange("app", 1, INC, 0, 10)])
    batches = [spark_batch(backup_table("app", 0, 0, 10)), spark_batch(backup_table("app", 1, 0, 10)),
               spark_batch(backup_table("app", 0, 10, 10))]
    with pytest.raises(ShaleError, match=r"app\[0\] again"):
        list(make_task(spec, plan, 512 * 2**20, lambda _: iter(batches))(_index()))


@given(st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 2), st.integers(1, 5)), min_size=1, max_size=6))
def test_partition_runs_cut_a_batch_exactly_where_its_partition_changes(
        runs: list[tuple[str, int, int]]) -> None:
    tables = [backup_table(t, p, 0, n) for t, p, n in runs]
    batch = spark_batch(pa.concat_tables(tables))
    cut = partition_runs(batch)
    assert pa.Table.from_batches(cut, batch.schema).equals(pa.Table.from_batches([batch]))
    keys = [(r.column("topic")[0].as_py(), r.column("partition")[0].as_py()) for r in cut]
    assert all(len(set(zip(r.column("topic").to_pylist(), r.column("partition").to_pylist(), strict=True))) == 1
               for r in cut)
    assert all(a != b for a, b in itertools.pairwise(keys))


def test_an_empty_batch_has_no_runs() -> None:
    assert partition_runs(spark_batch(backup_table("a", 0, 0, 1)).slice(0, 0)) == []


def test_a_batch_gets_no_more_tasks_than_spark_has_cores() -> None:
    assert [tasks(ranges, 2) for ranges in (0, 1, 2, 8)] == [1, 1, 2, 2]
    assert tasks(8, 16) == 8


def test_a_task_returns_the_requests_it_made_and_its_puts_are_the_objects_it_wrote(
        bucket_config: BucketConfig) -> None:
    # A task runs in a Python worker that no one scrapes: its requests travel with its result (issue 59).
    spec = GroupSpec("backup", 1, bucket_config, IngestConfig())
    plan = BatchPlan(READ_MS, [PartitionRange("app", p, INC, 0, 200) for p in range(3)])
    batches = [spark_batch(backup_table("app", p, 0, 200)) for p in range(3)]
    rows = [r for b in make_task(spec, plan, 512 * 2**20, lambda _: iter(batches))(_index()) for r in b.to_pylist()]
    [report] = [RequestReport.model_validate_json(r["requests"]) for r in rows if r["requests"] is not None]
    objects = list(open_bucket(bucket_config).list(""))
    assert objects
    assert report.total("put", bucket=bucket_config.url) == len(objects)
    assert {c.bucket for c in report.counts} == {bucket_config.url}
