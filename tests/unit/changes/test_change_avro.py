"""A Debezium topic as its Avro converter writes it (Confluent wire format, the writer schema in the registry),
parsed by the real ``avro`` parser (the envelope's top-level fields become columns: ``op`` a string, ``after`` and
``source`` structs), stored by the chunk writer and read through ``read_latest``: a snapshot, creates, updates, a
delete and its tombstone, a truncate, and a transaction block, in two partitions."""

from __future__ import annotations

import io
import itertools
import json
import uuid
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
from tests.factories import BASE_MS

from shale.block.schemas import BACKUP_SCHEMA
from shale.config import BucketConfig, IngestConfig, ParserRule, SchemaRegistryConfig
from shale.encoder.chunks import Chunk, GroupSpec, write_chunk
from shale.metastore import AddBlocks, MetastoreService, SingleNodeLog, StateMachine, read_only_index
from shale.objstore import open_bucket
from shale.query import Query, read_latest
from shale.schemas.registry import RegisteredSchema, RegistryClient
from shale.schemas.wire import frame

REGISTRY = SchemaRegistryConfig(url="http://127.0.0.1:1/apis/ccompat/v7", timeout=2.0)
_ids = itertools.count(57_000)
TOPIC = "shop.public.customers"
VALUE = {"type": "record", "name": "Value", "namespace": "shop.public.customers", "fields": [
    {"name": "id", "type": "int"}, {"name": "name", "type": ["null", "string"], "default": None}]}
ENVELOPE = {"type": "record", "name": "Envelope", "namespace": "shop.public.customers", "fields": [
    {"name": "before", "type": ["null", VALUE], "default": None},
    {"name": "after", "type": ["null", "shop.public.customers.Value"], "default": None},
    {"name": "source", "type": {"type": "record", "name": "Source", "namespace": "io.debezium.connector.postgresql",
                                "fields": [{"name": "connector", "type": "string"},
                                           {"name": "ts_ms", "type": "long"}]}},
    {"name": "op", "type": "string"},
    {"name": "ts_ms", "type": ["null", "long"], "default": None},
    {"name": "transaction", "type": ["null", {"type": "record", "name": "block", "namespace": "event", "fields": [
        {"name": "id", "type": "string"}, {"name": "total_order", "type": "long"},
        {"name": "data_collection_order", "type": "long"}]}], "default": None}]}
RULE = ParserRule(topic_pattern=r"shop\..*", parser="avro", table="debezium")


def _register() -> int:
    sid = next(_ids)
    RegistryClient(REGISTRY).remember(RegisteredSchema(sid, "AVRO", json.dumps(ENVELOPE)))
    return sid


def _event(sid: int, op: str, row_id: int | None, name: str | None, ms: int) -> bytes:
    row = None if op in ("d", "t") or row_id is None else {"id": row_id, "name": name}
    datum: dict[str, Any] = {"before": {"id": row_id, "name": None} if op in ("u", "d") else None, "after": row,
                             "source": {"connector": "postgresql", "ts_ms": ms}, "op": op, "ts_ms": ms + 3,
                             "transaction": {"id": "571:53195829", "total_order": 1, "data_collection_order": 1}}
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(ENVELOPE), datum)
    return frame(sid, out.getvalue())


def _records(partition: int, changes: list[tuple[bytes | None, bytes | None]], first_ms: int) -> pa.Table:
    count = len(changes)
    return pa.table({
        "topic": [TOPIC] * count, "partition": pa.array([partition] * count, pa.int32()),
        "offset": pa.array(range(count), pa.int64()),
        "timestamp": pa.array([first_ms + i for i in range(count)], pa.timestamp("ms", tz="UTC")),
        "timestamp_type": pa.array([0] * count, pa.int8()),
        "key": pa.array([k for k, _ in changes], pa.binary()), "value": pa.array([v for _, v in changes], pa.binary()),
        "headers": pa.array([[]] * count, BACKUP_SCHEMA.field("headers").type)}, schema=BACKUP_SCHEMA)


def test_a_debezium_avro_topic_reads_as_its_latest_rows(tmp_path: Path) -> None:
    sid = _register()
    ms = BASE_MS
    p0 = [(b"1", _event(sid, "r", 1, "snap1", ms)), (b"2", _event(sid, "r", 2, "snap2", ms)),
          (b"1", _event(sid, "u", 1, "one", ms + 10)), (b"2", _event(sid, "d", 2, None, ms + 11)), (b"2", None),
          (None, _event(sid, "t", None, None, ms + 20)),  # truncate: every row changed before it goes
          (b"4", _event(sid, "c", 4, "four", ms + 30))]
    p1 = [(b"3", _event(sid, "c", 3, "three", ms + 5)), (b"5", _event(sid, "c", 5, "five", ms + 25)),
          (b"3", _event(sid, "u", 3, "three b", ms + 15)), (b"5", _event(sid, "u", 5, "five b", ms + 26))]
    bucket = BucketConfig(url=f"memory://change-avro-{uuid.uuid4().hex}")
    store = open_bucket(bucket)
    spec = GroupSpec("partition", 1, bucket, IngestConfig(default_tenant="acme", parsers=[RULE],
                                                          schema_registry=REGISTRY))
    blocks = []
    for partition, changes in ((0, p0), (1, p1)):
        written = write_chunk(spec, store, _records(partition, changes, ms + 100),
                              Chunk(TOPIC, partition, "", 0, len(changes), ms + 10_000))
        assert written.quarantined == (1 if partition == 0 else 0)  # the tombstone: no value to parse
        blocks += written.blocks
    state = StateMachine(tmp_path / "s.db")
    MetastoreService(state, SingleNodeLog(state)).submit(AddBlocks(blocks=blocks)).raise_for_rejection()
    view, stats = read_latest(Query("acme", 0, 1, f'{{topic="{TOPIC}"}}'), read_only_index(state.path), store,
                              [RULE])
    rows = {r["id"]: r["name"] for r in view.column("after").to_pylist()}
    assert rows == {4: "four", 5: "five b"}  # 1 and 3 changed before the truncate; 2 deleted; 5 after it
    assert set(view.column("op").to_pylist()) == {"c", "u"}
    assert (stats.deleted, stats.withheld) == (3, 0)
