"""One partition's records into blocks (trim, ranges, partition values, quarantine, tenants, determinism),
and the driver's committer with its dead letter queue."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from tests.factories import backup_table

from shale.block import read_dataset
from shale.config import BucketConfig, IngestConfig, ParserRule, TenantRule
from shale.errors import ConfigError, MetastoreUnavailableError
from shale.ingest.blocks import GroupSpec, write_partition
from shale.ingest.committer import Committer, IngestConflictError
from shale.ingest.tenants import TenantMapper
from shale.metastore import (
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


def test_backup_block_holds_every_record_verbatim(bucket_config: BucketConfig) -> None:
    bucket = open_bucket(bucket_config)
    table = _table()
    result = write_partition(GroupSpec("backup", 1, bucket_config, IngestConfig()), bucket, table, None)
    assert result is not None
    assert (result.start, result.end, result.records, result.quarantined) == (0, 10, 10, 0)
    (meta,) = result.metas
    assert meta.tenant == "default"
    assert read_dataset(bucket, meta, "records/app").equals(table)


def test_committed_offsets_are_skipped_and_ids_are_deterministic(bucket_config: BucketConfig) -> None:
    bucket = open_bucket(bucket_config)
    spec = GroupSpec("backup", 1, bucket_config, IngestConfig())
    first = write_partition(spec, bucket, _table(), 4)
    again = write_partition(spec, bucket, _table(), 4)
    assert first is not None
    assert again is not None
    assert (first.start, first.end, first.records) == (4, 10, 6)
    assert [m.id for m in first.metas] == [m.id for m in again.metas]
    assert write_partition(spec, bucket, _table(), 10) is None  # everything committed already


def test_a_batch_that_starts_past_the_committed_end_keeps_its_gap_visible(bucket_config: BucketConfig) -> None:
    bucket = open_bucket(bucket_config)
    table = _table(start=20)
    strict = write_partition(GroupSpec("backup", 1, bucket_config, IngestConfig()), bucket, table, 15)
    assert strict is not None
    assert strict.start == 20  # the commit will be rejected as a gap [15, 20)
    relaxed = write_partition(GroupSpec("backup", 1, bucket_config, IngestConfig(allow_offset_gaps=True)), bucket,
                              table, 15)
    assert relaxed is not None
    assert relaxed.start == 15


def test_partition_group_splits_by_day_and_quarantines_rejects(bucket_config: BucketConfig) -> None:
    bucket = open_bucket(bucket_config)
    spec = GroupSpec("partition", 1, bucket_config, IngestConfig(parsers=[JSON_PARSER]))
    result = write_partition(spec, bucket, _table(9, bad=(1, 4)), None)
    assert result is not None
    assert result.quarantined == 2
    by_pv = {json.dumps(m.partition_values): m for m in result.metas}
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
    assert all(m.kafka[0].start == 0 and m.kafka[0].end == 9 for m in result.metas)
    stored = sum(m.rows for m in result.metas)
    assert stored == 9  # every record exactly once: parsed or quarantined


def test_topics_without_a_parser_are_quarantined_not_dropped(bucket_config: BucketConfig) -> None:
    bucket = open_bucket(bucket_config)
    spec = GroupSpec("partition", 1, bucket_config, IngestConfig(parsers=[ParserRule(topic_pattern="other",
                                                                                      parser="json",
                                                                                      options={"time_field": "n"})]))
    result = write_partition(spec, bucket, _table(3), None)
    assert result is not None
    assert result.quarantined == 3
    rows = read_dataset(bucket, result.metas[0], "quarantine/app").to_pylist()
    assert "no parser is configured for topic 'app'" in rows[0]["reason"]


def test_tenants_from_rules_and_headers() -> None:
    mapper = TenantMapper.from_config(IngestConfig(tenants=[
        TenantRule(topic_pattern=r"(?P<team>[a-z]+)\.logs", tenant="{team}"),
        TenantRule(topic_pattern="audit", tenant="security")], tenant_header="tenant"))
    assert mapper.for_topic("billing.logs") == "billing"
    assert mapper.for_topic("audit") == "security"
    assert mapper.for_topic("misc") == "default"
    assert mapper.for_header(b"acme") == ("acme", None)
    tenant, problem = mapper.for_header(b"../etc")
    assert tenant is None
    assert problem is not None
    assert "invalid tenant" in problem
    bad = TenantMapper.from_config(IngestConfig(tenants=[TenantRule(topic_pattern=".*", tenant="{nope}")]))
    with pytest.raises(ConfigError, match="gives no valid tenant"):
        bad.for_topic("x")


def test_records_with_an_invalid_tenant_header_are_quarantined(bucket_config: BucketConfig) -> None:
    bucket = open_bucket(bucket_config)
    table = _table(3)
    headers = [[{"key": "tenant", "value": b"acme"}], [{"key": "tenant", "value": b"Bad/Name"}], None]
    table = table.set_column(table.schema.get_field_index("headers"), "headers",
                             pa.array(headers, table.schema.field("headers").type))
    spec = GroupSpec("backup", 1, bucket_config, IngestConfig(tenant_header="tenant"))
    result = write_partition(spec, bucket, table, None)
    assert result is not None
    assert sorted((m.tenant, m.datasets[0].kind, m.rows) for m in result.metas) == [
        ("acme", "records", 1), ("default", "quarantine", 1), ("default", "records", 1)]


class FlakyMetastore:
    """An embedded metastore that can be switched off (as if unreachable)."""

    def __init__(self, path: Path) -> None:
        state = StateMachine(path)
        self.inner = MetastoreService(state, SingleNodeLog(state))
        self.up = True

    def __getattr__(self, name: str) -> object:
        if not self.up:
            raise MetastoreUnavailableError("down")
        return getattr(self.inner, name)

    def submit_bytes(self, data: bytes) -> Result:
        if not self.up:
            raise MetastoreUnavailableError("down")
        return self.inner.submit_bytes(data)


def _batch(start: int, end: int) -> CommitIngestBatch:
    return CommitIngestBatch(group="backup", ranges=[OffsetRange(topic="app", partition=0, start=start, end=end)],
                             blocks=[])


def test_committer_falls_back_to_the_dlq_in_order_and_drains_it(tmp_path: Path) -> None:
    metastore = FlakyMetastore(tmp_path / "s.db")
    dlq = DeadLetterQueue(open_bucket(BucketConfig(url=f"memory://dlq-{uuid.uuid4().hex}")))
    committer = Committer(metastore, dlq, "backup", 1)  # type: ignore[arg-type]
    assert committer.load() == {}
    assert committer.commit(_batch(0, 10)) == "committed"
    metastore.up = False
    assert committer.commit(_batch(10, 20)) == "dead-lettered"
    assert committer.commit(_batch(20, 30)) == "dead-lettered"
    assert committer.committed == {("app", 0): 30}
    assert len(dlq.pending("ingest-backup-g1")) == 2
    metastore.up = True
    assert committer.commit(_batch(30, 40)) == "committed"  # drains 10-20 and 20-30 first, in order
    assert dlq.pending() == []
    assert metastore.inner.offsets("backup")[0].committed_end == 40


def test_committer_stops_on_a_rejected_batch(tmp_path: Path) -> None:
    metastore = FlakyMetastore(tmp_path / "s.db")
    committer = Committer(metastore, None, "backup", 1)  # type: ignore[arg-type]
    committer.commit(_batch(0, 10))
    with pytest.raises(IngestConflictError, match="would never be stored"):
        committer.commit(_batch(15, 20))


def test_headers_arrive_as_json_and_are_kept_verbatim() -> None:
    from shale.ingest.records import normalize

    table = _table(3)
    spark_like = pa.table({
        "key": table.column("key"), "value": table.column("value"), "topic": table.column("topic"),
        "partition": table.column("partition"), "offset": table.column("offset"),
        "timestamp": table.column("timestamp").cast(pa.timestamp("us", tz="UTC")),
        "timestampType": pa.array([0, 0, 0], pa.int32()),
        "headers_json": pa.array([None, '[{"key":"h1","value":"AP9iaW4="},{"key":"h2"}]', None], pa.string())})
    out = normalize(spark_like)
    assert out.column("headers").to_pylist() == [None, [{"key": "h1", "value": b"\x00\xffbin"},
                                                        {"key": "h2", "value": None}], None]
    assert out.column("timestamp").to_pylist() == table.column("timestamp").to_pylist()
