"""Iceberg tables over the stored blocks, read by Apache Iceberg's own Spark runtime (JDBC catalog on the same
SQLite file, S3FileIO at MinIO): Spark SQL returns exactly the records ``shale query`` returns after ingest,
compaction, a generation switch and retention; the tables hold Shale's objects (no copy) one data file per
object; typed parser columns are typed in the table and Spark SQL reads them exactly before and after a compatible
evolution, a conflicting block being left out; and the publisher killed with SIGKILL between writing Iceberg
metadata and committing it to the catalog publishes, once restarted, every change exactly once."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from tests.iceberg_helpers import (
    HOUR,
    SPARK_COLUMNS,
    T0,
    commit,
    compact,
    query_rows,
    spark_rows,
    typed_block,
    v1_columns,
    v2_columns,
    write_records_block,
)
from tests.waiting import eventually

from shale.config import BucketConfig, ShaleConfig
from shale.dev import MinioServer
from shale.failpoints import paused
from shale.iceberg import IcebergPublisher, open_catalog, spark_catalog_conf
from shale.iceberg.catalog import FAILPOINT_BEFORE_CATALOG_COMMIT, SUMMARY_INDEX, identifier
from shale.iceberg.files import is_copy
from shale.metastore import MetastoreService, SetActiveGeneration, SingleNodeLog, StateMachine, TruncateIndex
from shale.metastore.rules.commands import PartitionKey
from shale.objstore import open_bucket
from shale.query.plan import active_intervals

ROOT = Path(__file__).resolve().parents[2]
TENANT, TOPIC = "acme", "app"


def _config(bucket: BucketConfig, work: Path) -> ShaleConfig:
    return ShaleConfig.model_validate({
        "bucket": bucket.model_dump(), "metastore": {"data_dir": str(work / "metastore")},
        "iceberg": {"enabled": True, "catalog_uri": f"sqlite:///{work}/catalog.db"}})


@pytest.fixture(scope="module")
def module_bucket(minio: MinioServer) -> BucketConfig:
    name = f"ice-{uuid.uuid4().hex[:10]}"
    minio.create_bucket(name)
    return BucketConfig(url=f"s3://{name}", endpoint=minio.endpoint, access_key_id=minio.access_key,
                        secret_access_key=minio.secret_key, allow_http=True)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("iceberg")


@pytest.fixture(scope="module")
def iceberg_spark(spark: Any, module_bucket: BucketConfig, work: Path) -> Any:
    """The test process's Spark session (it has Iceberg's runtime, the AWS bundle and the SQLite JDBC driver) with
    Iceberg's own catalog over this module's catalog and bucket, configured through Spark conf (credentials
    included: never on a command line)."""
    for key, value in spark_catalog_conf(_config(module_bucket, work)).items():
        spark.conf.set(key, value)
    return spark


def _spark(spark: Any, start: int, end: int) -> object:
    return spark_rows(spark.sql(
        f"SELECT {SPARK_COLUMNS} FROM shale.{TENANT}.{TOPIC} WHERE event_time >= timestamp_millis({start}) "
        f"AND event_time <= timestamp_millis({end})").collect())


def _objects_listed(service: MetastoreService) -> tuple[int, int]:
    """The data objects the index lists for the table: records datasets of the topic's partition-group blocks whose
    generation is active somewhere in their time range (the query path's rule); and how many of them a switch cuts."""
    rules = service.generation_rules(TENANT)
    listed = cut = 0
    for b in service.state.reader.tenant_blocks(TENANT):
        for d in b.datasets:
            if b.group != "partition" or d.kind != "records" or d.topic != TOPIC or not d.rows:
                continue
            spans = active_intervals(rules, TOPIC, b.generation, 1, d.min_time, d.max_time)
            listed += bool(spans)
            cut += bool(spans) and spans != [(d.min_time, d.max_time)]
    return listed, cut


def test_spark_sql_reads_what_shale_query_returns(iceberg_spark, module_bucket: BucketConfig, work: Path) -> None:
    config = _config(module_bucket, work)
    bucket = open_bucket(config.bucket)
    state = StateMachine(work / "metastore" / "state.db")
    service = MetastoreService(state, SingleNodeLog(state))
    publisher = IcebergPublisher(config, state.reader, service.submit, bucket)
    ranges = [(0, T0 + 8 * HOUR), (T0 + HOUR, T0 + 2 * HOUR), (T0 + HOUR + 723_456, T0 + 3 * HOUR - 1)]

    def check(stage: str) -> None:
        publisher.sync()
        for start, end in ranges:
            expected = query_rows(service, bucket, TENANT, TOPIC, start, end)
            assert expected, stage
            assert _spark(iceberg_spark, start, end) == expected, f"{stage}: [{start}, {end}]"
        files = iceberg_spark.sql(f"SELECT file_path FROM shale.{TENANT}.{TOPIC}.files").collect()
        listed, cut = _objects_listed(service)
        assert len(files) == listed, stage  # one data file per Shale object
        copies = [f.file_path for f in files if is_copy(f.file_path)]
        assert len(copies) == cut, stage  # only objects a generation switch cuts are copied

    blocks = {p: [write_records_block(bucket, TENANT, TOPIC, p, i * 200, 200, T0 + i * HOUR // 2 + p * 7,
                                      step_ms=9_000 + p) for i in range(6)] for p in (0, 1)}
    for i in range(6):
        commit(service, [blocks[0][i], blocks[1][i]])
    check("after ingest")
    assert len(publisher.catalog.load_table(identifier(TENANT, TOPIC)).snapshots()) == 6  # one per commit

    compact(service, bucket, blocks[0][:3])
    compact(service, bucket, blocks[1][:3])
    check("after compaction")

    g2 = [write_records_block(bucket, TENANT, TOPIC, p, 0, 1200, T0 + p * 7, step_ms=9_000 + p, generation=2,
                              columns=("level", "msg", "host"), block_time_ms=T0 + 6 * HOUR) for p in (0, 1)]
    commit(service, g2, generation=2)
    # Generation 2 from 01:10 on: blocks of both generations straddle the switch, so the table shows copies of
    # their active rows (pyiceberg cannot write delete files); the new parser column evolves the schema.
    service.submit(SetActiveGeneration(tenant=TENANT, topic=TOPIC, generation=2, start=T0 + HOUR + 600_000,
                                       end=T0 + 100 * HOUR)).raise_for_rejection()
    check("after a generation switch")
    assert _objects_listed(service) == (4, 4)
    assert "host" in [f.name for f in iceberg_spark.table(f"shale.{TENANT}.{TOPIC}").schema.fields]

    before = len(state.reader.tenant_blocks(TENANT))
    oldest = state.reader.partitions(TENANT)[0]
    service.submit(TruncateIndex(prepared_term=1, cutoffs={TENANT: 2**53}, partitions=[
        PartitionKey(tenant=TENANT, shard=oldest.shard, window_start=oldest.window_start)])).raise_for_rejection()
    check("after retention")  # the oldest creation window is gone, the rest remains
    assert 0 < len(state.reader.tenant_blocks(TENANT)) < before
    table = publisher.catalog.load_table(identifier(TENANT, TOPIC))
    assert table.properties["gc.enabled"] == "false"
    indexes = [int(s.summary.additional_properties[SUMMARY_INDEX]) for s in table.snapshots()]
    assert indexes == sorted(set(indexes))  # one snapshot per change, in log order


def test_spark_sql_reads_typed_columns_before_and_after_a_compatible_evolution(
        iceberg_spark, module_bucket: BucketConfig, work: Path) -> None:
    """Issue 31: typed parser columns (a decimal, a timestamp, a nested struct, a uint64, a list, a map) are typed
    in the Iceberg table and Spark SQL reads them exactly; a compatible change (int -> long, float -> double, a
    struct gaining a field and widening one, a column dropped, a column added) keeps one table that Spark reads old
    and new rows of, typed."""
    tenant, topic = "typed", "orders"
    config = ShaleConfig.model_validate({  # the module's catalog and bucket, a metastore of its own
        **_config(module_bucket, work).model_dump(include={"bucket", "iceberg"}),
        "metastore": {"data_dir": str(work / "typed-ms")}})
    bucket = open_bucket(config.bucket)
    state = StateMachine(work / "typed-ms" / "state.db")
    service = MetastoreService(state, SingleNodeLog(state))
    publisher = IcebergPublisher(config, state.reader, service.submit, bucket)
    name = f"shale.{tenant}.{topic}"
    select = (f"SELECT offset, amount, unix_micros(placed) AS placed, address, qty, ratio, big, tags, attrs "
              f"FROM {name} ORDER BY offset")

    commit(service, [typed_block(bucket, tenant, topic, 0, 3, v1_columns(0, 3))])
    publisher.sync()
    types = dict(iceberg_spark.table(name).dtypes)
    assert {c: types[c] for c in ("amount", "placed", "address", "qty", "ratio", "big", "tags", "attrs")} == {
        "amount": "decimal(10,2)", "placed": "timestamp", "address": "struct<city:string,zip:int>", "qty": "int",
        "ratio": "float", "big": "decimal(20,0)", "tags": "array<string>", "attrs": "map<string,bigint>"}
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    placed = [(dt.datetime(2026, 1, 1, 12, 0, 0, o, tzinfo=dt.UTC) - epoch) // dt.timedelta(microseconds=1)
              for o in range(3)]
    old = [(o, decimal.Decimal(f"{o}.25"), placed[o], {"city": f"c{o}", "zip": o}, o, o / 4,
            decimal.Decimal(2**64 - 1 - o), [f"t{o}"], {"k": o}) for o in range(3)]
    got = [(r.offset, r.amount, r.placed, r.address.asDict(), r.qty, r.ratio, r.big, r.tags, r.attrs)
           for r in iceberg_spark.sql(select).collect()]
    assert got == old

    commit(service, [typed_block(bucket, tenant, topic, 3, 2, v2_columns(3, 2))])
    publisher.sync()
    types = dict(iceberg_spark.table(name).dtypes)
    assert {c: types[c] for c in ("amount", "address", "qty", "ratio", "note")} == {
        "amount": "decimal(10,2)", "address": "struct<city:string,zip:bigint,country:string>", "qty": "bigint",
        "ratio": "double", "note": "string"}
    new_placed = (dt.datetime(2026, 1, 2, tzinfo=dt.UTC) - epoch) // dt.timedelta(microseconds=1)
    expected = [(o, a, p, {**addr, "country": None}, q, r, b, t, m) for o, a, p, addr, q, r, b, t, m in old] + [
        (o, None, new_placed, {"city": f"c{o}", "zip": 2**40 + o, "country": "NZ"}, 2**40 + o, o / 3,
         decimal.Decimal(o), [f"t{o}"], {"k": o}) for o in (3, 4)]
    rows = iceberg_spark.sql(select.replace(" FROM", ", note FROM")).collect()
    got = [(r.offset, r.amount, r.placed, r.address.asDict(), r.qty, r.ratio, r.big, r.tags, r.attrs)
           for r in rows]
    assert got == expected
    assert [r.note for r in rows] == [None, None, None, "n3", "n4"]
    assert iceberg_spark.sql(f"SELECT sum(amount) AS s FROM {name} WHERE address.zip < 10").first().s == (
        decimal.Decimal("3.75"))

    # An incompatible change (qty long -> string) is left out of the table, counted; Spark still reads the table.
    commit(service, [typed_block(bucket, tenant, topic, 5, 1, v2_columns(5, 1) | {"qty": pa.array(["five"])})])
    publisher.sync()
    assert publisher.status()["refused_files"] == 1
    assert dict(iceberg_spark.table(name).dtypes)["qty"] == "bigint"
    assert [r.offset for r in iceberg_spark.sql(select).collect()] == [0, 1, 2, 3, 4]


def _write_toml(config: ShaleConfig, path: Path) -> Path:
    data = config.model_dump(mode="json", include={"bucket", "metastore", "iceberg"})
    data["bucket"].pop("retry")
    data["bucket"]["secret_access_key"] = config.bucket.secret_access_key.get_secret_value()  # dumped masked
    lines = []
    for section, values in data.items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in values.items() if v not in ({}, [])]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_publisher_killed_between_metadata_and_catalog_commit(minio_bucket: BucketConfig, tmp_path: Path) -> None:
    config = _config(minio_bucket, tmp_path)
    file = _write_toml(config, tmp_path / "shale.toml")
    bucket = open_bucket(config.bucket)
    state = StateMachine(tmp_path / "metastore" / "state.db")
    service = MetastoreService(state, SingleNodeLog(state))
    sync = [sys.executable, "-m", "shale.cli", "--config", str(file), "iceberg", "sync"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHALE_FAILPOINT")}

    commit(service, [write_records_block(bucket, TENANT, TOPIC, 0, 0, 50, T0)])
    first = subprocess.run(sync, check=False, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    for i in range(1, 4):
        commit(service, [write_records_block(bucket, TENANT, TOPIC, 0, i * 50, 50, T0 + i * 60_000)])
    expected_indexes = [c.index for c in _feed(state)]
    assert len(expected_indexes) == 3

    points = tmp_path / "failpoints"
    log = (tmp_path / "killed.log").open("w")
    process = subprocess.Popen(sync, env={**env, "SHALE_FAILPOINTS": FAILPOINT_BEFORE_CATALOG_COMMIT,
                                          "SHALE_FAILPOINT_DIR": str(points)},
                               cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    def reached() -> bool:
        assert process.poll() is None, (tmp_path / "killed.log").read_text()[-3000:]
        return bool(paused(points, FAILPOINT_BEFORE_CATALOG_COMMIT))

    eventually(reached, 240, "the publisher to reach the failpoint")
    process.kill()  # SIGKILL
    process.wait(timeout=30)

    catalog = open_catalog(config)
    table = catalog.load_table(identifier(TENANT, TOPIC))
    assert len(table.snapshots()) == 1  # the new metadata.json was written, the catalog never pointed to it
    written = {i.key for i in bucket.list("_shale/iceberg/") if i.key.endswith(".metadata.json")}
    assert table.metadata_location.removeprefix(f"{config.bucket.url}/") in written
    assert len(written) >= 3

    first = subprocess.run(sync, check=False, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    table = catalog.load_table(identifier(TENANT, TOPIC))
    indexes = [int(s.summary.additional_properties[SUMMARY_INDEX]) for s in table.snapshots()]
    assert indexes[1:] == expected_indexes  # none missing, none twice
    assert len(indexes) == 4
    from tests.iceberg_helpers import rows

    assert rows(table.scan().to_arrow()) == query_rows(service, bucket, TENANT, TOPIC, 0, T0 + HOUR)
    assert len(list(table.scan().plan_files())) == _objects_listed(service)[0] == 4
    assert _feed(state) == []  # trimmed once published


def _feed(state: StateMachine) -> list[Any]:
    from shale.index.changes import read_changes

    return read_changes(state.reader.conn, 0, 2**62)
