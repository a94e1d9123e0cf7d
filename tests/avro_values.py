"""Avro records (and JSON Schema documents, Protobuf messages) stored as the partition group stores them (the
registry answered from its per-process cache), and the values every reader must give back: the writer's
(``tests/unit/schemas/test_avro_roundtrip.py`` says what fastavro's datum reads back as), in each reader's types."""

from __future__ import annotations

import datetime as dt
import decimal
import itertools
from pathlib import Path
from typing import Any

import pyarrow as pa

from shale.config import BucketConfig, IngestConfig, ParserRule
from shale.encoder.chunks import Chunk, GroupSpec, write_chunk
from shale.metastore import MetastoreService
from shale.objstore import open_bucket
from shale.schemas import frame
from tests.factories import BASE_MS, backup_table
from tests.iceberg_helpers import commit
from tests.unit.schemas.test_avro_roundtrip import REGISTRY, _encode, _register, expected

TENANT = "default"
_topics = itertools.count()


def store(service: MetastoreService, bucket: BucketConfig, schema: dict[str, Any], datums: list[Any]) -> str:
    """``datums`` of ``schema`` written and committed as one chunk of a new topic, whose name is returned."""
    sid = _register(schema)
    return _store_values(service, bucket, "avro", [frame(sid, _encode(schema, d)) for d in datums])


def store_json_schema(service: MetastoreService, bucket: BucketConfig, schema: dict[str, Any],
                      documents: list[Any]) -> str:
    """As ``store``, for JSON documents of a JSON Schema (the ``json_schema`` parser)."""
    from tests.unit.schemas.test_jsonschema_roundtrip import _framed
    from tests.unit.schemas.test_jsonschema_roundtrip import _register as register_json_schema
    sid = register_json_schema(schema)
    return _store_values(service, bucket, "json_schema", [_framed(sid, d) for d in documents])


def store_protobuf(service: MetastoreService, bucket: BucketConfig, file_b64: str, messages: list[Any]) -> str:
    """As ``store``, for Protobuf messages of one file (its first message; the ``protobuf`` parser)."""
    from tests.unit.schemas.test_protobuf_roundtrip import _framed
    from tests.unit.schemas.test_protobuf_roundtrip import _register as register_protobuf
    sid = register_protobuf(file_b64)
    return _store_values(service, bucket, "protobuf", [_framed(sid, m) for m in messages])


def _store_values(service: MetastoreService, bucket: BucketConfig, parser: str, values: list[bytes]) -> str:
    topic = f"typed{next(_topics)}"
    table = backup_table(topic, 0, 0, len(values))
    table = table.set_column(table.schema.get_field_index("value"), "value", pa.array(values, pa.binary()))
    spec = GroupSpec("partition", 1, bucket, IngestConfig(parsers=[ParserRule(parser=parser)],
                                                          schema_registry=REGISTRY))
    written = write_chunk(spec, open_bucket(bucket), table, Chunk(topic, 0, "", 0, len(values), BASE_MS + 86_400_000))
    commit(service, written.blocks)
    return topic


def config_file(tmp: Path, bucket: BucketConfig, metastore_dir: Path) -> Path:
    file = tmp / "shale.toml"
    file.write_text(f'[bucket]\nurl = "{bucket.url}"\n[metastore]\ndata_dir = "{metastore_dir}"\n')
    return file


def writer_rows(schema: dict[str, Any], datums: list[Any]) -> list[dict[str, Any]]:
    """What ``shale.read`` must return for each datum: the writer's value of each field."""
    return [{f["name"]: expected(f["type"], d[f["name"]]) for f in schema["fields"]} for d in datums]


def _micros_of_day(value: dt.time) -> int:
    return ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + value.microsecond


def canonical(t: pa.DataType, value: Any) -> Any:
    """``value`` of a column of Shale's read type ``t`` (or its Spark form) in one form both readers are compared in:
    a time of day as its microseconds since midnight (Spark's bigint), a decimal of more than 38 digits as its
    ``Decimal`` (Spark's exact text)."""
    if value is None:
        return None
    if pa.types.is_time(t):
        return value if isinstance(value, int) else _micros_of_day(value)
    if pa.types.is_decimal(t) and t.precision > 38:
        return decimal.Decimal(value) if isinstance(value, str) else value
    if pa.types.is_struct(t):
        return {t.field(i).name: canonical(t.field(i).type, value[t.field(i).name]) for i in range(t.num_fields)}
    if pa.types.is_map(t):
        return [(k, canonical(t.item_type, v)) for k, v in value]
    if pa.types.is_list(t):
        return [canonical(t.value_type, v) for v in value]
    return value
