"""Every reader gives the writer's values, with their meaning, in a Spark session whose time zone is not UTC: a
zone-less timestamp (Avro ``local-timestamp-*``) is a ``timestamp_ntz`` showing the time written; a time of day is
its microseconds since midnight (Spark: no time type by default), a decimal of more than 38 digits its exact
text, a null column ``void``, an empty record ``struct<>``. Hypothesis properties hold ``shale.read``,
``spark.read.format("shale")`` and the topic's Iceberg table (published by the Iceberg publisher to a SQLite
catalog, read by Spark through Iceberg's runtime and by DuckDB's Iceberg extension) to the writer's values over
generated Avro schemas (logical types, nulls, empty records, the widest decimals), JSON Schema documents and
Protobuf messages; a block holding a type no Iceberg table can (a decimal of more than 38 digits) is left out of its
table, logged and counted, never published as another value. ``SHALE_SPARK_VALUES_EXAMPLES`` examples each (5 in
``make test``; the long profile, 200 Avro examples, is ``SHALE_SPARK_VALUES_EXAMPLES=200 pytest
tests/integration/test_spark_values.py``)."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.avro_values import (
    TENANT,
    canonical,
    config_file,
    store,
    store_json_schema,
    store_protobuf,
    writer_rows,
)
from tests.factories import BASE_MS
from tests.iceberg_helpers import run_duckdb
from tests.unit.query.test_avro_values import EVERY_KIND, EVERY_KIND_DATA
from tests.unit.schemas.test_avro_roundtrip import SCHEMAS, data
from tests.unit.schemas.test_jsonschema_roundtrip import ROOTS
from tests.unit.schemas.test_jsonschema_roundtrip import values as json_values
from tests.unit.schemas.test_protobuf_roundtrip import Built, message_specs
from tests.unit.schemas.test_protobuf_roundtrip import _b64 as as_b64
from tests.unit.schemas.test_protobuf_roundtrip import _declared as declared
from tests.unit.schemas.test_protobuf_roundtrip import _set as set_fields
from tests.unit.schemas.test_protobuf_roundtrip import _unordered as unordered
from tests.unit.schemas.test_protobuf_roundtrip import values as proto_values

import shale
from shale.config import BucketConfig, ShaleConfig
from shale.iceberg import IcebergPublisher, open_catalog, spark_catalog_conf
from shale.metastore import MetastoreService, open_metastore
from shale.objstore import open_bucket
from shale.query.datasource import register
from shale.schemas import arrow_type, read_type

ZONE = "America/Los_Angeles"
EXAMPLES = int(os.environ.get("SHALE_SPARK_VALUES_EXAMPLES", "5"))
CATALOG = "spark_values"


@dataclass
class Tables:
    config: ShaleConfig
    publisher: IcebergPublisher


def _beyond_iceberg(t: pa.DataType) -> bool:
    """Whether a column of Shale's read type ``t`` holds a type no Iceberg table can (a decimal of more than 38
    digits, nested or not)."""
    if pa.types.is_decimal(t):
        return bool(t.precision > 38)
    if pa.types.is_struct(t):
        return any(_beyond_iceberg(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_map(t):
        return _beyond_iceberg(t.key_type) or _beyond_iceberg(t.item_type)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _beyond_iceberg(t.value_type)
    return False


def duckdb_scan(metadata_location: str, names: list[str]) -> list[dict[str, Any]]:
    """The columns ``names`` of an Iceberg table read by DuckDB's Iceberg extension (``iceberg_scan`` of its
    metadata file), by offset, as DuckDB writes them to Parquet (its own types, compared exactly)."""
    columns = ", ".join('"' + n.replace('"', '""') + '"' for n in names)
    with tempfile.TemporaryDirectory(prefix="shale-duckdb-") as tmp:
        out = Path(tmp) / "rows.parquet"
        run_duckdb({"copies": {str(out): f"SELECT {columns} FROM iceberg_scan('{metadata_location}') "
                                         f'ORDER BY "offset"'}})
        rows: list[dict[str, Any]] = pq.read_table(out).to_pylist()
        return rows


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> tuple[MetastoreService, BucketConfig, Path]:
    tmp = tmp_path_factory.mktemp("spark-values")
    bucket = BucketConfig(url=f"file://{tmp}/bucket")
    service = open_metastore(ShaleConfig(bucket=bucket, metastore={"data_dir": str(tmp / "ms")}))  # type: ignore[arg-type]
    assert isinstance(service, MetastoreService)
    return service, bucket, config_file(tmp, bucket, tmp / "ms")


@pytest.fixture(scope="module")
def tables(world: tuple[MetastoreService, BucketConfig, Path], spark: Any) -> Tables:
    """The world's topics published as Iceberg tables (a SQLite catalog beside it), read by Spark through Iceberg's
    own runtime and by DuckDB's Iceberg extension."""
    service, bucket, file = world
    config = ShaleConfig.model_validate({
        "bucket": {"url": bucket.url}, "metastore": {"data_dir": str(file.parent / "ms")},
        "iceberg": {"enabled": True, "catalog_name": CATALOG,
                    "catalog_uri": f"sqlite:///{file.parent}/catalog-{CATALOG}.db"}})
    for key, value in spark_catalog_conf(config).items():
        spark.conf.set(key, value)
    return Tables(config, IcebergPublisher(config, service.state.reader, service.submit, open_bucket(bucket)))


@pytest.fixture
def outside_utc(spark: Any) -> Iterator[Any]:
    register(spark)
    before = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", ZONE)
    yield spark
    spark.conf.set("spark.sql.session.timeZone", before)


def _frame(spark: Any, file: Path, topic: str) -> Any:
    return (spark.read.format("shale").option("config", str(file)).option("tenant", TENANT)
            .option("from", str(BASE_MS - 1)).option("to", str(BASE_MS + 3_600_000))
            .option("selector", f'{{topic="{topic}"}}').load())


def _same_values(schema: dict[str, Any], datums: list[Any], file: Path, spark: Any, topic: str,
                 tables: Tables | None = None) -> None:
    """Every reader gives the writer's values of Avro datums (compared in ``canonical`` form)."""
    types = {f["name"]: read_type(arrow_type(schema).field(f["name"]).type) for f in schema["fields"]}
    _readers_give(types, writer_rows(schema, datums), file, spark, topic, tables=tables)


def _readers_give(types: dict[str, pa.DataType], rows: list[dict[str, Any]], file: Path, spark: Any, topic: str,
                  same: Callable[[Any], Any] = lambda rows: rows, tables: Tables | None = None) -> None:
    """``shale.read``, Spark and (with ``tables``) the topic's Iceberg table through Spark and DuckDB give ``rows``
    (each side put through ``same``: Protobuf maps have no order)."""
    names = list(types)

    def canon(got: list[dict[str, Any]]) -> Any:
        return same([{n: canonical(types[n], row[n]) for n in names} for row in got])

    wanted = canon(rows)
    read = shale.read(file, tenant=TENANT, selector=f'{{topic="{topic}"}}', start=BASE_MS - 1,
                      end=BASE_MS + 3_600_000).sort_by("offset")
    assert canon(read.select(names).to_pylist()) == wanted
    sparked = _frame(spark, file, topic).orderBy("offset").select(*(f"`{n}`" for n in names)).toArrow()
    assert canon(sparked.to_pylist()) == wanted
    if tables is None:
        return
    refused = tables.publisher.refused
    tables.publisher.sync()
    assert not [row for row in tables.publisher.status()["failing_tables"] if row["topic"] == topic]
    if any(_beyond_iceberg(types[n]) for n in names):
        # No Iceberg type holds the column: the block is left out of the table, logged and counted (never a
        # different value), and the publisher goes on with every other table.
        assert tables.publisher.refused == refused + 1
        return
    assert tables.publisher.refused == refused
    table = f"{CATALOG}.{TENANT}.`{topic}`"
    iceberged = spark.table(table).orderBy("offset").select(*(f"`{n}`" for n in names)).toArrow()
    assert canon(iceberged.to_pylist()) == wanted
    location = open_catalog(tables.config).load_table((TENANT, topic)).metadata_location
    ducked = duckdb_scan(location, names)
    assert canon(ducked) == wanted


def test_every_kind_of_avro_value_keeps_its_meaning_in_a_session_outside_utc(world, tables, outside_utc) -> None:
    service, bucket, file = world
    topic = store(service, bucket, EVERY_KIND, EVERY_KIND_DATA)
    frame = _frame(outside_utc, file, topic)
    types = dict(frame.dtypes)
    assert types["local"] == "timestamp_ntz"  # was timestamp: a UTC instant, shown 8 hours early in Los Angeles
    assert types["at"] == "timestamp"
    assert types["clock"] == types["clock_ms"] == "bigint"  # was a failure: no Spark type for time64
    assert types["nothing"] == "void"  # was a failure: no Spark type for null
    assert types["wide"] == "string"  # was a failure: decimal(76,10) is beyond Spark's 38 digits
    assert types["empty"] == "struct<>"
    assert types["nested"] == "struct<inner:struct<>,clock:bigint,wide:string>"
    shown = frame.orderBy("offset").selectExpr("cast(local as string)", "cast(local_ms as string)",
                                                 "cast(at as string)", "clock", "clock_ms", "wide").first()
    assert shown[0] == "2026-11-24 08:30:00.123456"  # the wall-clock time written, in any session
    assert shown[1] == "2026-11-24 23:59:59.999"
    assert shown[2] == "2026-11-24 00:30:00"  # an instant: 08:30 UTC is 00:30 in Los Angeles
    assert (shown[3], shown[4]) == (86_399_999_999, 1000)
    assert shown[5] == "-" + "9" * 66 + "." + "9" * 10
    _same_values(EVERY_KIND, EVERY_KIND_DATA, file, outside_utc, topic, tables)  # refused by Iceberg: 76 digits
    # Every other kind through the Iceberg table too (Spark and DuckDB): the same record without its wide decimals.
    narrow = json.loads(json.dumps(EVERY_KIND))
    narrow["fields"] = [f for f in narrow["fields"] if f["name"] != "wide"]
    narrow["fields"][-1]["type"]["fields"].pop()  # nested.wide
    data = [{k: v for k, v in d.items() if k != "wide"}
            | {"nested": {k: v for k, v in d["nested"].items() if k != "wide"}} for d in EVERY_KIND_DATA]
    _same_values(narrow, data, file, outside_utc, store(service, bucket, narrow, data), tables)


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.data())
def test_shale_read_and_spark_give_the_writers_values(world, tables, outside_utc, draw: st.DataObject) -> None:
    service, bucket, file = world
    schema = draw.draw(SCHEMAS)
    datums = draw.draw(st.lists(data(schema), min_size=1, max_size=3))
    _same_values(schema, datums, file, outside_utc, store(service, bucket, schema, datums), tables)


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.data())
def test_json_schema_documents_too(world, tables, outside_utc, draw: st.DataObject) -> None:
    service, bucket, file = world
    schema, arrow = draw.draw(ROOTS)
    pairs = draw.draw(st.lists(json_values(schema), min_size=1, max_size=3))
    topic = store_json_schema(service, bucket, schema, [document for document, _ in pairs])
    _readers_give({f.name: f.type for f in arrow}, [want for _, want in pairs], file, outside_utc, topic,
                  tables=tables)


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.data())
def test_protobuf_messages_too(world, tables, outside_utc, draw: st.DataObject) -> None:
    service, bucket, file = world
    spec = draw.draw(message_specs())
    built = Built(spec)
    pairs = [draw.draw(proto_values(spec)) for _ in range(draw.draw(st.integers(1, 3)))]
    messages = []
    for sets, _ in pairs:
        message = built.message_class()()
        set_fields(message, sets)
        messages.append(message)
    topic = store_protobuf(service, bucket, as_b64(built.file), messages)
    _readers_give(declared(spec), [want for _, want in pairs], file, outside_utc, topic, same=unordered,
                  tables=tables)


def test_a_column_name_spark_would_misread_is_quoted() -> None:
    from shale.query.datasource import spark_ddl
    schema = pa.schema([pa.field("a b", pa.struct([pa.field("c`d", pa.int32()), pa.field("$empty", pa.bool_())]))])
    assert spark_ddl(schema) == "`a b` struct<`c``d`:int,`$empty`:boolean>"
