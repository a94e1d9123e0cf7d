"""The query path (``shale.read``, ``run_query``, ``shale query``) gives back the writer's value of every Avro type:
logical types, nulls, zone-less timestamps, the widest decimals and records with no fields (stored with a marker,
``shale.schemas.empty``, read back as the empty record the writer wrote)."""

from __future__ import annotations

import datetime as dt
import decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.avro_values import TENANT, store, writer_rows
from tests.factories import BASE_MS
from tests.unit.schemas.test_avro_roundtrip import SCHEMAS, data

from shale.config import BucketConfig
from shale.metastore import MetastoreService, SingleNodeLog, StateMachine
from shale.objstore import open_bucket
from shale.query import Query, run_query
from shale.schemas import read_type

EMPTY: dict[str, Any] = {"type": "record", "name": "Nothing", "fields": []}
WIDE = {"type": "bytes", "logicalType": "decimal", "precision": 76, "scale": 10}
EVERY_KIND: dict[str, Any] = {"type": "record", "name": "Every", "namespace": "t", "fields": [
    {"name": "local", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
    {"name": "local_ms", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    {"name": "clock", "type": {"type": "long", "logicalType": "time-micros"}},
    {"name": "clock_ms", "type": {"type": "int", "logicalType": "time-millis"}},
    {"name": "nothing", "type": "null"},
    {"name": "wide", "type": WIDE},
    {"name": "empty", "type": EMPTY},
    {"name": "maybe_empty", "type": ["null", "Nothing"]},
    {"name": "empties", "type": {"type": "array", "items": "Nothing"}},
    {"name": "nested", "type": {"type": "record", "name": "Outer", "fields": [
        {"name": "inner", "type": "Nothing"}, {"name": "clock", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "wide", "type": WIDE}]}},
]}
EVERY_KIND_DATA = [{
    "local": dt.datetime(2026, 11, 24, 8, 30, 0, 123456), "local_ms": dt.datetime(2026, 11, 24, 23, 59, 59, 999000),
    "at": dt.datetime(2026, 11, 24, 8, 30, tzinfo=dt.UTC), "clock": dt.time(23, 59, 59, 999999),
    "clock_ms": dt.time(0, 0, 0, 1000), "nothing": None,
    "wide": decimal.Decimal("-" + "9" * 66 + "." + "9" * 10), "empty": {}, "maybe_empty": None if i else {},
    "empties": [{}] * i, "nested": {"inner": {}, "clock": dt.time(12), "wide": decimal.Decimal("1E-10")},
} for i in range(3)]


def _service(tmp: Path) -> MetastoreService:
    state = StateMachine(tmp / "state.db")
    return MetastoreService(state, SingleNodeLog(state))


def read(service: MetastoreService, bucket: BucketConfig, topic: str) -> pa.Table:
    query = Query(TENANT, BASE_MS - 1, BASE_MS + 3_600_000, f'{{topic="{topic}"}}')
    return run_query(query, service, open_bucket(bucket)).read_all().sort_by("offset")


def test_every_kind_of_avro_value_comes_back_as_the_writer_wrote_it(tmp_path: Path) -> None:
    service, bucket = _service(tmp_path), BucketConfig(url=f"file://{tmp_path}/bucket")
    table = read(service, bucket, store(service, bucket, EVERY_KIND, EVERY_KIND_DATA))
    assert table.schema.field("empty").type == pa.struct([])  # the marker is storage's, never the reader's
    assert table.schema.field("local").type == pa.timestamp("us")
    assert table.schema.field("wide").type == pa.decimal256(76, 10)
    names = [f["name"] for f in EVERY_KIND["fields"]]
    assert table.select(names).to_pylist() == writer_rows(EVERY_KIND, EVERY_KIND_DATA)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(st.data())
def test_any_avro_datum_comes_back_from_a_query_as_the_writer_wrote_it(tmp_path: Path, draw: st.DataObject) -> None:
    schema = draw.draw(SCHEMAS)
    datums = draw.draw(st.lists(data(schema), min_size=1, max_size=3))
    (tmp_path / "example").mkdir(exist_ok=True)
    service = _service(tmp_path / "example")
    bucket = BucketConfig(url=f"file://{tmp_path}/bucket")
    table = read(service, bucket, store(service, bucket, schema, datums))
    names = [f["name"] for f in schema["fields"]]
    assert table.select(names).to_pylist() == writer_rows(schema, datums)


def test_shale_query_writes_an_empty_record_to_parquet_with_its_marker(tmp_path: Path) -> None:
    from shale.query.output import write_parquet
    schema = pa.schema([pa.field("n", pa.int64()), pa.field("e", pa.list_(pa.struct([])))])
    batch = pa.RecordBatch.from_pylist([{"n": 1, "e": [{}]}, {"n": 2, "e": None}], schema=schema)
    write_parquet(schema, iter([batch]), str(tmp_path / "out.parquet"))  # was: "Cannot write struct type"
    back = pq.read_table(tmp_path / "out.parquet")
    assert back.column("n").to_pylist() == [1, 2]
    assert back.column("e").cast(read_type(back.schema.field("e").type)).to_pylist() == [[{}], None]
