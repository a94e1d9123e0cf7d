"""One chunk of a partition's records into blocks (ranges, partition values, quarantine, tenants, determinism),
and the driver's committer with its dead letter queue."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.factories import BASE_MS, backup_table

from shale.block import read_dataset
from shale.config import BucketConfig, IngestConfig, ParserRule, TenantRule
from shale.encoder.chunks import Chunk, GroupSpec, write_chunk, write_chunks
from shale.encoder.parsing import hour_partitions
from shale.encoder.tenants import TenantMapper
from shale.errors import ConfigError, MetastoreUnavailableError
from shale.index import OffsetRow
from shale.ingest.committer import Committer, IngestConflictError
from shale.metastore import (
    Command,
    CommitIngestBatch,
    DeadLetterQueue,
    MetastoreService,
    OffsetRange,
    Result,
    SingleNodeLog,
    StateMachine,
)
from shale.objstore import open_bucket

JSON_PARSER = ParserRule(parser="json", options={"time_field": "n", "time_format": "epoch_s",
                                                 "label_fields": ["msg"]})


def _table(count: int = 10, bad: tuple[int, ...] = (), start: int = 0) -> pa.Table:
    table = backup_table("app", 0, start, count)
    values = [json.dumps({"n": 1_795_000_000 + (i % 3) * 86_400, "msg": "x" if i % 2 else "y"}).encode()
              for i in range(count)]
    for i in bad:
        values[i] = b"not json"
    return table.set_column(table.schema.get_field_index("value"), "value", pa.array(values, pa.binary()))


@pytest.fixture
def bucket_config() -> BucketConfig:
    return BucketConfig(url=f"memory://ingest-{uuid.uuid4().hex}")


READ_MS = BASE_MS + 7 * 86_400_000  # a week after the records' times


def _chunk(start: int = 0, end: int = 10, incarnation: str = "") -> Chunk:
    return Chunk("app", 0, incarnation, start, end, READ_MS)


def test_backup_block_holds_every_record_verbatim(bucket_config: BucketConfig) -> None:
    bucket = open_bucket(bucket_config)
    table = _table()
    result = write_chunk(GroupSpec("backup", 1, bucket_config, IngestConfig()), bucket, table, _chunk())
    assert (result.start, result.end, result.records, result.quarantined) == (0, 10, 10, 0)
    (meta,) = result.blocks
    assert meta.tenant == "default"
    assert meta.time_ms == READ_MS  # the read time, not a record's time
    assert read_dataset(bucket, meta, "records/app").equals(table)


def test_ids_are_deterministic_per_chunk_and_incarnation(bucket_config: BucketConfig) -> None:
    bucket = open_bucket(bucket_config)
    spec = GroupSpec("backup", 1, bucket_config, IngestConfig())
    first = write_chunk(spec, bucket, _table(), _chunk())
    again = write_chunk(spec, bucket, _table(), _chunk())
    assert [m.id for m in first.blocks] == [m.id for m in again.blocks]
    other = write_chunk(spec, bucket, _table(), _chunk(incarnation="AAAAAAAAAAAAAAAAAAAAAA"))
    assert [m.id for m in other.blocks] != [m.id for m in first.blocks]  # a recreated topic never collides
    assert other.blocks[0].kafka[0].incarnation == "AAAAAAAAAAAAAAAAAAAAAA"


def test_a_chunk_covers_its_whole_range_even_past_its_last_record(bucket_config: BucketConfig) -> None:
    """Offsets without a record (a transaction's commit marker, an aborted record) at the end of the range are
    committed with the chunk, so the blocks of a batch tile the offsets it read."""
    bucket = open_bucket(bucket_config)
    spec = GroupSpec("backup", 1, bucket_config, IngestConfig())
    result = write_chunk(spec, bucket, _table(start=20, count=5), _chunk(15, 31))
    assert [(r.start, r.end) for r in result.blocks[0].kafka] == [(15, 31)]
    empty = write_chunk(spec, bucket, _table(count=0), _chunk(31, 33))
    (meta,) = empty.blocks
    assert (meta.datasets, meta.kafka[0].start, meta.kafka[0].end, empty.records) == ([], 31, 33, 0)


def test_partition_group_splits_by_day_and_quarantines_rejects(bucket_config: BucketConfig) -> None:
    bucket = open_bucket(bucket_config)
    spec = GroupSpec("partition", 1, bucket_config, IngestConfig(parsers=[JSON_PARSER]))
    result = write_chunk(spec, bucket, _table(9, bad=(1, 4)), _chunk(0, 9))
    assert result.quarantined == 2
    by_pv = {json.dumps(m.partition_values): m for m in result.blocks}
    assert sorted(by_pv) == ['{"dt": "2026-11-18"}', '{"dt": "2026-11-19"}', '{"dt": "2026-11-20"}', "{}"]
    quarantine = by_pv["{}"]
    rows = read_dataset(bucket, quarantine, "quarantine/app").to_pylist()
    assert [r["offset"] for r in rows] == [1, 4]
    assert all(r["reason"].startswith("invalid JSON") for r in rows)
    assert {r["parser"] for r in rows} == {"json"}
    day = by_pv['{"dt": "2026-11-18"}']
    assert sorted(tuple(sorted(s.items())) for s in day.datasets[0].labels) == [
        (("dt", "2026-11-18"), ("msg", "x"), ("topic", "app")), (("dt", "2026-11-18"), ("msg", "y"), ("topic", "app"))]
    assert day.parser is not None
    assert day.parser.name == "json"
    assert all(m.kafka[0].start == 0 and m.kafka[0].end == 9 for m in result.blocks)
    stored = sum(m.rows for m in result.blocks)
    assert stored == 9  # every record exactly once: parsed or quarantined


def test_topics_without_a_parser_are_quarantined_not_dropped(bucket_config: BucketConfig) -> None:
    bucket = open_bucket(bucket_config)
    spec = GroupSpec("partition", 1, bucket_config, IngestConfig(parsers=[ParserRule(topic_pattern="other",
                                                                                      parser="json",
                                                                                      options={"time_field": "n"})]))
    result = write_chunk(spec, bucket, _table(3), _chunk(0, 3))
    assert result.quarantined == 3
    rows = read_dataset(bucket, result.blocks[0], "quarantine/app").to_pylist()
    assert "no parser is configured for topic 'app'" in rows[0]["reason"]


def test_tenants_from_rules_and_headers() -> None:
    mapper = TenantMapper.from_config(IngestConfig(tenants=[
        TenantRule(topic_pattern=r"(?P<team>[a-z]+)\.logs", tenant="{team}"),
        TenantRule(topic_pattern="audit", tenant="security")], tenant_header="tenant"))
    assert mapper.for_topic("billing.logs") == ("billing", None)
    assert mapper.for_topic("audit") == ("security", None)
    assert mapper.for_topic("misc") == ("default", None)
    assert mapper.for_header(b"acme") == ("acme", None)
    tenant, problem = mapper.for_header(b"../etc")
    assert tenant is None
    assert problem is not None
    assert "invalid tenant" in problem
    with pytest.raises(ValueError, match="not a named group"):  # refused by the configuration now
        TenantRule(topic_pattern=".*", tenant="{nope}")
    bad = TenantMapper.from_config(IngestConfig(tenants=[TenantRule(topic_pattern="(?P<t>.*)", tenant="{t}")]))
    tenant, problem = bad.for_topic("Bad")  # the template works, but this topic gives no valid tenant
    assert tenant == "default"
    assert problem is not None
    assert "gives no valid tenant" in problem
    with pytest.raises(ConfigError, match="default_tenant"):
        TenantMapper.from_config(IngestConfig(default_tenant="Bad"))


def test_records_with_an_invalid_tenant_header_are_quarantined(bucket_config: BucketConfig) -> None:
    bucket = open_bucket(bucket_config)
    table = _table(3)
    headers = [[{"key": "tenant", "value": b"acme"}], [{"key": "tenant", "value": b"Bad/Name"}], None]
    table = table.set_column(table.schema.get_field_index("headers"), "headers",
                             pa.array(headers, table.schema.field("headers").type))
    spec = GroupSpec("backup", 1, bucket_config, IngestConfig(tenant_header="tenant"))
    result = write_chunk(spec, bucket, table, _chunk(0, 3))
    assert sorted((m.tenant, m.datasets[0].kind, m.rows) for m in result.blocks) == [
        ("acme", "records", 1), ("default", "quarantine", 1), ("default", "records", 1)]


class FlakyMetastore:
    """An embedded metastore that can be switched off (as if unreachable): the committer's ``CommitTarget``."""

    def __init__(self, path: Path) -> None:
        state = StateMachine(path)
        self.inner = MetastoreService(state, SingleNodeLog(state))
        self.up = True

    def _check(self) -> None:
        if not self.up:
            raise MetastoreUnavailableError("down")

    def submit(self, command: Command) -> Result:
        self._check()
        return self.inner.submit(command)

    def offsets(self, group: str | None = None, generation: int | None = None) -> list[OffsetRow]:
        self._check()
        return self.inner.offsets(group, generation)


def _batch(start: int, end: int) -> CommitIngestBatch:
    return CommitIngestBatch(group="backup", ranges=[OffsetRange(topic="app", partition=0, start=start, end=end)],
                             blocks=[])


def test_committer_falls_back_to_the_dlq_in_order_and_drains_it(tmp_path: Path) -> None:
    metastore = FlakyMetastore(tmp_path / "s.db")
    dlq = DeadLetterQueue(open_bucket(BucketConfig(url=f"memory://dlq-{uuid.uuid4().hex}")))
    committer = Committer(metastore, dlq, "backup", 1)
    assert committer.load() == {}
    assert committer.commit(_batch(0, 10)) == "committed"
    metastore.up = False
    assert committer.commit(_batch(10, 20)) == "dead-lettered"
    assert committer.commit(_batch(20, 30)) == "dead-lettered"
    assert committer.committed == {("app", 0): (30, "")}
    assert len(dlq.pending("ingest-backup-g1")) == 2
    metastore.up = True
    assert committer.commit(_batch(30, 40)) == "committed"  # drains 10-20 and 20-30 first, in order
    assert dlq.pending() == []
    assert metastore.inner.offsets("backup")[0].committed_end == 40


def test_committer_keeps_the_switches_its_last_commit_made(tmp_path: Path) -> None:
    """A bucket index delta must carry a generation switch an ingest commit made (DESIGN 10.5): the committer keeps
    them from the commit's result, and logs that its generation serves readers now."""
    from tests.unit.metastore.helpers import meta

    metastore = FlakyMetastore(tmp_path / "s.db")
    committer = Committer(metastore, None, "partition", 1)

    def batch(start: int, end: int) -> CommitIngestBatch:
        return CommitIngestBatch(group="partition", ranges=[OffsetRange(topic="app", partition=0, start=start,
                                                                        end=end)],
                                 blocks=[meta(group="partition", start=start, end=end)])

    assert committer.commit(batch(0, 10)) == "committed"
    assert committer.switches == {"acme": [["app", 0, 2**62, 1]]}  # a topic's first commit: active at every time
    assert committer.commit(batch(10, 20)) == "committed"
    assert committer.switches == {}


def test_committer_stops_on_a_rejected_batch(tmp_path: Path) -> None:
    metastore = FlakyMetastore(tmp_path / "s.db")
    committer = Committer(metastore, None, "backup", 1)
    committer.commit(_batch(0, 10))
    with pytest.raises(IngestConflictError, match="would never be stored"):
        committer.commit(_batch(15, 20))


def test_headers_are_kept_verbatim() -> None:
    from shale.block.schemas import HEADERS
    from shale.encoder.records import normalize

    table = _table(3)
    headers = [None, [{"key": "h1", "value": b"\x00\xffbin"}, {"key": "h2", "value": None}], None]
    consumed = pa.table({
        "key": table.column("key"), "value": table.column("value"), "topic": table.column("topic"),
        "partition": table.column("partition"), "offset": table.column("offset"),
        "timestamp": table.column("timestamp").cast(pa.timestamp("us", tz="UTC")),
        "timestampType": pa.array([0, 0, 0], pa.int32()),
        "headers": pa.array(headers, HEADERS)})
    out = normalize(consumed)
    assert out.column("headers").to_pylist() == [None, [{"key": "h1", "value": b"\x00\xffbin"},
                                                        {"key": "h2", "value": None}], None]
    assert out.column("timestamp").to_pylist() == table.column("timestamp").to_pylist()


def test_available_now_gives_up_after_repeated_batch_failures_and_a_service_keeps_retrying(tmp_path: Path) -> None:
    import threading

    from shale.config import load_config
    from shale.ingest.job import AVAILABLE_NOW_ATTEMPTS, IngestJob
    from shale.ingest.plan import BatchPlan, PartitionRange

    config = load_config(env={}, overrides=["bucket.url=memory://", f"metastore.data_dir={tmp_path}",
                                            "ingest.topic_pattern=app", "ingest.trigger_interval=0.001s"])
    job = IngestJob(config, "backup")
    job.retry_base = 0.001  # a service's delays start at a second (test_trigger.py): not waited for here
    attempts: list[int] = []
    stop = threading.Event()

    def failing_batch(plan: BatchPlan) -> None:
        attempts.append(plan.offsets)
        if len(attempts) == AVAILABLE_NOW_ATTEMPTS + 2:
            stop.set()  # the continuous run retried past the one-shot limit: stop it
        raise RuntimeError("the SparkContext was stopped")

    job.plan = lambda targets=None: BatchPlan(0, [PartitionRange("app", 0, "id", 0, 10)])  # type: ignore[method-assign]
    job._targets = dict  # type: ignore[method-assign]
    job._warm = lambda: None  # type: ignore[method-assign]  # no Spark application in a unit test
    job.run_batch = failing_batch  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="SparkContext was stopped"):
        job.run(available_now=True)
    assert attempts == [10] * AVAILABLE_NOW_ATTEMPTS
    attempts.clear()
    job.run(stop=stop)  # a service rides failures out until it is stopped
    assert len(attempts) == AVAILABLE_NOW_ATTEMPTS + 2


@given(st.lists(st.integers(0, 253_402_300_799_999_999), max_size=50), st.booleans())
def test_each_record_s_dt_and_hour_are_its_own_utc_day_and_hour(micros: list[int], by_hour: bool) -> None:
    day, hour = hour_partitions(pa.array(micros, pa.int64()), by_hour)
    expected = [dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=m) for m in micros]
    assert day.to_pylist() == [e.strftime("%Y-%m-%d") for e in expected]
    assert hour.to_pylist() == [e.hour if by_hour else None for e in expected]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.lists(st.one_of(st.none(), st.binary(max_size=20)), max_size=6)),
                min_size=2, max_size=8, unique_by=lambda pair: pair[0]))
def test_each_range_of_a_chunk_of_several_partitions_counts_its_own_records_and_bytes(
        partitions: list[tuple[int, list[bytes | None]]]) -> None:
    """``write_chunks``' ``Written`` per range against a count by hand: records and value bytes of its partition
    only (counted in one pass since 2026-12-04; a partition with no record counts 0)."""
    config = BucketConfig(url=f"memory://tally-{uuid.uuid4().hex}")
    tables = []
    for partition, values in partitions:
        table = backup_table("app", partition, 0, len(values))
        tables.append(table.set_column(table.schema.get_field_index("value"), "value", pa.array(values, pa.binary())))
    chunks = [Chunk("app", p, "", 0, max(1, len(values)), READ_MS) for p, values in partitions]
    written = write_chunks(GroupSpec("backup", 1, config, IngestConfig()), open_bucket(config),
                           pa.concat_tables(tables), chunks)
    assert [(w.partition, w.records, w.bytes) for w in written] == [
        (p, len(values), sum(len(v) for v in values if v is not None)) for p, values in partitions]
