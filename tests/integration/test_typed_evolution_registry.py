"""Schema evolution against the real Schema Registry (Apicurio 3.0.9): for a fixed set of (version 1, version 2)
pairs the registry accepts as BACKWARD compatible, records serialized by confluent-kafka's AvroSerializer and
JSONSerializer under each version, and decoded through Shale's parser path (``write_chunk``, the schemas fetched from
the registry), read back as what their writer meant, or are quarantined with the reason (docs/DESIGN.md 10.8, "A
value is what its writer meant"; the unit suite's differential properties draw such pairs at random). No Kafka or
Spark is needed: the parser path takes the serializers' bytes directly."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from tests.factories import BASE_MS, backup_table

from shale.block import read_dataset
from shale.config import BucketConfig, IngestConfig, ParserRule, SchemaRegistryConfig
from shale.dev import SchemaRegistry
from shale.encoder.chunks import Chunk, GroupSpec, write_chunk
from shale.objstore import open_bucket

QUARANTINED = "quarantined"
MILLIS = 1_795_000_000_123  # 2026-11-18
WHEN = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(milliseconds=MILLIS)


def _record(name: str, field: Any, **extra: Any) -> dict[str, Any]:
    return {"type": "record", "name": name, "namespace": "shale.evolution",
            "fields": [{"name": "x", "type": field, **extra}]}


AVRO_PAIRS = [  # (case, version 1's field, version 2's field, the value written under version 1, what is stored)
    ("long_to_timestamp_millis", "long", {"type": "long", "logicalType": "timestamp-millis"}, MILLIS, WHEN),
    ("long_to_local_timestamp_millis", "long", {"type": "long", "logicalType": "local-timestamp-millis"}, MILLIS,
     WHEN.replace(tzinfo=None)),
    ("int_to_double", "int", "double", 16_777_217, 16_777_217.0),
    ("long_to_double_inexact", "long", "double", 2**60 + 1, QUARANTINED),
    ("long_to_float_exact", "long", "float", 2**40, float(2**40)),
    ("union_widened", ["null", "string"], ["null", "string", "long"], "x", {"string": "x", "long": None}),
    ("enum_grown", {"type": "enum", "name": "Level", "symbols": ["A", "B"]},
     {"type": "enum", "name": "Level", "symbols": ["A", "B", "C"]}, "B", "B"),
    ("string_to_bytes", "string", "bytes", "é", "é".encode()),
    ("timestamp_millis_to_micros", {"type": "long", "logicalType": "timestamp-millis"},
     {"type": "long", "logicalType": "timestamp-micros"}, WHEN, WHEN),
]

NEWEST = {"union_widened": ("y", {"string": "y", "long": None}), "long_to_double_inexact": (7.0, 7.0),
          "integer_to_number_inexact": (7, 7.0)}
"""The record written under version 2 and what is stored of it, where not the version-1 record's stored value."""

JSON_PAIRS = [
    ("integer_to_number", {"type": "integer"}, {"type": "number"}, 5, 5.0),
    ("integer_to_number_inexact", {"type": "integer"}, {"type": "number"}, 2**60 + 1, QUARANTINED),
    ("date_time_format_removed", {"type": "string", "format": "date-time"}, {"type": "string"},
     "2026-11-18T08:00:00+00:00", "2026-11-18T08:00:00+00:00"),
    ("nullable", {"type": "string"}, {"type": ["string", "null"]}, "v", "v"),
    ("enum_grown", {"enum": ["A", "B"]}, {"enum": ["A", "B", "C"]}, "A", "A"),
]


def _json_schema(field: Any) -> dict[str, Any]:
    return {"$schema": "http://json-schema.org/draft-07/schema#", "title": "Evolution", "type": "object",
            "properties": {"x": field}}


def _store(registry: SchemaRegistry, parser: str, values: list[bytes]) -> tuple[list[dict[str, Any]], dict[int, str]]:
    """The records through Shale's parser path with the real registry: stored rows by offset, and quarantine
    reasons by offset."""
    spec = GroupSpec("partition", 1, BucketConfig(url=f"memory://evo-{uuid.uuid4().hex}"),
                     IngestConfig(parsers=[ParserRule(parser=parser)],
                                  schema_registry=SchemaRegistryConfig(url=registry.url)))
    table = backup_table("app", 0, 0, len(values))
    table = table.set_column(table.schema.get_field_index("value"), "value", pa.array(values, pa.binary()))
    bucket = open_bucket(spec.bucket)
    written = write_chunk(spec, bucket, table, Chunk("app", 0, "", 0, len(values), BASE_MS + 7 * 86_400_000))
    rows = [r for m in written.blocks for d in m.datasets if d.kind == "records"
            for r in read_dataset(bucket, m, d).to_pylist()]
    reasons = {r["offset"]: r["reason"] for m in written.blocks for d in m.datasets if d.kind == "quarantine"
               for r in read_dataset(bucket, m, d).to_pylist()}
    return sorted(rows, key=lambda r: r["offset"]), reasons


def _check(rows: list[dict[str, Any]], reasons: dict[int, str], meant: Any, newest: Any) -> None:
    stored = {r["offset"]: r["x"] for r in rows}
    assert 1 not in reasons, reasons  # the newest version's own record is stored
    assert stored[1] == newest
    if meant == QUARANTINED:
        assert 0 not in stored
        assert reasons[0], "quarantined with a reason"
    else:
        assert reasons == {}
        assert stored[0] == meant


@pytest.mark.parametrize(("case", "v1", "v2", "value", "meant"), AVRO_PAIRS, ids=[p[0] for p in AVRO_PAIRS])
def test_avro_pairs_the_registry_accepts_store_what_the_writer_meant(
        schema_registry: SchemaRegistry, case: str, v1: Any, v2: Any, value: Any, meant: Any) -> None:
    topic = f"evo-avro-{case}-{uuid.uuid4().hex[:6]}"
    client = SchemaRegistryClient({"url": schema_registry.url})
    context = SerializationContext(topic, MessageField.VALUE)
    old = AvroSerializer(client, json.dumps(_record("E", v1)), conf={"auto.register.schemas": True})
    first = old({"x": value}, context)
    assert first is not None
    schema_registry.set_compatibility(f"{topic}-value", "BACKWARD")  # the registry checks version 2
    new = AvroSerializer(client, json.dumps(_record("E", v2)), conf={"auto.register.schemas": True})
    newest, stored = NEWEST.get(case, (meant, meant))
    second = new({"x": newest}, context)
    assert second is not None
    rows, reasons = _store(schema_registry, "avro", [first, second])
    _check(rows, reasons, meant, stored)


@pytest.mark.parametrize(("case", "v1", "v2", "value", "meant"), JSON_PAIRS, ids=[p[0] for p in JSON_PAIRS])
def test_json_schema_pairs_the_registry_accepts_store_what_the_writer_meant(
        schema_registry: SchemaRegistry, case: str, v1: Any, v2: Any, value: Any, meant: Any) -> None:
    topic = f"evo-json-{case.replace('_', '-')}-{uuid.uuid4().hex[:6]}"
    client = SchemaRegistryClient({"url": schema_registry.url})
    context = SerializationContext(topic, MessageField.VALUE)
    old = JSONSerializer(json.dumps(_json_schema(v1)), client, conf={"auto.register.schemas": True})
    first = old({"x": value}, context)
    assert first is not None
    schema_registry.set_compatibility(f"{topic}-value", "BACKWARD")
    new = JSONSerializer(json.dumps(_json_schema(v2)), client, conf={"auto.register.schemas": True})
    newest, stored = NEWEST.get(case, (value, meant))
    second = new({"x": newest}, context)
    assert second is not None
    rows, reasons = _store(schema_registry, "json_schema", [first, second])
    _check(rows, reasons, meant, stored)


def test_an_avro_field_renamed_with_aliases_lands_in_its_writers_column_whatever_the_chunk(
        schema_registry: SchemaRegistry) -> None:
    """Issue 59 in Avro, through the real registry: version 2 renames temp_c to temp_dc with `aliases` (BACKWARD
    accepts it) and adds a field with a default. Each record fills the columns of its writer's field names, stored
    as one chunk or split: the version-1 records in temp_c (null in temp_dc and in the added field), version 2's in
    temp_dc."""
    topic = f"evo-avro-rename-{uuid.uuid4().hex[:6]}"
    client = SchemaRegistryClient({"url": schema_registry.url})
    context = SerializationContext(topic, MessageField.VALUE)
    v1 = {"type": "record", "name": "Reading", "namespace": "tele", "fields": [
        {"name": "device", "type": "string"}, {"name": "temp_c", "type": "int"}]}
    v2 = {**v1, "fields": [{"name": "device", "type": "string"},
                           {"name": "temp_dc", "type": "int", "aliases": ["temp_c"]},
                           {"name": "site", "type": "string", "default": "-"}]}
    old = AvroSerializer(client, json.dumps(v1), conf={"auto.register.schemas": True})
    records = [old({"device": "a", "temp_c": 21}, context), old({"device": "b", "temp_c": 22}, context)]
    schema_registry.set_compatibility(f"{topic}-value", "BACKWARD")  # the registry checks version 2
    new = AvroSerializer(client, json.dumps(v2), conf={"auto.register.schemas": True})
    records.append(new({"device": "c", "temp_dc": 215, "site": "roof"}, context))
    assert all(r is not None for r in records)
    framed = [r for r in records if r is not None]
    wanted = [("a", 21, None, None), ("b", 22, None, None), ("c", None, 215, "roof")]
    whole, reasons = _store(schema_registry, "avro", framed)
    assert reasons == {}
    assert [(r["device"], r["temp_c"], r["temp_dc"], r["site"]) for r in whole] == wanted
    first, _ = _store(schema_registry, "avro", framed[:1])
    rest, _ = _store(schema_registry, "avro", framed[1:])
    assert [(r["device"], r.get("temp_c"), r.get("temp_dc"), r.get("site")) for r in [*first, *rest]] == wanted
