"""Subject name strategies end to end: two Avro record types written into one topic by confluent-kafka's
AvroSerializer under ``record_subject_name_strategy`` (subjects ``shop.Order`` and ``shop.Refund`` in the real
Apicurio registry), read from the real Kafka broker by the partition group on Spark into MinIO with the avro
parser's ``subject_name_strategy = "record"``: nothing is quarantined, each type comes back typed from `shale query`,
the Python API and Shale's Spark data source through a ``record`` matcher, a query without one is refused naming
both types, and each type is its own Iceberg table that Spark SQL reads."""

from __future__ import annotations

import datetime as dt
import decimal
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka.schema_registry import SchemaRegistryClient, record_subject_name_strategy
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

from shale.cli import cli
from shale.config import BucketConfig
from shale.dev import KafkaBroker, SchemaRegistry
from shale.objstore import open_bucket
from shale.query import Query, run_query
from shale.query.datasource import register
from shale.query.plan import Kind
from shale.query.sources import open_source

TOPIC = "shop"
BASE = dt.datetime(2026, 11, 24, 9, 0, tzinfo=dt.UTC)
ORDER: dict[str, Any] = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "customer", "type": {"type": "record", "name": "Customer",
                                  "fields": [{"name": "name", "type": "string"}]}},
]}
REFUND: dict[str, Any] = {"type": "record", "name": "Refund", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"},
    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "order_id", "type": "long"},
    {"name": "why", "type": {"type": "enum", "name": "Why", "symbols": ["LATE", "BROKEN"]}},
]}
PLAN = [("shop.Order" if i % 3 else "shop.Refund", i) for i in range(30)]  # interleaved: 20 orders, 10 refunds


def _datum(kind: str, i: int) -> dict[str, Any]:
    ts = BASE + dt.timedelta(seconds=i, milliseconds=i)
    if kind == "shop.Order":
        return {"id": i, "amount": decimal.Decimal(f"{100 + i}.{i:02d}"), "ts": ts, "customer": {"name": f"c{i}"}}
    return {"id": i, "ts": ts, "order_id": i - 1, "why": ["LATE", "BROKEN"][i % 2]}


def _produce(kafka: KafkaBroker, registry: SchemaRegistry) -> None:
    client = SchemaRegistryClient({"url": registry.url})
    conf = {"auto.register.schemas": True, "subject.name.strategy": record_subject_name_strategy}
    serializers = {"shop.Order": AvroSerializer(client, json.dumps(ORDER), conf=conf),
                   "shop.Refund": AvroSerializer(client, json.dumps(REFUND), conf=conf)}
    producer = CheckedProducer({"bootstrap.servers": kafka.bootstrap_servers, "enable.idempotence": True})
    context = SerializationContext(TOPIC, MessageField.VALUE)
    for kind, i in PLAN:
        producer.produce(TOPIC, key=str(i).encode(), value=serializers[kind](_datum(kind, i), context))
    producer.flush(60)
    subjects = set(client.get_subjects())  # the session's registry holds other tests' subjects too
    assert {"shop.Order", "shop.Refund"} <= subjects  # the record strategy's subjects
    assert f"{TOPIC}-value" not in subjects  # and none named after the topic


def test_two_record_types_in_one_topic_come_back_each_typed(kafka: KafkaBroker, schema_registry: SchemaRegistry,
                                                           minio_bucket: BucketConfig, spark: Any,
                                                           tmp_path: Path) -> None:
    create_topic(kafka.bootstrap_servers, TOPIC, 1)
    _produce(kafka, schema_registry)
    parser = {"parser": "avro", "options": {"time_field": "ts", "subject_name_strategy": "record"}}
    file = write_config(tmp_path, kafka.bootstrap_servers, minio_bucket, [TOPIC], parsers_override=[parser],
                        schema_registry={"url": schema_registry.url})
    finish(ingest_process(file, "partition", tmp_path / "ingest.log", available_now=True), timeout=600)

    config = config_of(file)
    bucket = open_bucket(config.bucket)
    source = open_source(config, "metastore", bucket)
    start, end = int(BASE.timestamp() * 1000), int(BASE.timestamp() * 1000) + 3_600_000

    def query(selector: str, kind: Kind = "records") -> Any:
        return run_query(Query("default", start, end, selector, kind=kind), source, bucket).read_all()

    quarantined = run_query(Query("default", 0, 2**50, kind="quarantine"), source, bucket).read_all()
    assert quarantined.column("reason").to_pylist() == []  # nothing quarantined (Kafka times: the whole range)
    orders = query(f'{{topic="{TOPIC}", record="shop.Order"}}').sort_by("id")
    refunds = query(f'{{topic="{TOPIC}", record="shop.Refund"}}').sort_by("id")
    assert orders.column("id").to_pylist() == [i for k, i in PLAN if k == "shop.Order"]
    assert refunds.column("id").to_pylist() == [i for k, i in PLAN if k == "shop.Refund"]
    assert str(orders.schema.field("amount").type) == "decimal128(12, 2)"
    assert "why" not in orders.column_names
    assert "amount" not in refunds.column_names
    for row in orders.to_pylist():
        want = _datum("shop.Order", row["id"])
        assert (row["amount"], row["ts"], row["event_time"], row["customer"]) == (
            want["amount"], want["ts"], want["ts"], want["customer"])
    for row in refunds.to_pylist():
        want = _datum("shop.Refund", row["id"])
        assert (row["order_id"], row["why"], row["ts"]) == (want["order_id"], want["why"], want["ts"])

    # Without a record matcher the types would mix: refused, naming both.
    with pytest.raises(ValueError, match=r"several record types: shop\.Order, shop\.Refund"):
        query(f'{{topic="{TOPIC}"}}')
    out = CliRunner().invoke(cli, ["--config", str(file), "query", "--tenant", "default", "--from", str(start),
                                   "--to", str(end), f'{{topic="{TOPIC}"}}', "--format", "json"])
    assert out.exit_code != 0
    assert "shop.Order, shop.Refund" in out.output
    out = CliRunner().invoke(cli, ["--config", str(file), "query", "--tenant", "default", "--from", str(start),
                                   "--to", str(end), '{record="shop.Refund"}', "--format", "json"])
    assert out.exit_code == 0, out.output
    assert [json.loads(line)["why"] for line in out.stdout.splitlines()] == refunds.column("why").to_pylist()

    # Shale's Spark data source reads one type.
    register(spark)
    frame = (spark.read.format("shale").option("config", str(file)).option("tenant", "default")
             .option("from", str(start)).option("to", str(end))
             .option("selector", f'{{topic="{TOPIC}", record="shop.Order"}}').load())
    assert dict(frame.dtypes)["amount"] == "decimal(12,2)"
    assert sorted(r.id for r in frame.select("id").collect()) == orders.column("id").to_pylist()

    # One Iceberg table per record type: <topic>__<record with '.' as '_'>.
    publish_to_iceberg(file, spark, "record_types")
    order_table = spark.sql("SELECT id, amount, customer.name AS name FROM record_types.default.shop__shop_Order "
                            "ORDER BY id").collect()
    assert [(r.id, r.amount, r.name) for r in order_table] == [
        (i, _datum(k, i)["amount"], f"c{i}") for k, i in PLAN if k == "shop.Order"]
    refund_table = spark.sql("SELECT id, why FROM record_types.default.shop__shop_Refund ORDER BY id").collect()
    assert [(r.id, r.why) for r in refund_table] == [(i, _datum(k, i)["why"]) for k, i in PLAN if k == "shop.Refund"]
    assert "amount" not in dict(spark.table("record_types.default.shop__shop_Refund").dtypes)
