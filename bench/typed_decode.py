"""Decoding Confluent-framed Avro into typed Arrow columns: Shale's path (``shale.schemas.avro.Decoder``: fastavro's
schemaless reader, then the values converted to the Arrow types) against confluent-kafka's ``AvroDeserializer``
(the standard client: registry lookup by id, fastavro underneath) in the same run, on the same records, both
ending in the same Arrow table. The records (about 20 fields: nested records, an array, a map, a nullable union,
decimal, timestamp-millis, date, uuid, enum) are written with confluent-kafka's ``AvroSerializer`` against the
real registry (Apicurio 3.0.9). This is the choice docs/design/schemas.md (10.8, typed tables) records; typed
ingest against Spark's ``from_avro`` is ``bench/typed_ingest.py``.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from bench.common import progress, timed, write_result
from shale.dev import SchemaRegistry
from shale.schemas.avro import Decoder
from shale.schemas.wire import payload, schema_id

RECORDS = 50_000
SCHEMA: dict[str, Any] = {"type": "record", "name": "Event", "namespace": "bench", "fields": [
    {"name": "id", "type": "long"},
    {"name": "uuid", "type": {"type": "string", "logicalType": "uuid"}},
    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
    {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B", "C"]}},
    {"name": "user", "type": {"type": "record", "name": "User", "fields": [
        {"name": "name", "type": "string"}, {"name": "age", "type": "int"}, {"name": "email", "type": "string"},
        {"name": "address", "type": {"type": "record", "name": "Address", "fields": [
            {"name": "street", "type": "string"}, {"name": "city", "type": "string"},
            {"name": "zip", "type": "int"}]}}]}},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "attrs", "type": {"type": "map", "values": "long"}},
    {"name": "note", "type": ["null", "string"], "default": None},
    {"name": "score", "type": "double"},
    {"name": "ratio", "type": "float"},
    {"name": "ok", "type": "boolean"},
    {"name": "host", "type": "string"},
    {"name": "level", "type": "string"},
    {"name": "msg", "type": "string"},
    {"name": "bytes_in", "type": "long"},
    {"name": "bytes_out", "type": "long"},
    {"name": "region", "type": "string"},
]}


def _datum(i: int) -> dict[str, Any]:
    return {
        "id": i, "uuid": str(uuid.UUID(int=i)), "ts": dt.datetime(2026, 11, 24, tzinfo=dt.UTC) + dt.timedelta(
            milliseconds=i), "day": dt.date(2026, 11, 24), "amount": decimal.Decimal(f"{i}.{i % 100:02d}"),
        "kind": "ABC"[i % 3], "user": {"name": f"user{i}", "age": 20 + i % 50, "email": f"u{i}@example.com",
                                       "address": {"street": f"{i} Main St", "city": "Springfield", "zip": 10000}},
        "tags": [f"t{i % 7}", "x"], "attrs": {"a": i, "b": 2 * i}, "note": None if i % 2 else f"note {i}",
        "score": i / 3, "ratio": 0.5, "ok": bool(i % 2), "host": f"host{i % 16}", "level": "INFO",
        "msg": f"request {i} served", "bytes_in": 100 + i, "bytes_out": 2000 + i, "region": "eu-west-1",
    }


def run() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="shale-bench-registry-") as work:
        registry = SchemaRegistry(Path(work)).start()
        try:
            client = SchemaRegistryClient({"url": registry.url})
            context = SerializationContext("events", MessageField.VALUE)
            serializer = AvroSerializer(client, json.dumps(SCHEMA))
            values = [serializer(_datum(i), context) for i in range(RECORDS)]
            progress(f"{RECORDS} records serialized ({sum(len(v) for v in values) / RECORDS:.0f} bytes each)")
            arrow = Decoder(SCHEMA).arrow
            text = client.get_schema(schema_id(values[0])).schema_str

            deserializer = AvroDeserializer(client)
            deserializer(values[0], context)  # the schema fetched and cached, as Shale's decoder is built once
            with timed() as standard:
                rows = [deserializer(v, context) for v in values]
                # its values need the same conversion to the Arrow types (uuid, map): Shale's converter does it
                convert = Decoder(text)._convert
                pa.Table.from_pylist([convert(r) for r in rows], schema=pa.schema(list(arrow)))
            progress(f"confluent-kafka AvroDeserializer: {standard[0]:.2f} s")

            decoder = Decoder(text)
            with timed() as shale:
                rows = [decoder.decode(payload(v)) for v in values]
                pa.Table.from_pylist(rows, schema=pa.schema(list(arrow)))
            progress(f"shale.schemas Decoder (fastavro): {shale[0]:.2f} s")
        finally:
            registry.stop()
    per_million = shale[0] / RECORDS * 1e6
    return write_result(
        "typed_decode",
        figures={"records": RECORDS, "shale_seconds": round(shale[0], 3),
                 "shale_seconds_per_million_records": round(per_million, 1)},
        baseline={"confluent_avro_deserializer_seconds": round(standard[0], 3)},
        ratios={"vs_confluent_avro_deserializer": round(standard[0] / shale[0], 2)},
        notes="Decoding 20-field nested Avro records (decimal, timestamp-millis, date, uuid, enum, map, array, "
              "nullable union) from the Confluent wire format into one typed Arrow table, one process, no Spark: "
              "Shale's decoder (fastavro's schemaless reader) against confluent-kafka's AvroDeserializer, both "
              "with the schema cached. A ratio above 1 means Shale's path is faster.")
