"""Schema-encoded record keys (``key_format`` of the avro, protobuf and json_schema parsers): the decoded key is one
typed column; a null key reads as null; a key that cannot be decoded quarantines its record with a "key:" reason;
random key bytes never raise out of the parser."""

from __future__ import annotations

import base64
import io
import itertools
import json
import uuid
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from google.protobuf import descriptor_pb2, message_factory
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.factories import BASE_MS, backup_table

from shale.block import read_dataset
from shale.config import BucketConfig, IngestConfig, ParserRule, SchemaRegistryConfig
from shale.encoder.chunks import Chunk, GroupSpec, write_chunk
from shale.encoder.parsers import load_parser
from shale.errors import ConfigError
from shale.objstore import open_bucket
from shale.schemas import protobuf
from shale.schemas.registry import RegisteredSchema, RegistryClient, RegistryUnavailableError
from shale.schemas.wire import frame

READ_MS = BASE_MS + 7 * 86_400_000
REGISTRY = SchemaRegistryConfig(url="http://127.0.0.1:1/apis/ccompat/v7", timeout=2.0)
_ids = itertools.count(20_000)
VALUE_SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}}


def _register(kind: str, text: str) -> int:
    sid = next(_ids)
    RegistryClient(REGISTRY).remember(RegisteredSchema(sid, kind, text))
    return sid


VALUE_ID = _register("JSON", json.dumps(VALUE_SCHEMA))


def _avro(schema: Any, datum: Any) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), datum)
    return out.getvalue()


def _store(keys: list[bytes | None], key_format: str, **options: Any) -> tuple[pa.Table | None, list[str]]:
    table = backup_table("app", 0, 0, len(keys))
    values = [frame(VALUE_ID, json.dumps({"n": i}).encode()) for i in range(len(keys))]
    table = table.set_column(table.schema.get_field_index("value"), "value", pa.array(values, pa.binary()))
    table = table.set_column(table.schema.get_field_index("key"), "key", pa.array(keys, pa.binary()))
    rule = ParserRule(parser="json_schema", options={"key_format": key_format, **options})
    spec = GroupSpec("partition", 1, BucketConfig(url=f"memory://keys-{uuid.uuid4().hex}"),
                     IngestConfig(parsers=[rule], schema_registry=REGISTRY))
    bucket = open_bucket(spec.bucket)
    written = write_chunk(spec, bucket, table, Chunk("app", 0, "", 0, len(keys), READ_MS))
    rows = [read_dataset(bucket, m, d) for m in written.blocks for d in m.datasets if d.kind == "records"]
    reasons = [r for m in written.blocks for d in m.datasets if d.kind == "quarantine"
               for r in read_dataset(bucket, m, d).column("reason").to_pylist()]
    assert sum(m.rows for m in written.blocks) == len(keys)
    return (pa.concat_tables(rows).sort_by("offset") if rows else None), reasons


def test_a_primitive_avro_key_is_a_typed_column_and_a_null_key_is_null() -> None:
    sid = _register("AVRO", json.dumps("long"))
    stored, reasons = _store([frame(sid, _avro("long", 7)), None, frame(sid, _avro("long", -(2**62)))], "avro")
    assert reasons == []
    assert stored is not None
    assert stored.schema.field("record_key").type == pa.int64()
    assert stored.column("record_key").to_pylist() == [7, None, -(2**62)]
    assert stored.column("n").to_pylist() == [0, 1, 2]


def test_a_record_key_of_an_older_avro_version_is_resolved_into_the_newest() -> None:
    old = {"type": "record", "name": "K", "fields": [{"name": "id", "type": "long"}]}
    new = {**old, "fields": [*old["fields"], {"name": "region", "type": "string", "default": "eu"}]}
    old_id, new_id = _register("AVRO", json.dumps(old)), _register("AVRO", json.dumps(new))
    stored, reasons = _store([frame(old_id, _avro(old, {"id": 1})), frame(new_id, _avro(new, {"id": 2,
                                                                                               "region": "us"}))],
                             "avro", key_column="k")
    assert reasons == []
    assert stored is not None
    assert stored.column("k").to_pylist() == [{"id": 1, "region": "eu"}, {"id": 2, "region": "us"}]


def test_protobuf_and_json_schema_keys() -> None:
    file = descriptor_pb2.FileDescriptorProto(name="k.proto", package="k", syntax="proto3")
    key = file.message_type.add(name="Key")
    key.field.add(name="tenant", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
                  label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    pb_id = _register("PROTOBUF", base64.standard_b64encode(file.SerializeToString()).decode())
    cls = message_factory.GetMessageClass(protobuf.ProtoFile(file, []).message([0]))
    stored, reasons = _store([frame(pb_id, b"\x00" + cls(tenant="acme").SerializeToString()), None], "protobuf")
    assert reasons == []
    assert stored is not None
    assert stored.column("record_key").to_pylist() == [{"tenant": "acme"}, None]

    js_id = _register("JSON", json.dumps({"type": "object", "properties": {"user": {"type": "string"}},
                                          "required": ["user"]}))
    stored, reasons = _store([frame(js_id, b'{"user": "u1"}'), frame(js_id, b'{"nobody": 1}')], "json_schema")
    assert stored is not None
    assert stored.column("record_key").to_pylist() == [{"user": "u1"}]
    assert len(reasons) == 1
    assert reasons[0].startswith("key written with schema id")
    assert '"user" is a required property' in reasons[0]


def test_keys_that_cannot_be_decoded_quarantine_their_records_with_the_reason() -> None:
    sid = _register("AVRO", json.dumps("string"))
    wrong_format = _register("JSON", json.dumps({"type": "string"}))
    stored, reasons = _store([frame(sid, _avro("string", "ok")), b"plain-key", frame(wrong_format, b'"x"'),
                              frame(sid, b"\x09")], "avro")
    assert stored is not None
    assert stored.column("record_key").to_pylist() == ["ok"]
    assert len(reasons) == 3
    assert any(r.startswith("key: the record does not start with the Schema Registry magic byte") for r in reasons)
    assert any(f"key: schema id {wrong_format} is a JSON schema, not avro" == r for r in reasons)
    assert any(r.startswith(f"key written with schema id {sid} does not decode") for r in reasons)


def test_the_key_column_must_not_clash() -> None:
    with pytest.raises(ConfigError, match="key_column 'offset'"):
        load_parser("json_schema", {"key_format": "avro", "key_column": "offset"})
    sid = _register("AVRO", json.dumps("string"))
    stored, reasons = _store([frame(sid, _avro("string", "a"))], "avro", key_column="n")  # a field of the value
    assert stored is None
    assert reasons == ["key column 'n' clashes with a field of the value: set the json_schema parser's key_column"]


def test_a_registry_that_does_not_answer_for_a_key_fails_the_chunk() -> None:
    with pytest.raises(RegistryUnavailableError):
        _store([frame(next(_ids) + 10**6, b"\x02")], "avro")


@settings(max_examples=40, deadline=None)
@given(st.lists(st.none() | st.binary(max_size=30), min_size=1, max_size=5), st.sampled_from(["avro", "protobuf",
                                                                                             "json_schema"]))
def test_random_key_bytes_never_raise_out_of_the_parser(keys: list[bytes | None], key_format: str) -> None:
    sid = {"avro": _register("AVRO", json.dumps({"type": "record", "name": "K", "fields": [
        {"name": "a", "type": ["null", "string"]}]})),
           "protobuf": _register("PROTOBUF", 'syntax = "proto3";\nmessage K { string a = 1; }\n'),
           "json_schema": _register("JSON", json.dumps(VALUE_SCHEMA))}[key_format]
    framed = [k if k is None or len(k) % 2 else frame(sid, k) for k in keys]
    try:
        _store(framed, key_format)  # every record stored or quarantined, nothing raised
    except RegistryUnavailableError:  # an id no process has seen and no registry to ask: the documented retry
        assert any(k is not None and len(k) >= 5 and k[0] == 0 and int.from_bytes(k[1:5], "big") != sid
                   for k in framed)
