"""An incompatible schema change in the middle of a topic, end to end (docs/DESIGN.md 10.8, "Incompatible
changes"): records written with confluent-kafka's AvroSerializer against the real Schema Registry, where v2 turns
``qty`` from a string into a long under compatibility NONE. Nothing is lost or read into a wrong value: the
partition group stores each side with its own types and quarantines the older record that cannot be read as the
newer schema, with the reason; a query across the change fails naming the column and the way out; each side
queries on its own; the Iceberg table keeps its first type and leaves the conflicting block out."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
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

from shale.block import read_dataset
from shale.cli import cli
from shale.config import BucketConfig
from shale.dev import KafkaBroker, SchemaRegistry
from shale.errors import IncompatibleColumnError
from shale.objstore import open_bucket
from shale.query import Query, run_query
from shale.query.sources import open_source

TOPIC = "inventory"
BASE = dt.datetime(2026, 11, 25, 9, 0, tzinfo=dt.UTC)
HOUR_MS = 3_600_000
V1: dict[str, Any] = {"type": "record", "name": "Stock", "namespace": "shop", "fields": [
    {"name": "sku", "type": "string"},
    {"name": "qty", "type": "string"},
    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
]}
V2: dict[str, Any] = {**V1, "fields": [V1["fields"][0], {"name": "qty", "type": "long"}, V1["fields"][2]]}
WORDS = ["one", "two", "three", "four"]


def _ingest(file: Path, log: Path) -> None:
    finish(ingest_process(file, "partition", log, available_now=True), timeout=600)


def _ms(when: dt.datetime) -> int:
    return int(when.timestamp() * 1000)


def test_an_incompatible_change_is_stored_on_both_sides_and_never_read_into_a_wrong_type(
        kafka: KafkaBroker, schema_registry: SchemaRegistry, minio_bucket: BucketConfig, spark: Any,
        tmp_path: Path) -> None:
    create_topic(kafka.bootstrap_servers, TOPIC, 1)
    client = SchemaRegistryClient({"url": schema_registry.url})
    serialize = {v: AvroSerializer(client, json.dumps(s), conf={"auto.register.schemas": True})
                 for v, s in ((1, V1), (2, V2))}
    context = SerializationContext(TOPIC, MessageField.VALUE)
    producer = CheckedProducer({"bootstrap.servers": kafka.bootstrap_servers, "enable.idempotence": True})

    def produce(version: int, i: int, when: dt.datetime) -> None:
        qty: str | int = WORDS[i % 4] if version == 1 else i
        producer.produce(TOPIC, key=f"s{i}".encode(), value=serialize[version]({"sku": f"s{i}", "qty": qty,
                                                                                   "ts": when}, context))

    for i in range(4):  # the first hour: v1, qty a word
        produce(1, i, BASE + dt.timedelta(seconds=i))
    producer.flush(60)
    parser = {"parser": "avro", "options": {"time_field": "ts"}}
    file = write_config(tmp_path, kafka.bootstrap_servers, minio_bucket, [TOPIC], parsers_override=[parser],
                        schema_registry={"url": schema_registry.url})
    _ingest(file, tmp_path / "ingest-1.log")

    schema_registry.set_compatibility(f"{TOPIC}-value", "NONE")  # the registry lets the breaking change in
    later = BASE + dt.timedelta(hours=1)
    for i in range(4, 8):  # the second hour: v2, qty a long ...
        produce(2, i, later + dt.timedelta(seconds=i))
    produce(1, 8, later + dt.timedelta(seconds=8))  # ... and one v1 record of a producer not yet redeployed
    producer.flush(60)
    _ingest(file, tmp_path / "ingest-2.log")

    config = config_of(file)
    bucket = open_bucket(config.bucket)
    source = open_source(config, "metastore", bucket)
    metas = [m for m in source.query_blocks(["default"], 0, 2**62) if m.group == "partition"]

    # Every record is accounted for: 8 stored, each side with its own type, and the late v1 record quarantined
    # with the reason (never read into a long).
    records = {m.id: pa.concat_tables([read_dataset(bucket, m, d) for d in m.datasets if d.kind == "records"])
               for m in metas if any(d.kind == "records" for d in m.datasets)}
    assert sorted(str(t.schema.field("qty").type) for t in records.values()) == ["int64", "string"]
    assert sum(t.num_rows for t in records.values()) == 8
    quarantined = [row for m in metas for d in m.datasets if d.kind == "quarantine"
                   for row in read_dataset(bucket, m, d).to_pylist()]
    assert [row["offset"] for row in quarantined] == [8]
    assert "cannot be read as" in quarantined[0]["reason"], quarantined[0]["reason"]

    # Across the change: the query fails naming the column and the way out, through the API and the CLI.
    start, end = _ms(BASE), _ms(BASE) + 2 * HOUR_MS
    with pytest.raises(IncompatibleColumnError, match=r"'qty'.*reprocess"):
        run_query(Query("default", start, end, f'{{topic="{TOPIC}"}}'), source, bucket).read_all()
    out = CliRunner().invoke(cli, ["--config", str(file), "query", "--tenant", "default", "--from", str(start),
                                   "--to", str(end), f'{{topic="{TOPIC}"}}'])
    assert out.exit_code != 0
    assert "qty" in out.output, out.output
    assert "reprocess" in out.output, out.output

    # Each side on its own: its own type and values.
    first = run_query(Query("default", start, start + HOUR_MS, f'{{topic="{TOPIC}"}}'), source, bucket).read_all()
    assert first.schema.field("qty").type == pa.string()
    assert sorted(first.column("qty").to_pylist()) == sorted(WORDS)
    second = run_query(Query("default", start + HOUR_MS, end, f'{{topic="{TOPIC}"}}'), source, bucket).read_all()
    assert second.schema.field("qty").type == pa.int64()
    assert sorted(second.column("qty").to_pylist()) == [4, 5, 6, 7]

    # The Iceberg table keeps the type it was made with and leaves the conflicting block out; Spark reads it.
    publish_to_iceberg(file, spark, "typed_incompatible")
    table = f"typed_incompatible.default.{TOPIC}"
    assert dict(spark.table(table).dtypes)["qty"] == "string"
    assert sorted(r.qty for r in spark.sql(f"SELECT qty FROM {table}").collect()) == sorted(WORDS)
