"""Typed tables end to end: records written with confluent-kafka's AvroSerializer, ProtobufSerializer and
JSONSerializer against the real Schema Registry (Apicurio 3.0.9), read by the partition group on Spark from the real
Kafka broker into MinIO, come back from `shale query`, the Python API and Shale's Spark data source with their types
and exact values; a compatible Avro evolution (a field added with a default) in the middle of the topic keeps one
dataset with typed old and new rows, and the Iceberg table of the topic gives Spark SQL the same types and values;
Avro-encoded keys become a typed column; records the registry cannot explain,
or that their schema refuses, are quarantined with the reason; a registry killed with -9 mid-run pauses only the
topic whose schema the ingest has not cached, and the group catches up by itself once it restarts."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import re
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
from click.testing import CliRunner
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from tests.integration.ingest_helpers import (
    config_of,
    create_topic,
    finish,
    ingest_process,
    publish_to_iceberg,
    write_config,
)
from tests.producing import CheckedProducer
from tests.waiting import eventually

from shale.block import read_dataset
from shale.cli import cli
from shale.config import BucketConfig
from shale.dev import KafkaBroker, SchemaRegistry
from shale.objstore import open_bucket
from shale.process import free_port
from shale.query import Query, run_query
from shale.query.datasource import register
from shale.query.sources import open_source

TOPIC = "orders"
BASE = dt.datetime(2026, 11, 24, 8, 30, tzinfo=dt.UTC)

ADDRESS = {"type": "record", "name": "Address", "fields": [{"name": "city", "type": "string"},
                                                            {"name": "zip", "type": "int"}]}
V1: dict[str, Any] = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID", "SHIPPED"]}},
    {"name": "customer", "type": {"type": "record", "name": "Customer", "fields": [
        {"name": "name", "type": "string"}, {"name": "address", "type": ADDRESS}]}},
    {"name": "items", "type": {"type": "array", "items": "string"}},
    {"name": "coupon", "type": ["null", "string"], "default": None},
]}
V2: dict[str, Any] = {**V1, "fields": [*V1["fields"], {"name": "channel", "type": "string", "default": "web"}]}


def _order(i: int, version: int) -> dict[str, Any]:
    order: dict[str, Any] = {
        "id": i, "amount": decimal.Decimal(f"{1000 + i}.{i % 100:02d}"),
        "ts": BASE + dt.timedelta(seconds=i, milliseconds=i % 1000),
        "status": ["NEW", "PAID", "SHIPPED"][i % 3],
        "customer": {"name": f"c{i}", "address": {"city": f"city{i % 4}", "zip": 10_000 + i}},
        "items": [f"sku{j}" for j in range(i % 3)], "coupon": None if i % 2 else f"SAVE{i}",
    }
    if version == 2:
        order["channel"] = "app" if i % 2 else "store"
    return order


def _produce(kafka: KafkaBroker, registry: SchemaRegistry) -> dict[int, int]:
    """Ten v1 orders, ten v2 orders, five more v1 (a rolling deploy), then two records the registry cannot
    explain. Returns each order id's schema version."""
    client = SchemaRegistryClient({"url": registry.url})
    serializers = {v: AvroSerializer(client, json.dumps(s), conf={"auto.register.schemas": True})
                   for v, s in ((1, V1), (2, V2))}
    producer = CheckedProducer({"bootstrap.servers": kafka.bootstrap_servers, "enable.idempotence": True})
    context = SerializationContext(TOPIC, MessageField.VALUE)
    versions = {}
    plan = [(i, 1) for i in range(10)] + [(i, 2) for i in range(10, 20)] + [(i, 1) for i in range(20, 25)]
    for i, version in plan:
        if i == 10:
            registry.set_compatibility(f"{TOPIC}-value", "BACKWARD")  # v2 must be a compatible change
        producer.produce(TOPIC, key=str(i).encode(), value=serializers[version](_order(i, version), context))
        versions[i] = version
    producer.produce(TOPIC, key=b"plain", value=b'{"not": "avro"}')  # no magic byte
    producer.produce(TOPIC, key=b"unknown", value=b"\x00\x00\x0f\x42\x3f\x02")  # an id the registry never gave
    producer.flush(60)
    return versions


def test_avro_records_come_back_typed_through_an_evolution(kafka: KafkaBroker, schema_registry: SchemaRegistry,
                                                           minio_bucket: BucketConfig, spark: Any,
                                                           tmp_path: Path) -> None:
    create_topic(kafka.bootstrap_servers, TOPIC, 1)
    versions = _produce(kafka, schema_registry)
    parser = {"parser": "avro", "options": {"time_field": "ts", "label_fields": ["status"]}}
    file = write_config(tmp_path, kafka.bootstrap_servers, minio_bucket, [TOPIC], parsers_override=[parser],
                        schema_registry={"url": schema_registry.url})
    finish(ingest_process(file, "partition", tmp_path / "ingest.log", available_now=True), timeout=600)

    config = config_of(file)
    bucket = open_bucket(config.bucket)
    start, end = int(BASE.timestamp() * 1000), int(BASE.timestamp() * 1000) + 3_600_000
    table = run_query(Query("default", start, end, f'{{topic="{TOPIC}"}}'), open_source(config, "metastore", bucket),
                      bucket).read_all().sort_by("id")

    # One table: old and new rows, typed.
    assert table.column("id").to_pylist() == list(range(25))
    schema = table.schema
    assert schema.field("amount").type == pa.decimal128(12, 2)
    assert schema.field("ts").type == pa.timestamp("us", tz="UTC")
    assert schema.field("status").type == pa.string()
    assert schema.field("customer").type == pa.struct([
        ("name", pa.string()), ("address", pa.struct([("city", pa.string()), ("zip", pa.int32())]))])
    assert schema.field("items").type == pa.list_(pa.string())
    assert schema.field("coupon").type == pa.string()
    assert schema.field("channel").type == pa.string()
    rows = table.to_pylist()
    by_id = {row["id"]: row for row in rows}
    for row in rows:
        i = row["id"]
        want = _order(i, versions[i])
        assert row["amount"] == want["amount"]  # exact
        assert row["ts"] == want["ts"]
        assert row["event_time"] == want["ts"]  # the time column comes from the typed field
        assert row["status"] == want["status"]
        assert row["customer"] == want["customer"]
        assert row["items"] == want["items"]
        assert row["coupon"] == want["coupon"]
        # each record fills its writer's fields: a v1 row has no channel (null), whatever else its chunk held
        assert row["channel"] == want.get("channel")

    # `shale query` prints the same values, the decimal exact.
    out = CliRunner().invoke(cli, ["--config", str(file), "query", "--tenant", "default", "--from", str(start),
                                   "--to", str(end), f'{{topic="{TOPIC}", status="PAID"}}', "--format", "json"])
    assert out.exit_code == 0, out.output
    printed = sorted((json.loads(line) for line in out.stdout.splitlines()), key=lambda r: r["id"])
    assert [r["id"] for r in printed] == [i for i in range(25) if i % 3 == 1]
    assert printed[0]["amount"] == "1001.01"
    assert printed[0]["ts"] == "2026-11-24T08:30:01.001000Z"
    assert printed[0]["customer"] == {"name": "c1", "address": {"city": "city1", "zip": 10001}}

    # Shale's Spark data source gives Spark the same types and values.
    register(spark)
    frame = (spark.read.format("shale").option("config", str(file)).option("tenant", "default")
             .option("from", str(start)).option("to", str(end)).option("selector", f'{{topic="{TOPIC}"}}').load())
    types = dict(frame.dtypes)
    assert types["amount"] == "decimal(12,2)"
    assert types["ts"] == "timestamp"
    assert types["customer"] == "struct<name:string,address:struct<city:string,zip:int>>"
    spark_rows = sorted(frame.select("id", "amount", "customer.address.city", "items").collect())
    assert [(r[0], r[1], r[2], r[3]) for r in spark_rows] == [
        (i, _order(i, 1)["amount"], f"city{i % 4}", _order(i, 1)["items"]) for i in range(25)]

    # The Iceberg table carries the types (DESIGN 16.7): published by `shale iceberg sync`, read by Spark SQL
    # through Iceberg's own runtime (a catalog name of this test's own: Spark keeps a catalog once it is loaded).
    publish_to_iceberg(file, spark, "typed_avro")
    types = dict(spark.table(f"typed_avro.default.{TOPIC}").dtypes)
    assert types["amount"] == "decimal(12,2)"
    assert types["ts"] == "timestamp"
    assert types["customer"] == "struct<name:string,address:struct<city:string,zip:int>>"
    assert types["items"] == "array<string>"
    assert types["channel"] == "string"
    iceberg_rows = spark.sql(f"SELECT id, amount, unix_micros(ts) AS ts, customer, items, channel "
                             f"FROM typed_avro.default.{TOPIC} ORDER BY id").collect()
    assert [r.id for r in iceberg_rows] == list(range(25))
    for r in iceberg_rows:
        want = _order(r.id, versions[r.id])
        assert r.amount == want["amount"]  # exact
        assert r.ts == (want["ts"] - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)
        assert r.customer.asDict(recursive=True) == want["customer"]
        assert r.items == want["items"]
        assert r.channel == by_id[r.id]["channel"]  # what Shale's own query path returns

    # The blocks record the writer schemas' ids and the fingerprint; the two bad records are quarantined.
    metas = [m for m in open_source(config, "metastore", bucket).query_blocks(["default"], 0, 2**62)
             if m.group == "partition"]
    records = [d for m in metas for d in m.datasets if d.kind == "records"]
    ids = {i for d in records for i in d.schema_ids or []}
    assert len(ids) == 2
    assert all(d.schema_fingerprint for d in records)
    reasons = [r for m in metas for d in m.datasets if d.kind == "quarantine"
               for r in read_dataset(bucket, m, d).column("reason").to_pylist()]
    assert len(reasons) == 2
    assert any("magic byte" in r for r in reasons)
    assert any("does not exist in the schema registry" in r for r in reasons)


REFUND: dict[str, Any] = {"type": "record", "name": "Refund", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "note", "type": "string"},
]}


def _refund(i: int) -> dict[str, Any]:
    return {"id": i, "amount": decimal.Decimal(f"{i}.{i % 100:02d}"), "ts": BASE + dt.timedelta(seconds=i),
            "note": f"r{i}"}


def _scraped(port: int, name: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    found = re.search(rf'^{name}{{group="partition"(?:,reason="registry")?}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else -1.0


def test_a_registry_killed_mid_run_pauses_only_the_uncached_partition_and_the_group_catches_up(
        kafka: KafkaBroker, schema_registry: SchemaRegistry, minio_bucket: BucketConfig, tmp_path: Path) -> None:
    """Two topics: ``payments``, whose schema the ingest's Python worker has read before the registry is killed with
    -9, and ``refunds``, whose first records arrive while it is dead. Spark runs on one core (``local[1]``), so one
    Python worker runs every task and its schema cache is the only one: which partition is cached is decided, not
    left to where Spark schedules a task. The cached topic keeps committing through the outage, the other pauses
    (the metric, the log line), nothing is quarantined; the registry restarts on the same port and data, the group
    catches up by itself, and every record is stored exactly once (``shale verify``)."""
    cached, fresh = "payments", "refunds"
    for topic in (cached, fresh):
        create_topic(kafka.bootstrap_servers, topic, 1)
    client = SchemaRegistryClient({"url": schema_registry.url})
    orders, refunds = AvroSerializer(client, json.dumps(V1)), AvroSerializer(client, json.dumps(REFUND))
    # Every value is serialized now, while the registry answers (the serializers register the schemas); the refunds
    # and the later payments are produced only once it is dead.
    order_values = [orders(_order(i, 1), SerializationContext(cached, MessageField.VALUE)) for i in range(40)]
    refund_values = [refunds(_refund(i), SerializationContext(fresh, MessageField.VALUE)) for i in range(20)]
    producer = CheckedProducer({"bootstrap.servers": kafka.bootstrap_servers, "enable.idempotence": True})

    def produce(topic: str, values: list[bytes | None], first: int) -> None:
        for i, value in enumerate(values, first):
            assert value is not None
            producer.produce(topic, key=str(i).encode(), value=value)
        producer.flush(60)

    produce(cached, order_values[:20], 0)
    port = free_port()
    file = write_config(tmp_path, kafka.bootstrap_servers, minio_bucket, [cached, fresh],
                        parsers_override=[{"parser": "avro", "options": {"time_field": "ts"}}],
                        spark={"master": "local[1]"}, metrics_port=port,
                        schema_registry={"url": schema_registry.url, "timeout": "3s"})
    config = config_of(file)
    bucket = open_bucket(config.bucket)

    def ids(topic: str) -> list[int]:
        rows = run_query(Query("default", 0, 2**50, f'{{topic="{topic}"}}'), open_source(config, "metastore", bucket),
                         bucket).read_all()
        return sorted(rows.column("id").to_pylist()) if rows.num_rows else []

    def quarantined() -> int:
        return int(run_query(Query("default", 0, 2**50, kind="quarantine"), open_source(config, "metastore", bucket),
                             bucket).read_all().num_rows)

    log = tmp_path / "ingest.log"
    process = ingest_process(file, "partition", log)
    try:
        eventually(lambda: ids(cached) == list(range(20)), 300, "the first payments to be committed")
        assert _scraped(port, "shale_ingest_paused_partitions") == 0
        schema_registry.kill9()
        produce(fresh, refund_values, 0)
        produce(cached, order_values[20:30], 20)

        def paused() -> bool:
            assert process.alive(), log.read_text()[-3000:]
            return _scraped(port, "shale_ingest_paused_partitions") == 1 and "refunds[0]@0" in log.read_text()
        eventually(paused, 300, "the refunds partition to pause on the dead registry")
        produce(cached, order_values[30:], 30)  # the cached partition goes on while the other one waits
        eventually(lambda: ids(cached) == list(range(40)), 300, "payments produced during the outage to commit")
        assert ids(fresh) == []
        assert quarantined() == 0  # a registry that does not answer never costs a record
        assert _scraped(port, "shale_ingest_paused_partitions") == 1
        assert _scraped(port, "shale_ingest_registry_failures_total") >= 1
        line = next(text for text in log.read_text().splitlines() if "the schema registry did not answer" in text)
        assert f"registry={schema_registry.url} " in line  # the text log's fields: name=value
        assert "partitions=['refunds[0]@0']" in line
        assert f"error=schema registry {schema_registry.url} did not answer" in line

        schema_registry.start()  # same port, same data folder: the same ids
        eventually(lambda: ids(fresh) == list(range(20)), 300, "the refunds to be stored after the registry restarted")
        eventually(lambda: _scraped(port, "shale_ingest_paused_partitions") == 0, 120, "the pause to be over")
        assert "the schema registry answered; paused partitions resumed" in log.read_text()
    finally:
        process.stop()
        if schema_registry.process is None or not schema_registry.process.alive():
            schema_registry.start()  # later tests need it
    for topic, count in ((cached, 40), (fresh, 20)):
        out = CliRunner().invoke(cli, ["--config", str(file), "verify", "--group", "partition", "--topic", topic,
                                       "--json"])
        assert out.exit_code == 0, out.output
        report = json.loads(out.output)
        assert (report["stored"], report["missing"], report["duplicated"]) == (count, 0, 0), report
        assert ids(topic) == list(range(count))  # each exactly once
    out = CliRunner().invoke(cli, ["--config", str(file), "bucket", "verify"])
    assert out.exit_code == 0, out.output  # metadata, checksums, no two blocks holding the same offsets
    rows = run_query(Query("default", 0, 2**50, f'{{topic="{fresh}"}}'), open_source(config, "metastore", bucket),
                     bucket).read_all().sort_by("id")
    assert rows.column("amount").to_pylist() == [_refund(i)["amount"] for i in range(20)]
    assert quarantined() == 0


# --- Protobuf --------------------------------------------------------------------------------------------------------

SHIPMENT_PROTO = """
syntax = "proto3";
package logistics;
import "google/protobuf/timestamp.proto";
import "google/protobuf/duration.proto";
import "google/protobuf/wrappers.proto";

message Address { string city = 1; int32 zip = 2; }
message Shipment {
  enum Carrier { UNKNOWN = 0; POST = 1; COURIER = 2; }
  message Parcel { string sku = 1; uint64 grams = 2; repeated string tags = 3; }
  int64 id = 1;
  google.protobuf.Timestamp shipped = 2;
  Carrier carrier = 3;
  Address to = 4;
  repeated Parcel parcels = 5;
  map<string, int64> fees = 6;
  oneof tracking { string code = 7; int64 number = 8; }
  google.protobuf.StringValue note = 9;
  optional double insured = 10;
  google.protobuf.Duration transit = 11;
}
"""


def _shipment_classes() -> tuple[Any, Any]:
    """The message classes, generated at run time from the .proto text (protoc, as the producers' build would)."""
    from google.protobuf import message_factory

    from shale.schemas.protobuf import ProtoFile, compile_text

    file = ProtoFile(compile_text(SHIPMENT_PROTO, "logistics/shipment.proto", []), [])
    return message_factory.GetMessageClass(file.message([1])), file


def _shipment(cls: Any, i: int) -> Any:
    shipment = cls(id=i, carrier=i % 3)
    shipment.shipped.seconds = int(BASE.timestamp()) + i
    shipment.shipped.nanos = i * 1_001_000 + 999  # microseconds kept, the last 999 nanoseconds floored away
    if i % 4:
        shipment.to.city, shipment.to.zip = f"city{i}", 1000 + i
    for j in range(i % 3):
        shipment.parcels.add(sku=f"sku{j}", grams=2**64 - 1 - j, tags=[f"t{k}" for k in range(j)])
    shipment.fees.update({"base": 100 * i, "fuel": -i})
    if i % 3 == 0:
        shipment.code = f"TRK{i}"
    elif i % 3 == 1:
        shipment.number = 0 if i == 1 else 10**12 + i  # a oneof member set to its default is still set
    if i % 2:
        shipment.note.value = f"note {i}"
    if i % 5:
        shipment.insured = i / 4
    shipment.transit.seconds, shipment.transit.nanos = 3600 * i, 500_000
    return shipment


def _expected_shipment(i: int) -> dict[str, Any]:
    return {
        "id": i, "shipped": BASE + dt.timedelta(seconds=i, microseconds=i * 1001),
        "carrier": ["UNKNOWN", "POST", "COURIER"][i % 3],
        "to": {"city": f"city{i}", "zip": 1000 + i} if i % 4 else None,
        "parcels": [{"sku": f"sku{j}", "grams": 2**64 - 1 - j, "tags": [f"t{k}" for k in range(j)]}
                    for j in range(i % 3)],
        "fees": sorted([("base", 100 * i), ("fuel", -i)]),
        "code": f"TRK{i}" if i % 3 == 0 else None,
        "number": (0 if i == 1 else 10**12 + i) if i % 3 == 1 else None,
        "note": f"note {i}" if i % 2 else None,
        "insured": i / 4 if i % 5 else None,
        "transit": 3600 * i * 1_000_000 + 500,
    }


def test_protobuf_records_come_back_typed(kafka: KafkaBroker, schema_registry: SchemaRegistry,
                                          minio_bucket: BucketConfig, spark: Any, tmp_path: Path) -> None:
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

    topic = "shipments"
    create_topic(kafka.bootstrap_servers, topic, 1)
    cls, _ = _shipment_classes()
    serializer = ProtobufSerializer(cls, SchemaRegistryClient({"url": schema_registry.url}),
                                    {"use.deprecated.format": False})
    producer = CheckedProducer({"bootstrap.servers": kafka.bootstrap_servers, "enable.idempotence": True})
    context = SerializationContext(topic, MessageField.VALUE)
    count = 24
    for i in range(count):
        producer.produce(topic, key=str(i).encode(), value=serializer(_shipment(cls, i), context))
    producer.produce(topic, key=b"plain", value=b"\x01not protobuf")  # wrong magic byte
    producer.produce(topic, key=b"unknown", value=b"\x00\x00\x0f\x42\x3f\x00\x08\x01")  # an id never given
    producer.flush(60)

    parser = {"parser": "protobuf", "options": {"time_field": "shipped", "label_fields": ["carrier"]}}
    file = write_config(tmp_path, kafka.bootstrap_servers, minio_bucket, [topic], parsers_override=[parser],
                        schema_registry={"url": schema_registry.url})
    finish(ingest_process(file, "partition", tmp_path / "ingest.log", available_now=True), timeout=600)
    config = config_of(file)
    bucket = open_bucket(config.bucket)
    start, end = int(BASE.timestamp() * 1000), int(BASE.timestamp() * 1000) + 3_600_000
    table = run_query(Query("default", start, end, f'{{topic="{topic}"}}'), open_source(config, "metastore", bucket),
                      bucket).read_all().sort_by("id")

    schema = table.schema
    assert schema.field("shipped").type == pa.timestamp("us", tz="UTC")
    assert schema.field("to").type == pa.struct([("city", pa.string()), ("zip", pa.int32())])
    assert schema.field("parcels").type == pa.list_(pa.struct([("sku", pa.string()), ("grams", pa.uint64()),
                                                                ("tags", pa.list_(pa.string()))]))
    assert schema.field("fees").type == pa.map_(pa.string(), pa.int64())
    assert (schema.field("code").type, schema.field("number").type) == (pa.string(), pa.int64())
    assert (schema.field("note").type, schema.field("insured").type) == (pa.string(), pa.float64())
    assert schema.field("transit").type == pa.int64()
    rows = table.to_pylist()
    assert [r["id"] for r in rows] == list(range(count))
    for row in rows:
        want = _expected_shipment(row["id"])
        got = {name: row[name] for name in want}
        got["fees"] = sorted(got["fees"])
        assert got == want
        assert row["event_time"] == want["shipped"]

    out = CliRunner().invoke(cli, ["--config", str(file), "query", "--tenant", "default", "--from", str(start),
                                   "--to", str(end), f'{{topic="{topic}", carrier="POST"}}', "--format", "json"])
    assert out.exit_code == 0, out.output
    printed = sorted((json.loads(line) for line in out.stdout.splitlines()), key=lambda r: r["id"])
    assert [r["id"] for r in printed] == [i for i in range(count) if i % 3 == 1]
    assert printed[0]["shipped"] == "2026-11-24T08:30:01.001001Z"
    assert (printed[0]["number"], printed[0]["code"]) == (0, None)

    register(spark)
    frame = (spark.read.format("shale").option("config", str(file)).option("tenant", "default")
             .option("from", str(start)).option("to", str(end)).option("selector", f'{{topic="{topic}"}}').load())
    types = dict(frame.dtypes)
    assert types["parcels"] == "array<struct<sku:string,grams:decimal(20,0),tags:array<string>>>"
    spark_rows = sorted(frame.select("id", "to.city", "parcels").collect())
    assert [(r[0], r[1], [(p["sku"], int(p["grams"])) for p in r[2]]) for r in spark_rows] == [
        (i, f"city{i}" if i % 4 else None, [(f"sku{j}", 2**64 - 1 - j) for j in range(i % 3)]) for i in range(count)]

    metas = [m for m in open_source(config, "metastore", bucket).query_blocks(["default"], 0, 2**62)
             if m.group == "partition"]
    assert all(d.schema_ids and d.schema_fingerprint for m in metas for d in m.datasets if d.kind == "records")
    reasons = [r for m in metas for d in m.datasets if d.kind == "quarantine"
               for r in read_dataset(bucket, m, d).column("reason").to_pylist()]
    assert len(reasons) == 2
    assert any("magic byte" in r for r in reasons)
    assert any("does not exist in the schema registry" in r for r in reasons)


# --- JSON Schema -----------------------------------------------------------------------------------------------------

READING_SCHEMA: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#", "title": "Reading", "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "at": {"type": "string", "format": "date-time"},
        "day": {"type": "string", "format": "date"},
        "reading": {"type": "number"},
        "ok": {"type": "boolean"},
        "unit": {"type": ["string", "null"]},
        "sensor": {"$ref": "#/definitions/sensor"},
        "samples": {"type": "array", "items": {"type": "integer"}},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "extra": {"oneOf": [{"type": "null"}, {"type": "object", "properties": {"note": {"type": "string"}}}]},
    },
    "required": ["id", "at"],
    "definitions": {"sensor": {"type": "object", "properties": {"name": {"type": "string"},
                                                                "floor": {"type": "integer"}}}},
}


READING_KEY = {"type": "record", "name": "ReadingKey", "fields": [{"name": "sensor", "type": "string"},
                                                                {"name": "seq", "type": "long"}]}


def _reading(i: int) -> dict[str, Any]:
    at = BASE + dt.timedelta(seconds=i, microseconds=7 * i + 1)
    reading: dict[str, Any] = {
        "id": i, "at": at.isoformat().replace("+00:00", "Z"), "day": (BASE.date() + dt.timedelta(days=i)).isoformat(),
        "reading": i * 1.5, "ok": i % 2 == 0, "unit": None if i % 3 == 0 else "kPa",
        "sensor": {"name": f"s{i % 4}", "floor": i % 7}, "samples": list(range(i % 4)),
        "labels": {"site": f"site{i % 2}"}, "extra": None if i % 2 else {"note": f"n{i}"},
    }
    if i % 5 == 0:
        del reading["labels"]  # absent: reads as null
    return reading


def test_json_schema_records_come_back_typed(kafka: KafkaBroker, schema_registry: SchemaRegistry,
                                             minio_bucket: BucketConfig, spark: Any, tmp_path: Path) -> None:
    from confluent_kafka.schema_registry.json_schema import JSONSerializer

    topic = "readings"
    create_topic(kafka.bootstrap_servers, topic, 1)
    client = SchemaRegistryClient({"url": schema_registry.url})
    serializer = JSONSerializer(json.dumps(READING_SCHEMA), client)
    key_serializer = AvroSerializer(client, json.dumps(READING_KEY))  # keys in Avro, subject readings-key
    producer = CheckedProducer({"bootstrap.servers": kafka.bootstrap_servers, "enable.idempotence": True})
    context = SerializationContext(topic, MessageField.VALUE)
    key_context = SerializationContext(topic, MessageField.KEY)
    count = 20
    for i in range(count):
        key = key_serializer({"sensor": f"s{i % 4}", "seq": i}, key_context) if i % 7 else None
        producer.produce(topic, key=key, value=serializer(_reading(i), context))
    framed = serializer(_reading(99), context)
    assert framed is not None
    schema_id = int.from_bytes(framed[1:5], "big")
    # A value its schema refuses (the serializer validates, so it is framed by hand with the real id), a wrong magic
    # byte, and an id the registry never gave.
    producer.produce(topic, key=b"invalid", value=framed[:5] + b'{"id": "seven", "at": "2026-11-24T08:30:00Z"}')
    producer.produce(topic, key=b"plain", value=b'{"id": 1}')
    producer.produce(topic, key=b"unknown", value=b"\x00\x00\x0f\x42\x3f{}")
    producer.flush(60)

    parser = {"parser": "json_schema", "options": {"time_field": "at", "key_format": "avro"}}
    file = write_config(tmp_path, kafka.bootstrap_servers, minio_bucket, [topic], parsers_override=[parser],
                        schema_registry={"url": schema_registry.url})
    finish(ingest_process(file, "partition", tmp_path / "ingest.log", available_now=True), timeout=600)
    config = config_of(file)
    bucket = open_bucket(config.bucket)
    start, end = int(BASE.timestamp() * 1000), int(BASE.timestamp() * 1000) + 3_600_000
    table = run_query(Query("default", start, end, f'{{topic="{topic}"}}'), open_source(config, "metastore", bucket),
                      bucket).read_all().sort_by("id")

    schema = table.schema
    assert schema.field("at").type == pa.timestamp("us", tz="UTC")
    assert schema.field("day").type == pa.date32()
    assert (schema.field("reading").type, schema.field("ok").type) == (pa.float64(), pa.bool_())
    assert schema.field("sensor").type == pa.struct([("name", pa.string()), ("floor", pa.int64())])
    assert schema.field("samples").type == pa.list_(pa.int64())
    assert schema.field("labels").type == pa.map_(pa.string(), pa.string())
    assert schema.field("extra").type == pa.struct([("note", pa.string())])
    assert schema.field("record_key").type == pa.struct([("sensor", pa.string()), ("seq", pa.int64())])
    rows = table.to_pylist()
    assert [r["id"] for r in rows] == list(range(count))
    for row in rows:
        want = _reading(row["id"])
        at = BASE + dt.timedelta(seconds=row["id"], microseconds=7 * row["id"] + 1)
        assert row["at"] == at
        assert row["event_time"] == at
        assert row["day"] == dt.date.fromisoformat(want["day"])
        assert (row["reading"], row["ok"], row["unit"]) == (want["reading"], want["ok"], want["unit"])
        assert row["sensor"] == want["sensor"]
        assert row["samples"] == want["samples"]
        assert row["labels"] == (list(want["labels"].items()) if "labels" in want else None)
        assert row["extra"] == want["extra"]
        assert row["record_key"] == ({"sensor": f"s{row['id'] % 4}", "seq": row["id"]} if row["id"] % 7 else None)

    out = CliRunner().invoke(cli, ["--config", str(file), "query", "--tenant", "default", "--from", str(start),
                                   "--to", str(end), f'{{topic="{topic}"}}', "--format", "json"])
    assert out.exit_code == 0, out.output
    printed = sorted((json.loads(line) for line in out.stdout.splitlines()), key=lambda r: r["id"])
    assert printed[1]["at"] == "2026-11-24T08:30:01.000008Z"
    assert printed[1]["sensor"] == {"name": "s1", "floor": 1}

    register(spark)
    frame = (spark.read.format("shale").option("config", str(file)).option("tenant", "default")
             .option("from", str(start)).option("to", str(end)).option("selector", f'{{topic="{topic}"}}').load())
    types = dict(frame.dtypes)
    assert (types["at"], types["day"], types["labels"]) == ("timestamp", "date", "map<string,string>")
    assert types["record_key"] == "struct<sensor:string,seq:bigint>"
    spark_rows = sorted(frame.select("id", "day", "sensor.floor", "record_key.seq").collect())
    assert [tuple(r) for r in spark_rows] == [
        (i, BASE.date() + dt.timedelta(days=i), i % 7, i if i % 7 else None) for i in range(count)]

    metas = [m for m in open_source(config, "metastore", bucket).query_blocks(["default"], 0, 2**62)
             if m.group == "partition"]
    records = [d for m in metas for d in m.datasets if d.kind == "records"]
    assert {i for d in records for i in d.schema_ids or []} == {schema_id}  # the value's (keys are not listed)
    reasons = [r for m in metas for d in m.datasets if d.kind == "quarantine"
               for r in read_dataset(bucket, m, d).column("reason").to_pylist()]
    assert len(reasons) == 3
    assert any('id: "seven" is not of type "integer"' in r for r in reasons)
    assert any("magic byte" in r for r in reasons)
    assert any("does not exist in the schema registry" in r for r in reasons)
