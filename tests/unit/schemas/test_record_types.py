"""A topic whose records carry several record types (written under a record name strategy), until subject name
strategies are built: each chunk's records of the type most of them carry are stored, typed by that type's newest
schema, and the others are quarantined with the reason, in every format (Protobuf by message name, Avro by full
name, a renamed record with its aliases being the same type, JSON Schema by title), never typed by another type's
schema. Schemas remembered in the cache: no registry."""

from __future__ import annotations

import io
import itertools
import json
import uuid
from typing import Any

import fastavro
import pyarrow as pa
from tests.factories import BASE_MS, backup_table

from shale.block import read_dataset
from shale.config import BucketConfig, IngestConfig, ParserRule, SchemaRegistryConfig
from shale.encoder.chunks import Chunk, GroupSpec, write_chunk
from shale.encoder.parsers.registryparser import ONE_TYPE
from shale.objstore import open_bucket
from shale.schemas import avro
from shale.schemas.registry import RegisteredSchema, RegistryClient
from shale.schemas.wire import frame, id_counts

REGISTRY = SchemaRegistryConfig(url="http://127.0.0.1:1/apis/ccompat/v7", timeout=2.0)
READ_MS = BASE_MS + 7 * 86_400_000
_ids = itertools.count(95_000)

ORDER: dict[str, Any] = {"type": "record", "name": "Order", "namespace": "shop",
                         "fields": [{"name": "id", "type": "long"}]}
REFUND: dict[str, Any] = {"type": "record", "name": "Refund", "namespace": "shop",
                          "fields": [{"name": "id", "type": "long"}, {"name": "why", "type": "string"}]}


def _register(kind: str, schema: Any) -> int:
    sid = next(_ids)
    RegistryClient(REGISTRY).remember(RegisteredSchema(sid, kind, json.dumps(schema)))
    return sid


def _avro(sid: int, schema: dict[str, Any], datum: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), datum)
    return frame(sid, out.getvalue())


def _store(parser: str, values: list[bytes]) -> tuple[pa.Table | None, list[str]]:
    table = backup_table("app", 0, 0, len(values))
    table = table.set_column(table.schema.get_field_index("value"), "value", pa.array(values, pa.binary()))
    spec = GroupSpec("partition", 1, BucketConfig(url=f"memory://types-{uuid.uuid4().hex}"),
                     IngestConfig(parsers=[ParserRule(parser=parser, options={})], schema_registry=REGISTRY))
    bucket = open_bucket(spec.bucket)
    written = write_chunk(spec, bucket, table, Chunk("app", 0, "", 0, len(values), READ_MS))
    rows = [read_dataset(bucket, m, d) for m in written.blocks for d in m.datasets if d.kind == "records"]
    reasons = [r for m in written.blocks for d in m.datasets if d.kind == "quarantine"
               for r in read_dataset(bucket, m, d).column("reason").to_pylist()]
    assert sum(m.rows for m in written.blocks) == len(values)  # nothing dropped
    return (pa.concat_tables(rows) if rows else None), reasons


def test_avro_the_most_common_record_type_is_stored_and_the_others_quarantined() -> None:
    order, refund = _register("AVRO", ORDER), _register("AVRO", REFUND)  # the other type has the newest id
    stored, reasons = _store("avro", [_avro(order, ORDER, {"id": i}) for i in range(3)]
                             + [_avro(refund, REFUND, {"id": 9, "why": "late"})])
    assert stored is not None
    assert stored.column("id").to_pylist() == [0, 1, 2]
    assert "why" not in stored.column_names
    assert reasons == [f"the record is a shop.Refund (schema id {refund}), this chunk's records are shop.Order: one "
                       f"record type per topic {ONE_TYPE}"]


def test_avro_a_renamed_record_is_the_same_type_stored_in_one_dataset() -> None:
    renamed = {**ORDER, "name": "Purchase", "aliases": ["Order"],
               "fields": [*ORDER["fields"], {"name": "note", "type": "string", "default": "-"}]}
    old, new = _register("AVRO", ORDER), _register("AVRO", renamed)
    stored, reasons = _store("avro", [_avro(old, ORDER, {"id": i}) for i in range(3)]
                             + [_avro(new, renamed, {"id": 3, "note": "x"})])
    assert reasons == []
    assert stored is not None
    assert stored.column("id").to_pylist() == [0, 1, 2, 3]
    assert stored.column("note").to_pylist() == [None, None, None, "x"]  # the older version does not declare it


def test_json_schema_the_most_common_title_is_stored_and_the_others_quarantined() -> None:
    order = _register("JSON", {"title": "Order", "type": "object", "properties": {"id": {"type": "integer"}}})
    refund = _register("JSON", {"title": "Refund", "type": "object", "properties": {
        "id": {"type": "integer"}, "why": {"type": "string"}}})
    stored, reasons = _store("json_schema", [frame(order, b'{"id": %d}' % i) for i in range(3)]
                             + [frame(refund, b'{"id": 9, "why": "late"}')])
    assert stored is not None
    assert stored.column("id").to_pylist() == [0, 1, 2]
    assert reasons == [f"the record is a Refund (schema id {refund}), this chunk's records are Order: one record "
                       f"type per topic {ONE_TYPE}"]


def test_full_names_aliases_and_id_counts() -> None:
    assert avro.full_name(ORDER) == "shop.Order"
    assert avro.full_name({**ORDER, "name": "other.Order"}) == "other.Order"
    assert avro.full_name(json.dumps("string")) == "string"  # the registry's text of a primitive schema
    assert avro.full_name({"type": "array", "items": "long"}) == "array"
    assert avro.full_name("{not json") == ""
    assert avro.aliases({**ORDER, "aliases": ["Old", "legacy.Older"]}) == {"shop.Old", "legacy.Older"}
    assert avro.aliases(ORDER) == set()
    assert id_counts([frame(7, b""), frame(7, b"x"), frame(8, b""), None, b"\x01abcd", b"\x00"]) == {7: 2, 8: 1}
