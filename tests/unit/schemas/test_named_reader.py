"""Version rewinding: a named reader schema (the typed parsers' ``reader_schema_id``, what `shale reprocess
--schema-id` sets) makes every record of a chunk be read as that schema, whatever version wrote it; records that
cannot be are quarantined with the reason; the block records the named schema's id and fingerprint. The driver's
resolution and the hand-over to the executors (``KnownSchemas`` in the round's spec) work with schemas remembered
in the cache: no registry (nothing listens at REGISTRY's address)."""

from __future__ import annotations

import base64
import io
import itertools
import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from google.protobuf import descriptor_pb2, message_factory
from tests.factories import BASE_MS, backup_table

from shale.block import BlockMeta, read_dataset
from shale.config import BucketConfig, IngestConfig, ParserRule, SchemaRegistryConfig
from shale.encoder.chunks import Chunk, GroupSpec, decode_written, write_chunk
from shale.errors import ConfigError
from shale.ingest.plan import PartitionRange
from shale.objstore import task_bucket
from shale.reprocess.schema import ReaderSchema, resolve_reader
from shale.reprocess.task import run_partition
from shale.reprocess.wire import PartitionWork, RoundSpec, decode_spec, encode_spec, encode_work
from shale.schemas import avro, jsonschema, protobuf
from shale.schemas.registry import (
    KnownSchemas,
    RegisteredSchema,
    RegistryClient,
    SchemaReference,
)
from shale.schemas.wire import frame

REGISTRY = SchemaRegistryConfig(url="http://127.0.0.1:1/apis/ccompat/v7", timeout=2.0)
READ_MS = BASE_MS + 7 * 86_400_000
FDP = descriptor_pb2.FieldDescriptorProto
_ids = itertools.count(90_000)

V1: dict[str, Any] = {"type": "record", "name": "Order", "namespace": "shop",
                      "fields": [{"name": "id", "type": "long"}, {"name": "note", "type": "string"}]}
V2: dict[str, Any] = {**V1, "fields": [*V1["fields"], {"name": "channel", "type": "string", "default": "web"}]}
V3_INCOMPATIBLE: dict[str, Any] = {**V1, "fields": [{"name": "id", "type": "string"}, V1["fields"][1]]}


def _register(kind: str, text: str, references: tuple[SchemaReference, ...] = ()) -> int:
    sid = next(_ids)
    RegistryClient(REGISTRY).remember(RegisteredSchema(sid, kind, text, references))
    return sid


def _avro(schema: dict[str, Any], datum: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), datum)
    return out.getvalue()


def _table(values: list[bytes]) -> pa.Table:
    table = backup_table("app", 0, 0, len(values))
    return table.set_column(table.schema.get_field_index("value"), "value", pa.array(values, pa.binary()))


def _store(parser: str, values: list[bytes], **options: Any) -> tuple[pa.Table | None, list[str], list[BlockMeta]]:
    spec = GroupSpec("partition", 2, BucketConfig(url=f"memory://named-{uuid.uuid4().hex}"),
                     IngestConfig(parsers=[ParserRule(parser=parser, options=options)], schema_registry=REGISTRY))
    bucket = task_bucket(spec.bucket)
    written = write_chunk(spec, bucket, _table(values), Chunk("app", 0, "", 0, len(values), READ_MS))
    return _read(bucket, written.blocks, len(values))


def _read(bucket: Any, blocks: list[BlockMeta], count: int) -> tuple[pa.Table | None, list[str], list[BlockMeta]]:
    rows = [read_dataset(bucket, m, d) for m in blocks for d in m.datasets if d.kind == "records"]
    reasons = [r for m in blocks for d in m.datasets if d.kind == "quarantine"
               for r in read_dataset(bucket, m, d).column("reason").to_pylist()]
    assert sum(m.rows for m in blocks) == count  # nothing dropped
    return (pa.concat_tables(rows) if rows else None), reasons, blocks


def _records(blocks: list[BlockMeta]) -> list[tuple[BlockMeta, Any]]:
    return [(m, d) for m in blocks for d in m.datasets if d.kind == "records"]


# --- Avro ----------------------------------------------------------------------------------------------------------

def test_avro_records_of_every_version_are_read_as_the_named_older_version() -> None:
    v1, v2, v3 = (_register("AVRO", json.dumps(s)) for s in (V1, V2, V3_INCOMPATIBLE))
    values = [frame(v1, _avro(V1, {"id": 1, "note": "a"})),
              frame(v2, _avro(V2, {"id": 2, "note": "b", "channel": "app"})),
              frame(v3, _avro(V3_INCOMPATIBLE, {"id": "three", "note": "c"}))]
    stored, reasons, blocks = _store("avro", values, reader_schema_id=v1)
    assert stored is not None
    assert stored.column("id").to_pylist() == [1, 2]
    assert "channel" not in stored.column_names  # v2's field is not in the named v1
    assert len(reasons) == 1
    assert f"written with schema id {v3} cannot be read as the named reader schema id {v1}" in reasons[0]
    ((meta, dataset),) = _records(blocks)
    assert meta.parser is not None
    assert meta.parser.reader_schema_id == v1
    assert dataset.schema_fingerprint == avro.fingerprint(json.dumps(V1))
    assert {v1, v2} <= set(dataset.schema_ids or [])


def test_without_a_named_schema_the_newest_is_the_reader_and_no_id_is_recorded() -> None:
    v1, v2 = (_register("AVRO", json.dumps(s)) for s in (V1, V2))
    stored, reasons, blocks = _store("avro", [frame(v1, _avro(V1, {"id": 1, "note": "a"})),
                                              frame(v2, _avro(V2, {"id": 2, "note": "b", "channel": "app"}))])
    assert reasons == []
    assert stored is not None
    assert stored.column("channel").to_pylist() == [None, "app"]  # v1 does not declare it: null, not its default
    ((meta, dataset),) = _records(blocks)
    assert meta.parser is not None
    assert meta.parser.reader_schema_id is None
    assert b"reader_schema_id" not in meta.to_json()  # blocks without one are byte for byte as before
    assert dataset.schema_fingerprint == avro.fingerprint(json.dumps(V2))


def test_a_named_schema_of_another_format_quarantines_every_record_with_the_reason() -> None:
    v1 = _register("AVRO", json.dumps(V1))
    other = _register("JSON", json.dumps({"type": "object", "properties": {"id": {"type": "integer"}}}))
    stored, reasons, _ = _store("avro", [frame(v1, _avro(V1, {"id": 1, "note": "a"}))] * 3, reader_schema_id=other)
    assert stored is None
    assert reasons == [f"the named reader schema id {other} is a JSON schema, not AVRO"] * 3


# --- Protobuf ------------------------------------------------------------------------------------------------------

def _files() -> tuple[descriptor_pb2.FileDescriptorProto, descriptor_pb2.FileDescriptorProto]:
    old = descriptor_pb2.FileDescriptorProto(name="reading.proto", package="meter", syntax="proto3")
    message = old.message_type.add(name="Reading")
    message.field.add(name="id", number=1, type=FDP.TYPE_INT64, label=FDP.LABEL_OPTIONAL)
    new = descriptor_pb2.FileDescriptorProto()
    new.CopyFrom(old)
    new.message_type[0].field.add(name="unit", number=2, type=FDP.TYPE_STRING, label=FDP.LABEL_OPTIONAL)
    return old, new


def _b64(file: descriptor_pb2.FileDescriptorProto) -> str:
    return base64.standard_b64encode(file.SerializeToString()).decode()


def test_protobuf_records_are_parsed_with_the_named_descriptor() -> None:
    old, new = _files()
    old_id, new_id = _register("PROTOBUF", _b64(old)), _register("PROTOBUF", _b64(new))
    old_cls = message_factory.GetMessageClass(protobuf.ProtoFile(old, []).message([0]))
    new_cls = message_factory.GetMessageClass(protobuf.ProtoFile(new, []).message([0]))
    values = [frame(old_id, b"\x00" + old_cls(id=1).SerializeToString()),
              frame(new_id, b"\x00" + new_cls(id=2, unit="kg").SerializeToString())]
    stored, reasons, blocks = _store("protobuf", values, reader_schema_id=old_id)
    assert reasons == []
    assert stored is not None
    assert stored.column("id").to_pylist() == [1, 2]
    assert "unit" not in stored.column_names
    ((meta, dataset),) = _records(blocks)
    assert meta.parser is not None
    assert meta.parser.reader_schema_id == old_id
    file = protobuf.ProtoFile(old, [])
    assert dataset.schema_fingerprint == file.fingerprint(file.message([0]))


def test_a_named_protobuf_schema_without_the_records_message_quarantines_them() -> None:
    old, _ = _files()
    other = descriptor_pb2.FileDescriptorProto(name="other.proto", package="other", syntax="proto3")
    other.message_type.add(name="Thing").field.add(name="x", number=1, type=FDP.TYPE_INT64,
                                                   label=FDP.LABEL_OPTIONAL)
    old_id, other_id = _register("PROTOBUF", _b64(old)), _register("PROTOBUF", _b64(other))
    old_cls = message_factory.GetMessageClass(protobuf.ProtoFile(old, []).message([0]))
    stored, reasons, _ = _store("protobuf", [frame(old_id, b"\x00" + old_cls(id=1).SerializeToString())],
                                reader_schema_id=other_id)
    assert stored is None
    assert reasons == [f"the named reader schema id {other_id} does not declare the message meter.Reading"]


# --- JSON Schema ---------------------------------------------------------------------------------------------------

J1: dict[str, Any] = {"type": "object", "properties": {"id": {"type": "integer"}, "note": {"type": "string"}},
                      "required": ["id", "note"]}
J2: dict[str, Any] = {"type": "object", "properties": {**J1["properties"], "channel": {"type": "string"}},
                      "required": ["id"]}


def test_json_records_are_validated_and_converted_by_the_named_schema() -> None:
    j1, j2 = _register("JSON", json.dumps(J1)), _register("JSON", json.dumps(J2))
    values = [frame(j1, b'{"id": 1, "note": "a"}'), frame(j2, b'{"id": 2, "note": "b", "channel": "app"}'),
              frame(j2, b'{"id": 3}')]  # valid for v2, but v1 requires a note
    stored, reasons, blocks = _store("json_schema", values, reader_schema_id=j1)
    assert stored is not None
    assert stored.column("id").to_pylist() == [1, 2]
    assert "channel" not in stored.column_names
    assert len(reasons) == 1
    assert reasons[0].startswith(f"the record does not fit the named reader schema id {j1}")
    ((meta, dataset),) = _records(blocks)
    assert meta.parser is not None
    assert meta.parser.reader_schema_id == j1
    assert dataset.schema_fingerprint == jsonschema.fingerprint(J1)


# --- the driver's resolution and the executors' hand-over ---------------------------------------------------------

def test_the_driver_resolves_a_named_id_and_refuses_what_cannot_fit() -> None:
    v1 = _register("AVRO", json.dumps(V1))
    options, known = resolve_reader(REGISTRY, "avro", {"time_field": ""}, ReaderSchema(schema_id=v1))
    assert options == {"time_field": "", "reader_schema_id": v1}
    assert [s.id for s in known.schemas] == [v1]
    with pytest.raises(ConfigError, match="either by --schema-id"):
        resolve_reader(REGISTRY, "avro", {}, ReaderSchema(schema_id=v1, subject="orders-value", version="1"))
    with pytest.raises(ConfigError, match="go together"):
        resolve_reader(REGISTRY, "avro", {}, ReaderSchema(subject="orders-value"))
    with pytest.raises(ConfigError, match="parser json reads no registry schemas"):
        resolve_reader(REGISTRY, "json", {"time_field": "t"}, ReaderSchema(schema_id=v1))
    with pytest.raises(ConfigError, match="named twice"):
        resolve_reader(REGISTRY, "avro", {"reader_schema_id": v1}, ReaderSchema(schema_id=v1))
    with pytest.raises(ConfigError, match="is a AVRO schema; parser protobuf reads PROTOBUF"):
        resolve_reader(REGISTRY, "protobuf", {}, ReaderSchema(schema_id=v1))
    not_a_record = _register("AVRO", json.dumps("string"))
    with pytest.raises(ConfigError, match=f"schema id {not_a_record} cannot be used by parser avro: .*not a record"):
        resolve_reader(REGISTRY, "avro", {}, ReaderSchema(schema_id=not_a_record))


def test_the_named_schema_and_its_references_cross_to_the_task_which_reads_no_registry_for_them() -> None:
    v1_text, v2_text = json.dumps(V1), json.dumps(V2)
    v1, v2 = next(_ids), next(_ids)  # fresh ids: not in this process's cache
    assert RegistryClient(REGISTRY).cached(v1) is None
    reference = SchemaReference("dep.proto", "dep", 3)
    known = KnownSchemas((RegisteredSchema(v1, "AVRO", v1_text, (reference,)),),
                         ((reference, RegisteredSchema(0, "PROTOBUF", "syntax = 'proto3';")),))
    # The executor's cache knows only the writer schema v2 (as if an earlier task had read it): the named v1 comes
    # with the round's spec, crossing as JSON like every spec.
    RegistryClient(REGISTRY).remember(RegisteredSchema(v2, "AVRO", v2_text))
    bucket_config = BucketConfig(url=f"memory://named-task-{uuid.uuid4().hex}")
    bucket = task_bucket(bucket_config)
    values = [frame(v2, _avro(V2, {"id": i, "note": f"n{i}", "channel": "app"})) for i in range(5)]
    backup = write_chunk(GroupSpec("backup", 1, bucket_config, IngestConfig()), bucket, _table(values),
                         Chunk("app", 0, "", 0, 5, READ_MS))
    ingest = IngestConfig(parsers=[ParserRule(parser="avro", options={"reader_schema_id": v1})],
                          schema_registry=REGISTRY)
    spec = RoundSpec(READ_MS, 2, ingest, 64 << 20, known)
    assert decode_spec(encode_spec(spec)) == spec
    written = decode_written(run_partition(encode_work(PartitionWork(PartitionRange("app", 0, "", 0, 5),
                                                                     tuple(backup.blocks))),
                                           encode_spec(spec), bucket_config))
    stored, reasons, blocks = _read(bucket, [m for w in written for m in w.blocks], 5)
    assert reasons == []
    assert stored is not None
    assert stored.column_names[-2:] == ["id", "note"]
    assert blocks[0].parser is not None
    assert blocks[0].parser.reader_schema_id == v1
    assert blocks[0].derived_from == [m.id for m in backup.blocks]
    client = RegistryClient(REGISTRY)
    assert client.cached(v1) == known.schemas[0]
    assert client.referenced(reference) == known.references[0][1]  # remembered: no request was made


def test_a_task_reads_writer_schemas_with_the_registry_password_the_json_spec_does_not_carry() -> None:
    """A real HTTP server standing for a registry that wants basic auth: the spec crosses as JSON, which masks the
    password, so the task must take the pickled registry configuration."""
    v2, heard = next(_ids), list[str | None]()
    expected = "Basic " + base64.b64encode(b"shale:sekret").decode()

    class Registry(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            heard.append(self.headers.get("Authorization"))
            ok = self.path.endswith(f"/schemas/ids/{v2}") and heard[-1] == expected
            body = json.dumps({"schema": json.dumps(V2), "schemaType": "AVRO"}).encode() if ok else b"{}"
            self.send_response(200 if ok else 401)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Registry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        registry = SchemaRegistryConfig(url=f"http://127.0.0.1:{server.server_address[1]}", username="shale",
                                        password="sekret", timeout=5.0)
        bucket_config = BucketConfig(url=f"memory://named-auth-{uuid.uuid4().hex}")
        bucket = task_bucket(bucket_config)
        values = [frame(v2, _avro(V2, {"id": i, "note": f"n{i}", "channel": "app"})) for i in range(3)]
        backup = write_chunk(GroupSpec("backup", 1, bucket_config, IngestConfig()), bucket, _table(values),
                             Chunk("app", 0, "", 0, 3, READ_MS))
        ingest = IngestConfig(parsers=[ParserRule(parser="avro", options={})], schema_registry=registry)
        spec_json = encode_spec(RoundSpec(READ_MS, 2, ingest, 64 << 20))
        assert "sekret" not in spec_json
        work = encode_work(PartitionWork(PartitionRange("app", 0, "", 0, 3), tuple(backup.blocks)))
        written = decode_written(run_partition(work, spec_json, bucket_config, registry))
    finally:
        server.shutdown()
    stored, reasons, _ = _read(bucket, [m for w in written for m in w.blocks], 3)
    assert reasons == []
    assert stored is not None
    assert stored.column("channel").to_pylist() == ["app"] * 3
    assert heard == [expected]  # asked once, with the password
