"""Protobuf schema versions against the real Schema Registry (Apicurio 3.0.9), for a fixed set of (v1, v2) pairs.

Each pair is registered twice. As ``.proto`` text (what Java producers register and what Apicurio's compatibility
check reads) under the subject's BACKWARD rule: Apicurio 3.0.9 checks Protobuf with protolock's rules and refuses any
field type or label change (Confluent's registry accepts the ones that keep the wire type), so a refused pair is then
registered as the registry's default, no rule, accepts it; the records are framed by hand (magic byte, id, message
index 0, message). And by confluent-kafka's ``ProtobufSerializer`` (a base64 ``FileDescriptorProto``, which Apicurio
cannot check: no rule). Either way the records go through the ``protobuf`` parser as ingest writes a chunk (the
registry read over HTTP; no Kafka or Spark on this path), and every stored value is what its writer meant
(``tests.protobuf_evolution.expected``, the model of the unit property) or the record is quarantined naming the
field: the int64 of 5,000,000,000 in a field that became int32 is never stored as 705,032,704."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from tests.protobuf_evolution import (
    Field,
    Quarantined,
    build,
    by_name,
    canonical,
    message_class,
    outcome,
    proto_text,
    set_values,
    store_chunk,
)

from shale.config import SchemaRegistryConfig
from shale.dev import SchemaRegistry

Fields = tuple[Field, ...]


def _one(type_: str, name: str = "x", label: str = "implicit", **more: Any) -> Fields:
    return (Field(1, name, type_, label, **more),)


PAIRS: list[tuple[str, Fields, Fields, list[dict[str, Any]]]] = [
    ("int64 narrowed to int32", _one("int64"), _one("int32"), [{"x": 5_000_000_000}, {"x": -7}]),
    ("int32 to uint32", _one("int32"), _one("uint32"), [{"x": -1}, {"x": 5}]),
    ("uint32 to int32", _one("uint32"), _one("int32"), [{"x": 3_000_000_000}, {"x": 3}]),
    ("uint64 to int64", _one("uint64"), _one("int64"), [{"x": 2**63}, {"x": 9}]),
    ("int64 to bool", _one("int64"), _one("bool"), [{"x": 2}, {"x": 1}]),
    ("bool to int32", _one("bool"), _one("int32"), [{"x": True}]),
    ("sint32 widened to sint64", _one("sint32"), _one("sint64"), [{"x": -3}]),
    ("sint64 narrowed to sint32", _one("sint64"), _one("sint32"), [{"x": -(2**40)}, {"x": -4}]),
    ("fixed32 to sfixed32", _one("fixed32"), _one("sfixed32"), [{"x": 2**31}, {"x": 1}]),
    ("fixed64 to sfixed64", _one("fixed64"), _one("sfixed64"), [{"x": 2**64 - 1}, {"x": 2}]),
    ("int32 widened to int64", _one("int32"), _one("int64"), [{"x": -(2**31)}]),
    ("string to bytes", _one("string"), _one("bytes"), [{"x": "caf\u00e9"}]),
    ("bytes to string", _one("bytes"), _one("string"), [{"x": b"\xff\xfe"}, {"x": b"ok"}]),
    ("enum grown", _one("enum", enum_size=2), _one("enum", enum_size=4), [{"x": 1}, {"x": 3}]),
    ("enum to int32", _one("enum", enum_size=3), _one("int32"), [{"x": 2}]),
    ("int32 to enum", _one("int32"), _one("enum", enum_size=3), [{"x": 1}, {"x": 7}]),
    ("fixed32 to float", _one("fixed32"), _one("float"), [{"x": 1065353216}]),
    ("a field added", _one("int64"), (Field(1, "x", "int64", "implicit"), Field(2, "y", "string", "implicit")),
     [{"x": 4}]),
    ("a field renamed", (Field(1, "device", "string", "implicit"), Field(4, "temp_c", "int32", "implicit")),
     (Field(1, "device", "string", "implicit"), Field(4, "temp_dc", "int32", "implicit")),
     [{"device": "a", "temp_c": 21}, {"temp_c": -4}]),
    ("a field moved into a oneof", (Field(1, "x", "int64", "implicit"), Field(2, "y", "string", "implicit")),
     (Field(1, "x", "int64", "oneof"), Field(2, "y", "string", "oneof")), [{"x": 4, "y": "s"}, {"x": 0}]),
    ("a nested repeated int64 narrowed", _one("message", "lines", "repeated", nested=_one("int64", "cents")),
     _one("message", "lines", "repeated", nested=_one("int32", "cents")),
     [{"lines": [{"cents": 1}, {"cents": 5_000_000_000}]}, {"lines": [{"cents": 2}]}]),
    ("map values narrowed", _one("int64", "tags", "map", key="string"), _one("int32", "tags", "map", key="string"),
     [{"tags": {"a": 2**31}}, {"tags": {"b": -2}}]),
]


APICURIO_BACKWARD = {"int64 narrowed to int32": False, "int32 to uint32": False, "bytes to string": False,
                     "a field added": True, "enum grown": True}
"""What Apicurio's BACKWARD rule says of some pairs (True: accepted), as observed; the others are only recorded."""


def _message(cls: Any, fields: Fields, sets: dict[str, Any]) -> Any:
    message = cls()
    set_values(message, fields, sets)
    return message


def _register_text(registry: SchemaRegistry, client: SchemaRegistryClient, subject: str, v1: Fields, v2: Fields,
                   package: str) -> tuple[int, int, bool]:
    """Both versions as .proto text under ``subject``, v2 under BACKWARD (else, when refused, under no rule)."""
    first = client.register_schema(subject, Schema(proto_text(v1, package), "PROTOBUF"))
    registry.set_compatibility(subject, "BACKWARD")
    refused: SchemaRegistryError | None = None
    try:
        return first, client.register_schema(subject, Schema(proto_text(v2, package), "PROTOBUF")), True
    except SchemaRegistryError as exc:
        refused = exc
    assert refused is not None
    assert refused.http_status_code == 409, refused  # incompatible, not a registry that failed
    registry.set_compatibility(subject, "NONE")
    return first, client.register_schema(subject, Schema(proto_text(v2, package), "PROTOBUF")), False


def _check(name: str, v1: Fields, v2: Fields, writes: list[dict[str, Any]], records: list[bytes],
           registry: SchemaRegistry) -> None:
    rows, reasons = store_chunk(records, SchemaRegistryConfig(url=registry.url))
    assert len(rows) + len(reasons) == len(writes) + 1
    columns = by_name([v2, v1])  # each record fills the columns of its writer's field names
    for offset, sets in enumerate(writes):
        want = outcome(v1, columns, sets, named=False)
        if isinstance(want, Quarantined):
            assert offset in reasons, (name, sets, rows.get(offset))
            assert f"field '{want.path}'" in reasons[offset]
            continue
        assert offset not in reasons, reasons.get(offset)
        assert canonical({f.name: rows[offset].get(f.name) for f in columns}) == canonical(want), (name, sets)
    assert len(writes) not in reasons  # the v2 record itself


@pytest.mark.parametrize(("name", "v1", "v2", "writes"), PAIRS, ids=[p[0] for p in PAIRS])
def test_a_version_pair_stores_what_each_writer_meant_or_quarantines_it(
        schema_registry: SchemaRegistry, name: str, v1: Fields, v2: Fields, writes: list[dict[str, Any]]) -> None:
    topic = "pair-" + name.replace(" ", "-")
    package = "p" + "".join(c for c in name if c.isalnum())
    client = SchemaRegistryClient({"url": schema_registry.url})
    old, new = message_class(build(v1, package)), message_class(build(v2, package))

    first, second, accepted = _register_text(schema_registry, client, f"{topic}-text-value", v1, v2, package)
    assert APICURIO_BACKWARD.get(name, accepted) == accepted, (name, accepted)
    assert second > first  # v2 is the chunk's newest
    by_hand = [b"\x00" + sid.to_bytes(4, "big") + b"\x00" + message.SerializeToString()
               for sid, message in [*((first, _message(old, v1, sets)) for sets in writes), (second, new())]]
    _check(name, v1, v2, writes, by_hand, schema_registry)

    context = SerializationContext(topic, MessageField.VALUE)
    serialized = [ProtobufSerializer(old, client, {"use.deprecated.format": False})(_message(old, v1, sets), context)
                  for sets in writes]
    serialized.append(ProtobufSerializer(new, client, {"use.deprecated.format": False})(new(), context))
    assert all(s is not None for s in serialized)
    _check(name, v1, v2, writes, [s for s in serialized if s is not None], schema_registry)
