"""A Debezium topic as Confluent's Protobuf converter writes it (Confluent wire format, the envelope a message of
``before`` and ``after`` rows, ``source``, ``op`` and ``ts_ms``; the schema in the registry), parsed by the real
``protobuf`` parser (the envelope's top-level fields become columns) and read through ``read_latest``: a snapshot,
creates, updates, a delete and its tombstone, a truncate, in two partitions; then the same with the rows of a
newer version of the envelope whose row gained a column (the registry's BACKWARD change). And the same events as
Confluent's JSON Schema converter writes them, through the real ``json_schema`` parser."""

from __future__ import annotations

import base64
import itertools
import json
import uuid
from pathlib import Path

import pyarrow as pa
from tests.factories import BASE_MS
from tests.protobuf_evolution import Field, build, message_class, set_values
from tests.unit.changes.test_change_avro import _records

from shale.config import BucketConfig, IngestConfig, ParserRule, SchemaRegistryConfig
from shale.encoder.chunks import Chunk, GroupSpec, write_chunk
from shale.metastore import AddBlocks, MetastoreService, SingleNodeLog, StateMachine, read_only_index
from shale.objstore import open_bucket
from shale.query import Query, read_latest
from shale.schemas.registry import RegisteredSchema, RegistryClient
from shale.schemas.wire import frame

REGISTRY = SchemaRegistryConfig(url="http://127.0.0.1:1/apis/ccompat/v7", timeout=2.0)
_ids = itertools.count(58_000)
TOPIC = "shop.public.customers"
RULE = ParserRule(topic_pattern=r"shop\..*", parser="protobuf", table="debezium")
JSON_RULE = ParserRule(topic_pattern=r"shop\..*", parser="json_schema", table="debezium")


def _envelope(row: tuple[Field, ...]) -> tuple[Field, ...]:
    return (Field(1, "before", "message", "implicit", nested=row), Field(2, "after", "message", "implicit", nested=row),
            Field(3, "source", "message", "implicit", nested=(Field(1, "connector", "string", "implicit"),
                                                               Field(2, "ts_ms", "int64", "implicit"))),
            Field(4, "op", "string", "implicit"), Field(5, "ts_ms", "int64", "optional"))


V1 = _envelope((Field(1, "id", "int32", "implicit"), Field(2, "name", "string", "optional")))
V2 = _envelope((Field(1, "id", "int32", "implicit"), Field(2, "name", "string", "optional"),
                Field(3, "tier", "string", "optional")))


class Writer:
    """The converter of one envelope version: its schema registered, each event framed as it frames one."""

    def __init__(self, fields: tuple[Field, ...]) -> None:
        file = build(fields, "shop.public.customers")
        self.fields, self.cls, self.sid = fields, message_class(file), next(_ids)
        RegistryClient(REGISTRY).remember(RegisteredSchema(self.sid, "PROTOBUF", _b64(file.SerializeToString())))

    def event(self, op: str, row: dict[str, object] | None, ms: int) -> bytes:
        sets: dict[str, object] = {"source": {"connector": "postgresql", "ts_ms": ms}, "op": op, "ts_ms": ms + 3}
        if row is not None and op not in ("d", "t"):
            sets["after"] = row
        if op in ("u", "d") and row is not None:
            sets["before"] = {"id": row["id"]}
        message = self.cls()
        set_values(message, self.fields, sets)
        return frame(self.sid, b"\x00" + message.SerializeToString())


def _b64(data: bytes) -> str:
    return base64.standard_b64encode(data).decode()


def _latest(tmp_path: Path, partitions: dict[int, list[tuple[bytes | None, bytes | None]]],
            rule: ParserRule = RULE) -> tuple[pa.Table, object]:
    bucket = BucketConfig(url=f"memory://change-protobuf-{uuid.uuid4().hex}")
    store = open_bucket(bucket)
    spec = GroupSpec("partition", 1, bucket, IngestConfig(default_tenant="acme", parsers=[rule],
                                                          schema_registry=REGISTRY))
    blocks = []
    for partition, changes in partitions.items():
        written = write_chunk(spec, store, _records(partition, changes, BASE_MS + 100),
                              Chunk(TOPIC, partition, "", 0, len(changes), BASE_MS + 10_000))
        assert written.quarantined == sum(1 for _, v in changes if v is None)  # tombstones: no value to parse
        blocks += written.blocks
    state = StateMachine(tmp_path / f"{uuid.uuid4().hex}.db")
    MetastoreService(state, SingleNodeLog(state)).submit(AddBlocks(blocks=blocks)).raise_for_rejection()
    return read_latest(Query("acme", 0, 1, f'{{topic="{TOPIC}"}}'), read_only_index(state.path), store, [rule])


def test_a_debezium_protobuf_topic_reads_as_its_latest_rows(tmp_path: Path) -> None:
    w = Writer(V1)
    ms = BASE_MS
    p0 = [(b"1", w.event("r", {"id": 1, "name": "snap1"}, ms)), (b"2", w.event("r", {"id": 2, "name": "snap2"}, ms)),
          (b"1", w.event("u", {"id": 1, "name": "one"}, ms + 10)), (b"2", w.event("d", {"id": 2}, ms + 11)),
          (b"2", None), (None, w.event("t", None, ms + 20)),  # truncate: every row changed before it goes
          (b"4", w.event("c", {"id": 4, "name": "four"}, ms + 30))]
    p1 = [(b"3", w.event("c", {"id": 3, "name": "three"}, ms + 5)), (b"5", w.event("c", {"id": 5}, ms + 25)),
          (b"3", w.event("u", {"id": 3, "name": "three b"}, ms + 15)),
          (b"5", w.event("u", {"id": 5, "name": "five b"}, ms + 26))]
    view, stats = _latest(tmp_path, {0: p0, 1: p1})
    rows = {r["id"]: r["name"] for r in view.column("after").to_pylist()}
    assert rows == {4: "four", 5: "five b"}  # 1 and 3 changed before the truncate; 2 deleted; 5 after it
    assert set(view.column("op").to_pylist()) == {"c", "u"}
    assert (stats.deleted, stats.withheld) == (3, 0)  # type: ignore[attr-defined]


def test_rows_of_two_envelope_versions_in_one_chunk(tmp_path: Path) -> None:
    """The row gained a column (``tier``): a key last changed by the old version reads it null, one changed by the
    new version has it; a key deleted by the new version is gone."""
    old, new = Writer(V1), Writer(V2)
    ms = BASE_MS
    p0 = [(b"1", old.event("c", {"id": 1, "name": "one"}, ms)), (b"2", old.event("c", {"id": 2, "name": "two"}, ms)),
          (b"3", old.event("c", {"id": 3, "name": "three"}, ms)),
          (b"2", new.event("u", {"id": 2, "name": "two b", "tier": "gold"}, ms + 5)),
          (b"3", new.event("d", {"id": 3}, ms + 6))]
    view, _ = _latest(tmp_path, {0: p0})
    rows = {r["id"]: (r["name"], r.get("tier")) for r in view.column("after").to_pylist()}
    assert rows == {1: ("one", None), 2: ("two b", "gold")}


ROW_SCHEMA = {"type": ["object", "null"], "properties": {"id": {"type": "integer"},
                                                        "name": {"type": ["string", "null"]}}}
JSON_ENVELOPE = {"type": "object", "title": "shop.public.customers.Envelope", "properties": {
    "before": ROW_SCHEMA, "after": ROW_SCHEMA,
    "source": {"type": "object", "properties": {"connector": {"type": "string"}, "ts_ms": {"type": "integer"}}},
    "op": {"type": "string"}, "ts_ms": {"type": ["integer", "null"]}}}


def test_a_debezium_json_schema_topic_reads_as_its_latest_rows(tmp_path: Path) -> None:
    sid = next(_ids)
    RegistryClient(REGISTRY).remember(RegisteredSchema(sid, "JSON", json.dumps(JSON_ENVELOPE)))

    def event(op: str, row: dict[str, object] | None, ms: int) -> bytes:
        document = {"before": {"id": row["id"], "name": None} if op in ("u", "d") and row else None,
                    "after": row if op not in ("d", "t") else None,
                    "source": {"connector": "postgresql", "ts_ms": ms}, "op": op, "ts_ms": ms + 3}
        return frame(sid, json.dumps(document).encode())

    ms = BASE_MS
    p0 = [(b"1", event("r", {"id": 1, "name": "snap1"}, ms)), (b"2", event("r", {"id": 2, "name": "snap2"}, ms)),
          (b"1", event("u", {"id": 1, "name": "one"}, ms + 10)), (b"2", event("d", {"id": 2}, ms + 11)),
          (b"2", None), (None, event("t", None, ms + 20)), (b"4", event("c", {"id": 4, "name": "four"}, ms + 30))]
    p1 = [(b"3", event("c", {"id": 3, "name": "three"}, ms + 5)), (b"5", event("c", {"id": 5, "name": None}, ms + 25)),
          (b"5", event("u", {"id": 5, "name": "five b"}, ms + 26))]
    view, stats = _latest(tmp_path, {0: p0, 1: p1}, JSON_RULE)
    rows = {r["id"]: r["name"] for r in view.column("after").to_pylist()}
    assert rows == {4: "four", 5: "five b"}
    assert (stats.deleted, stats.withheld) == (3, 0)  # type: ignore[attr-defined]
