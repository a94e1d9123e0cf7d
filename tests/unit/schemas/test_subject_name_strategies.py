"""Subject name strategies (``subject_name_strategy`` record / topic_record): a topic of several record types stores
each type as its own records dataset of the block, typed by the newest schema of that type in the chunk, with a
``record`` label; the default (topic) writes the blocks of before. Schemas remembered in the cache: no registry."""

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
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.factories import BASE_MS, backup_table

from shale.block import BlockMeta, read_dataset
from shale.block.meta import Dataset
from shale.config import BucketConfig, IngestConfig, ParserRule, SchemaRegistryConfig
from shale.encoder.chunks import Chunk, GroupSpec, Written, write_chunk
from shale.encoder.parsers import load_parser
from shale.errors import ConfigError
from shale.objstore import open_bucket
from shale.schemas.registry import RegisteredSchema, RegistryClient
from shale.schemas.wire import frame

REGISTRY = SchemaRegistryConfig(url="http://127.0.0.1:1/apis/ccompat/v7", timeout=2.0)
READ_MS = BASE_MS + 7 * 86_400_000
_ids = itertools.count(97_000)
FDP = descriptor_pb2.FieldDescriptorProto


def _register(kind: str, schema: Any) -> int:
    sid = next(_ids)
    text = schema if isinstance(schema, str) else json.dumps(schema)
    RegistryClient(REGISTRY).remember(RegisteredSchema(sid, kind, text))
    return sid


def _avro_schema(kind: int, version: int) -> dict[str, Any]:
    """Record type ``shop.T<kind>``, version ``version``: each version adds a field with a default."""
    fields: list[dict[str, Any]] = [{"name": f"t{kind}_id", "type": "long"}]
    fields += [{"name": f"t{kind}_v{v}", "type": "string", "default": "-"} for v in range(1, version + 1)]
    return {"type": "record", "name": f"T{kind}", "namespace": "shop", "fields": fields}


TYPES, VERSIONS = 3, 3
AVRO_IDS = {(k, v): _register("AVRO", _avro_schema(k, v)) for v in range(VERSIONS) for k in range(TYPES)}


def _avro(kind: int, version: int, n: int) -> bytes:
    schema = _avro_schema(kind, version)
    datum: dict[str, Any] = {f"t{kind}_id": n, **{f"t{kind}_v{v}": f"x{n}" for v in range(1, version + 1)}}
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), datum)
    return frame(AVRO_IDS[(kind, version)], out.getvalue())


def _write(parser: str, values: list[bytes], options: dict[str, Any] | None = None,
           step_ms: int = 1000) -> tuple[Written, Any]:
    table = backup_table("app", 0, 0, len(values), step_ms=step_ms)
    table = table.set_column(table.schema.get_field_index("value"), "value", pa.array(values, pa.binary()))
    spec = GroupSpec("partition", 1, BucketConfig(url=f"memory://sns-{uuid.uuid4().hex}"),
                     IngestConfig(parsers=[ParserRule(parser=parser, options=options or {})],
                                  schema_registry=REGISTRY))
    bucket = open_bucket(spec.bucket)
    written = write_chunk(spec, bucket, table, Chunk("app", 0, "", 0, len(values), READ_MS))
    assert sum(m.rows for m in written.blocks) == len(values)  # nothing dropped
    return written, bucket


def _records(written: Written) -> list[tuple[BlockMeta, Dataset]]:
    return [(m, d) for m in written.blocks for d in m.datasets if d.kind == "records"]


def _reasons(written: Written, bucket: Any) -> list[str]:
    return [r for m in written.blocks for d in m.datasets if d.kind == "quarantine"
            for r in read_dataset(bucket, m, d).column("reason").to_pylist()]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=st.lists(st.tuples(st.integers(0, TYPES - 1), st.integers(0, VERSIONS - 1)), min_size=1,
                        max_size=40),
       strategy=st.sampled_from(["record", "topic_record"]), step_ms=st.sampled_from([1000, 3_600_000]))
def test_any_interleaving_of_types_and_versions_gives_one_dataset_per_type_and_each_record_once(
        records: list[tuple[int, int]], strategy: str, step_ms: int) -> None:
    values = [_avro(k, v, n) for n, (k, v) in enumerate(records)]
    written, bucket = _write("avro", values, {"subject_name_strategy": strategy}, step_ms=step_ms)
    assert _reasons(written, bucket) == []
    seen: dict[str, list[int]] = {}
    for meta, dataset in _records(written):
        assert dataset.record is not None
        assert dataset.name == f"records/app/{dataset.record}"
        assert all(ls["record"] == dataset.record for ls in dataset.labels)
        kind = int(dataset.record.removeprefix("shop.T"))
        rows = read_dataset(bucket, meta, dataset)
        offsets = rows.column("offset").to_pylist()
        assert {records[o][0] for o in offsets} == {kind}  # only its own type's records
        # each version fills its own fields' columns: the newest field is a column, null in older rows
        newest = max(v for k, v in records if k == kind)
        assert dataset.schema_ids == sorted({AVRO_IDS[(kind, v)] for k, v in records if k == kind})
        if newest:
            column = rows.column(f"t{kind}_v{newest}").to_pylist()
            assert column == [f"x{o}" if records[o][1] >= newest else None for o in offsets]
        seen.setdefault(dataset.record, []).extend(offsets)
    for meta in written.blocks:  # per block: exactly one records dataset per type among its rows
        names = [d.record for d in meta.datasets if d.kind == "records"]
        assert len(names) == len(set(names))
    # objects grow with the number of types, never with versions
    days = {(n * step_ms + BASE_MS) // 86_400_000 for n in range(len(records))}
    assert len(_records(written)) <= len({k for k, _ in records}) * len(days)
    assert {r: sorted(o) for r, o in seen.items()} == {
        f"shop.T{k}": [n for n, (kk, _) in enumerate(records) if kk == k] for k in {k for k, _ in records}}


def test_the_topic_strategy_writes_the_blocks_of_before_without_a_record() -> None:
    values = [_avro(0, 0, 0), _avro(0, 1, 1), _avro(1, 0, 2)]
    written, bucket = _write("avro", values)
    (meta, dataset), = _records(written)
    assert dataset.name == "records/app"
    assert dataset.record is None
    assert all("record" not in ls for ls in dataset.labels)
    assert b'"record"' not in meta.to_json()
    assert len(_reasons(written, bucket)) == 1  # the minority type, as before


def test_an_old_meta_json_without_record_reads_as_one_type() -> None:
    raw = {"name": "records/app", "kind": "records", "topic": "app", "file": "records-0.parquet", "rows": 1,
           "bytes": 1, "min_time": 0, "max_time": 0}
    assert Dataset.model_validate(raw).record is None
    with pytest.raises(ValueError, match="record type"):
        Dataset.model_validate({**raw, "record": "not a name"})


def test_json_schema_titles_are_record_types_and_a_title_that_cannot_name_a_dataset_is_quarantined() -> None:
    order = _register("JSON", {"title": "shop.Order", "type": "object", "properties": {"id": {"type": "integer"}}})
    refund = _register("JSON", {"title": "shop.Refund", "type": "object", "properties": {
        "id": {"type": "integer"}, "why": {"type": "string"}}})
    spaced = _register("JSON", {"title": "Order Event", "type": "object", "properties": {"id": {"type": "integer"}}})
    untitled = _register("JSON", {"type": "object", "properties": {"n": {"type": "integer"}}})
    values = [frame(order, b'{"id": 1}'), frame(refund, b'{"id": 2, "why": "late"}'), frame(spaced, b'{"id": 3}'),
              frame(order, b'{"id": 4}'), frame(untitled, b'{"n": 5}'), b"no header"]
    written, bucket = _write("json_schema", values, {"subject_name_strategy": "record"})
    got = {d.name: read_dataset(bucket, m, d).to_pydict() for m, d in _records(written)}
    assert got["records/app/shop.Order"]["id"] == [1, 4]
    assert got["records/app/shop.Refund"]["why"] == ["late"]
    assert got["records/app"]["n"] == [5]  # a schema without a title is one type, as under the topic strategy
    reasons = _reasons(written, bucket)
    assert len(reasons) == 2
    assert reasons[0].startswith("record type 'Order Event' is not allowed")
    assert "magic byte" in reasons[1]


def _proto_schema() -> tuple[int, Any, Any]:
    file = descriptor_pb2.FileDescriptorProto(name="shop.proto", package="shop", syntax="proto3")
    order = file.message_type.add(name="Order")
    order.field.add(name="id", number=1, type=FDP.TYPE_INT64, label=FDP.LABEL_OPTIONAL)
    refund = file.message_type.add(name="Refund")
    refund.field.add(name="id", number=1, type=FDP.TYPE_INT64, label=FDP.LABEL_OPTIONAL)
    refund.field.add(name="why", number=2, type=FDP.TYPE_STRING, label=FDP.LABEL_OPTIONAL)
    sid = _register("PROTOBUF", base64.standard_b64encode(file.SerializeToString()).decode())
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    classes = [message_factory.GetMessageClass(pool.FindMessageTypeByName(f"shop.{n}")) for n in ("Order", "Refund")]
    return sid, classes[0], classes[1]


def test_protobuf_message_types_are_record_types() -> None:
    sid, order, refund = _proto_schema()
    values = [frame(sid, b"\x00" + order(id=1).SerializeToString()),  # message indexes [0]
              frame(sid, b"\x02\x02" + refund(id=2, why="late").SerializeToString()),  # [1]
              frame(sid, b"\x00" + order(id=3).SerializeToString())]
    written, bucket = _write("protobuf", values, {"subject_name_strategy": "topic_record"})
    got = {d.record: read_dataset(bucket, m, d).to_pydict() for m, d in _records(written)}
    assert got["shop.Order"]["id"] == [1, 3]
    assert "why" not in got["shop.Order"]
    assert got["shop.Refund"]["why"] == ["late"]
    assert _reasons(written, bucket) == []


@pytest.mark.parametrize("parser", ["avro", "protobuf", "json_schema"])
def test_bad_strategies_and_combinations_are_refused_when_the_configuration_loads(parser: str) -> None:
    refused = "subject_name_strategy = 'records': Input should be 'topic', 'record' or 'topic_record'"
    with pytest.raises(ValueError, match=refused):
        IngestConfig(parsers=[ParserRule(parser=parser, options={"subject_name_strategy": "records"})])
    with pytest.raises(ValueError, match="reader_schema_id names one schema"):
        IngestConfig(parsers=[ParserRule(parser=parser, options={"subject_name_strategy": "record",
                                                                 "reader_schema_id": 3})])
    with pytest.raises(ConfigError, match="clashes with the label naming each record type"):
        load_parser(parser, {"subject_name_strategy": "record", "label_fields": ["record"]})
