"""Protobuf message schemas, their evolutions and values as data, for the differential properties of schema versions
(unit: tests/unit/schemas/test_protobuf_versions.py; the real registry:
tests/integration/test_protobuf_versions.py).

A ``Field`` describes one field of a message; ``build`` turns a list of them into a ``FileDescriptorProto`` (what
confluent-kafka's ``ProtobufSerializer`` registers); ``evolutions`` draws another version of it; ``values`` draws what
a writer sets; ``expected`` is the model: what the writer meant, converted into the reader's column only where the
column's type holds it exactly, or ``Quarantined`` with the paths of the fields that cannot be."""

from __future__ import annotations

import datetime as dt
import math
import struct
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
from google.protobuf import descriptor_pb2, descriptor_pool, duration_pb2, message_factory, timestamp_pb2, wrappers_pb2
from hypothesis import strategies as st

from shale.block import read_dataset
from shale.config import BucketConfig, IngestConfig, ParserRule, SchemaRegistryConfig
from shale.encoder.chunks import Chunk, GroupSpec, write_chunk
from shale.objstore import open_bucket
from tests.factories import BASE_MS, backup_table

FDP = descriptor_pb2.FieldDescriptorProto

INT_RANGES = {
    "int32": (-(2**31), 2**31 - 1), "sint32": (-(2**31), 2**31 - 1), "sfixed32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1), "sint64": (-(2**63), 2**63 - 1), "sfixed64": (-(2**63), 2**63 - 1),
    "uint32": (0, 2**32 - 1), "fixed32": (0, 2**32 - 1), "uint64": (0, 2**64 - 1), "fixed64": (0, 2**64 - 1),
}
SCALAR_TYPES = {**{k: getattr(FDP, f"TYPE_{k.upper()}") for k in INT_RANGES},
                "double": FDP.TYPE_DOUBLE, "float": FDP.TYPE_FLOAT, "bool": FDP.TYPE_BOOL,
                "string": FDP.TYPE_STRING, "bytes": FDP.TYPE_BYTES}
WIRE_GROUPS = [["int32", "int64", "uint32", "uint64", "bool", "enum"], ["sint32", "sint64"],
               ["fixed32", "sfixed32", "float"], ["fixed64", "sfixed64", "double"], ["string", "bytes"]]
"""Types that share a wire encoding: what a registry may accept as a type change (and what changes meaning)."""
WRAPPERS = {".google.protobuf.Int64Value": "int64", ".google.protobuf.Int32Value": "int32",
            ".google.protobuf.UInt64Value": "uint64", ".google.protobuf.StringValue": "string",
            ".google.protobuf.BytesValue": "bytes", ".google.protobuf.FloatValue": "float"}
WELL_KNOWN = [".google.protobuf.Timestamp", ".google.protobuf.Duration", *WRAPPERS]
MAP_KEYS = ["string", "int32", "int64", "uint32", "sint64", "fixed32", "bool"]
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
READ_MS = BASE_MS + 7 * 86_400_000


@dataclass(frozen=True)
class Field:
    """One field. ``type``: a scalar name, ``enum``, ``message`` or a well-known type's full name; ``label``:
    implicit, optional, repeated, map (``type`` is the value's, ``key`` the key's) or oneof (one oneof per message)."""

    number: int
    name: str
    type: str
    label: str
    enum_size: int = 0
    key: str = ""
    nested: tuple[Field, ...] = field(default=())

    @property
    def presence(self) -> bool:
        return self.label in ("optional", "oneof") or (self.label == "implicit" and not self.scalar)

    @property
    def scalar(self) -> bool:
        return self.type in SCALAR_TYPES or self.type == "enum"


# --- descriptors -------------------------------------------------------------------------------------------------

def build(fields: tuple[Field, ...], package: str = "gen") -> descriptor_pb2.FileDescriptorProto:
    """The file declaring ``message Root`` with ``fields`` (proto3), importing the well-known types it uses."""
    file = descriptor_pb2.FileDescriptorProto(name=f"{package}.proto", package=package, syntax="proto3")
    files = {".google.protobuf.Timestamp": "timestamp", ".google.protobuf.Duration": "duration",
             **dict.fromkeys(WRAPPERS, "wrappers")}
    file.dependency.extend(f"google/protobuf/{name}.proto" for name in sorted({files[u] for u in
                                                                               _well_known_used(fields)}))
    _fill(file.message_type.add(name="Root"), fields, f".{package}.Root")
    return file


def _well_known_used(fields: tuple[Field, ...]) -> set[str]:
    found = {f.type for f in fields if f.type.startswith(".google")}
    for f in fields:
        found |= _well_known_used(f.nested)
    return found


def _fill(message: descriptor_pb2.DescriptorProto, fields: tuple[Field, ...], full: str) -> None:
    if any(f.label == "oneof" for f in fields):
        message.oneof_decl.add(name="choice")
    optional = []
    for f in fields:
        kind, type_name = _type_of(message, f, full)
        if f.label == "map":
            entry = message.nested_type.add(name=f"F{f.number}Entry")
            entry.options.map_entry = True
            entry.field.add(name="key", number=1, type=SCALAR_TYPES[f.key], label=FDP.LABEL_OPTIONAL)
            entry.field.add(name="value", number=2, type=kind, label=FDP.LABEL_OPTIONAL, **type_name)
            message.field.add(name=f.name, number=f.number, type=FDP.TYPE_MESSAGE,
                              type_name=f"{full}.F{f.number}Entry", label=FDP.LABEL_REPEATED)
            continue
        added = message.field.add(name=f.name, number=f.number, type=kind, **type_name,
                                  label=FDP.LABEL_REPEATED if f.label == "repeated" else FDP.LABEL_OPTIONAL)
        if f.label == "oneof":
            added.oneof_index = 0
        elif f.label == "optional":
            optional.append(added)
    for added in optional:  # proto3 optional's synthetic oneofs come after the real one, as protoc orders them
        added.proto3_optional = True
        added.oneof_index = len(message.oneof_decl)
        message.oneof_decl.add(name=f"_{added.name}")


def _type_of(message: descriptor_pb2.DescriptorProto, f: Field, full: str) -> tuple[int, dict[str, str]]:
    """The field's type, and its ``type_name`` as keyword arguments (none for a scalar)."""
    if f.type in SCALAR_TYPES:
        return SCALAR_TYPES[f.type], {}
    if f.type == "enum":
        enum = message.enum_type.add(name=f"E{f.number}")
        for v in range(f.enum_size):
            enum.value.add(name=f"E{f.number}_V{v}", number=v)
        return FDP.TYPE_ENUM, {"type_name": f"{full}.E{f.number}"}
    if f.type == "message":
        _fill(message.nested_type.add(name=f"M{f.number}"), f.nested, f"{full}.M{f.number}")
        return FDP.TYPE_MESSAGE, {"type_name": f"{full}.M{f.number}"}
    return FDP.TYPE_MESSAGE, {"type_name": f.type}


def proto_text(fields: tuple[Field, ...], package: str = "gen") -> str:
    """``build``'s file as ``.proto`` text (what Java producers register, and what a registry's compatibility checker
    reads)."""
    files = {".google.protobuf.Timestamp": "timestamp", ".google.protobuf.Duration": "duration",
             **dict.fromkeys(WRAPPERS, "wrappers")}
    imports = "".join(f'import "google/protobuf/{name}.proto";\n'
                      for name in sorted({files[u] for u in _well_known_used(fields)}))
    return f'syntax = "proto3";\npackage {package};\n{imports}message Root {{\n{_text(fields, "  ")}}}\n'


def _text(fields: tuple[Field, ...], indent: str) -> str:
    lines, choice = [], []
    for f in fields:
        if f.type == "enum":
            values = " ".join(f"E{f.number}_V{v} = {v};" for v in range(f.enum_size))
            lines.append(f"{indent}enum E{f.number} {{ {values} }}\n")
        elif f.type == "message":
            lines.append(f"{indent}message M{f.number} {{\n{_text(f.nested, indent + '  ')}{indent}}}\n")
        type_ = {"enum": f"E{f.number}", "message": f"M{f.number}"}.get(f.type, f.type.lstrip("."))
        if f.label == "map":
            type_ = f"map<{f.key}, {type_}>"
        prefix = {"optional": "optional ", "repeated": "repeated "}.get(f.label, "")
        (choice if f.label == "oneof" else lines).append(f"{prefix}{type_} {f.name} = {f.number};")
        if f.label != "oneof":
            lines[-1] = f"{indent}{lines[-1]}\n"
    if choice:
        lines.append(f"{indent}oneof choice {{ {' '.join(choice)} }}\n")
    return "".join(lines)


def message_class(file: descriptor_pb2.FileDescriptorProto) -> Any:
    pool = descriptor_pool.DescriptorPool()
    for module in (timestamp_pb2, duration_pb2, wrappers_pb2):
        pool.AddSerializedFile(module.DESCRIPTOR.serialized_pb)
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{file.package}.Root"))


# --- schemas and evolutions --------------------------------------------------------------------------------------

def _labels(type_: str) -> list[str]:
    if type_ in SCALAR_TYPES or type_ == "enum":
        return ["implicit", "optional", "repeated", "map", "oneof"]
    return ["implicit", "repeated", "oneof", "map"] if type_ == "message" else ["implicit", "repeated", "oneof"]


@st.composite
def fields_of(draw: st.DrawFn, depth: int = 0, numbers: tuple[int, ...] = ()) -> Field:
    """One new field of any kind (numbers are chosen by the caller)."""
    types = [*SCALAR_TYPES, "enum", *WELL_KNOWN] + (["message"] if depth < 2 else [])
    type_ = draw(st.sampled_from(types))
    label = draw(st.sampled_from(_labels(type_)))
    number = numbers[0] if numbers else 1
    nested = draw(messages(depth + 1)) if type_ == "message" else ()
    return Field(number, f"f{number}", type_, label, draw(st.integers(1, 4)) if type_ == "enum" else 0,
                 draw(st.sampled_from(MAP_KEYS)) if label == "map" else "", nested)


@st.composite
def messages(draw: st.DrawFn, depth: int = 0) -> tuple[Field, ...]:
    count = draw(st.integers(1, 5 if depth == 0 else 3))
    return tuple(draw(fields_of(depth, (n,))) for n in range(1, count + 1))


def _retyped(draw: st.DrawFn, f: Field) -> Field:
    """``f`` with another type: mostly one of the same wire encoding (what a registry accepts), sometimes any."""
    if f.type in WRAPPERS:
        return replace(f, type=draw(st.sampled_from(sorted(WRAPPERS))))
    group = next((g for g in WIRE_GROUPS if f.type in g), None)
    choices = [*SCALAR_TYPES, "enum", *WELL_KNOWN]
    if group is not None and draw(st.integers(0, 3)) > 0:
        choices = group
    type_ = draw(st.sampled_from(choices))
    if f.label == "map" and type_ not in SCALAR_TYPES and type_ != "enum":
        type_ = "string"
    label = f.label if f.label in _labels(type_) else "implicit"
    return replace(f, type=type_, label=label, enum_size=draw(st.integers(1, 4)) if type_ == "enum" else 0,
                   nested=())


@st.composite
def evolutions(draw: st.DrawFn, fields: tuple[Field, ...], depth: int = 0) -> tuple[Field, ...]:
    """Another version of ``fields``: each kept, removed, renamed, retyped, relabelled (into or out of the oneof,
    optional, repeated), an enum grown or shrunk, a nested message evolved; and new fields added."""
    out = []
    for given in fields:
        f = given
        change = draw(st.sampled_from(["keep", "remove", "rename", "type", "label", "grow"]))
        if change == "remove":
            continue
        if change == "rename":
            f = replace(f, name=f"g{f.number}" if f.name.startswith("f") else f"f{f.number}")
        elif change == "type":
            f = _retyped(draw, f)
        elif change == "label":
            labels = [x for x in _labels(f.type) if x != f.label]
            if f.label != "map" and labels:
                label = draw(st.sampled_from(labels))
                f = replace(f, label=label, key=draw(st.sampled_from(MAP_KEYS)) if label == "map" else "")
            elif f.label == "map":
                f = replace(f, key=draw(st.sampled_from(MAP_KEYS)))
        elif change == "grow" and f.type == "enum":
            f = replace(f, enum_size=draw(st.integers(1, 6)))
        if f.type == "message":
            f = replace(f, nested=draw(evolutions(f.nested, depth + 1)) if depth < 2 else f.nested)
        out.append(f)
    top = max((f.number for f in fields), default=0)
    for n in range(top + 1, top + 1 + draw(st.integers(0 if out else 1, 2))):
        out.append(draw(fields_of(depth, (n,))))
    return tuple(out)


# --- values ------------------------------------------------------------------------------------------------------

def _f32(x: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


def scalar_values(type_: str, enum_size: int = 0) -> st.SearchStrategy[Any]:
    if type_ in INT_RANGES:
        low, high = INT_RANGES[type_]
        edges = [v for v in (0, 1, -1, 2, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 5_000_000_000, -(2**31), 2**63 - 1)
                 if low <= v <= high]
        return st.sampled_from(edges) | st.integers(low, high)
    if type_ == "enum":
        return st.integers(0, enum_size + 1)  # an open enum holds numbers it does not name too
    return {"double": st.floats(allow_nan=False), "float": st.floats(width=32, allow_nan=False),
            "bool": st.booleans(), "string": st.text(max_size=6),
            "bytes": st.binary(max_size=6) | st.text(max_size=4).map(str.encode)}[type_]


def _well_known_values(type_: str) -> st.SearchStrategy[Any]:
    if type_ == ".google.protobuf.Timestamp":
        return st.tuples(st.integers(-62_135_596_800, 253_402_300_799), st.integers(0, 999_999_999))
    if type_ == ".google.protobuf.Duration":
        return st.integers(-10**11, 10**11).flatmap(lambda s: st.tuples(st.just(s), st.integers(
            0 if s > 0 else -999_999_999, 0 if s < 0 else 999_999_999)))
    return scalar_values(WRAPPERS[type_])


def _one(f: Field) -> st.SearchStrategy[Any]:
    if f.type == "message":
        return values(f.nested)
    if f.type in WELL_KNOWN:
        return _well_known_values(f.type)
    return scalar_values(f.type, f.enum_size)


@st.composite
def values(draw: st.DrawFn, fields: tuple[Field, ...]) -> dict[str, Any]:
    """What a writer sets: field name -> value (absent: not set). At most one member of the oneof."""
    out: dict[str, Any] = {}
    members = [f for f in fields if f.label == "oneof"]
    chosen = draw(st.sampled_from([None, *members])) if members else None
    for f in fields:
        if f.label == "oneof" and f is not chosen:
            continue
        if f.label == "repeated":
            out[f.name] = draw(st.lists(_one(f), max_size=3))
        elif f.label == "map":
            out[f.name] = draw(st.dictionaries(scalar_values(f.key), _one(f), max_size=3))
        elif f.presence and f.label != "oneof" and not draw(st.booleans()):
            continue
        else:
            out[f.name] = draw(_one(f))
    return out


def set_values(message: Any, fields: tuple[Field, ...], sets: dict[str, Any]) -> None:
    """Set ``sets`` on a message of ``fields`` (the writer's class)."""
    for f in fields:
        if f.name not in sets:
            continue
        value = sets[f.name]
        if f.label == "map" and f.type == "message":
            for key, item in value.items():
                _set_message(getattr(message, f.name)[key], f, item)
        elif f.label == "map":
            getattr(message, f.name).update(value)
        elif f.label == "repeated" and f.type in ("message", *WELL_KNOWN):
            for item in value:
                _set_message(getattr(message, f.name).add(), f, item)
        elif f.label == "repeated":
            getattr(message, f.name).extend(value)
        elif f.type in ("message", *WELL_KNOWN):
            target = getattr(message, f.name)
            target.SetInParent()
            _set_message(target, f, value)
        else:
            setattr(message, f.name, value)


def _set_message(target: Any, f: Field, value: Any) -> None:
    if f.type == "message":
        set_values(target, f.nested, value)
    elif f.type in WRAPPERS:
        target.value = value
    else:
        target.seconds, target.nanos = value


# --- storing and comparing ---------------------------------------------------------------------------------------

def store_chunk(values_: list[bytes], registry: SchemaRegistryConfig, keys: list[bytes] | None = None,
                parser: str = "protobuf", **options: Any) -> tuple[dict[int, dict[str, Any]], dict[int, str]]:
    """Framed records (and keys, when given) through the ``protobuf`` parser (or another registry ``parser``) into
    an in-memory bucket, as ingest writes a chunk: the rows stored and the reasons quarantined, by the record's
    offset."""
    table = backup_table("app", 0, 0, len(values_))
    table = table.set_column(table.schema.get_field_index("value"), "value", pa.array(values_, pa.binary()))
    if keys is not None:
        table = table.set_column(table.schema.get_field_index("key"), "key", pa.array(keys, pa.binary()))
    spec = GroupSpec("partition", 1, BucketConfig(url=f"memory://protobuf-{uuid.uuid4().hex}"),
                     IngestConfig(parsers=[ParserRule(parser=parser, options=options)], schema_registry=registry))
    bucket = open_bucket(spec.bucket)
    written = write_chunk(spec, bucket, table, Chunk("app", 0, "", 0, len(values_), READ_MS))
    rows: dict[int, dict[str, Any]] = {}
    reasons: dict[int, str] = {}
    for meta in written.blocks:
        for dataset in meta.datasets:
            found = read_dataset(bucket, meta, dataset).to_pylist()
            if dataset.kind == "quarantine":
                reasons.update({r["offset"]: r["reason"] for r in found})
            elif dataset.kind == "records":
                rows.update({r["offset"]: r for r in found})
    assert len(rows) + len(reasons) == len(values_)  # nothing lost
    return rows, reasons


def canonical(value: Any) -> Any:
    """A value where True is not 1, -0.0 is not 0.0, and a map's entries have no order."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, float):
        return ("float", struct.pack("<d", value))
    if isinstance(value, dict):
        return {k: canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [canonical(v) for v in value]
        if isinstance(value, tuple):
            return tuple(items)
        return sorted(items, key=repr) if items and all(isinstance(v, tuple) for v in value) else items
    return (type(value).__name__, value)


# --- the model ---------------------------------------------------------------------------------------------------

class Quarantined(Exception):  # noqa: N818 (an outcome of the model, not an error)
    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


def outcome(writer: tuple[Field, ...], reader: tuple[Field, ...], sets: dict[str, Any], named: bool = True) \
        -> dict[str, Any] | Quarantined:
    """``expected`` (a named reader schema), or ``expected_by_name`` when not ``named`` (``reader`` then holds the
    chunk's columns), with a quarantine as its value."""
    try:
        return expected(writer, reader, sets) if named else expected_by_name(writer, reader, sets)
    except Quarantined as exc:
        return exc


def _written(f: Field, value: Any) -> bool:
    """Whether the writer's value is on the wire (proto3 leaves out a scalar at its default; -0.0 is not)."""
    if f.label in ("repeated", "map"):
        return bool(value)
    if f.presence:
        return True
    if isinstance(value, float):
        return value != 0 or math.copysign(1.0, value) < 0
    return bool(value)


def _unset(f: Field) -> Any:
    if f.label in ("repeated", "map"):
        return []
    if f.presence:
        return None
    if f.type == "enum":
        return f"E{f.number}_V0"
    return {"double": 0.0, "float": 0.0, "bool": False, "string": "", "bytes": b""}.get(f.type, 0)


def expected(writer: tuple[Field, ...], reader: tuple[Field, ...], sets: dict[str, Any], path: str = "") \
        -> dict[str, Any]:
    """The reader's columns of a record the writer set ``sets`` in; ``Quarantined`` names a field that cannot be."""
    by_number = {f.number: f for f in writer}
    return {f.name: _column(by_number.get(f.number), f, sets, path) for f in reader}


def by_name(versions: list[tuple[Field, ...]]) -> tuple[Field, ...]:
    """The columns of a chunk of ``versions`` (newest first) read without a named reader schema: each field name of
    any version, typed by the newest version that declares it; the newest's fields first."""
    columns: dict[str, Field] = {}
    for fields in versions:
        for f in fields:
            columns.setdefault(f.name, f)
    return tuple(columns.values())


def expected_by_name(writer: tuple[Field, ...], columns: tuple[Field, ...], sets: dict[str, Any]) -> dict[str, Any]:
    """The ``columns`` (``by_name``) of a record the writer set ``sets`` in: each column takes the writer's field of
    its name (nested fields by number, as ``expected``), a column whose name the writer does not declare is null."""
    named = {f.name: f for f in writer}
    return {f.name: _own_column(named[f.name], f, sets) if f.name in named else None for f in columns}


def _own_column(w: Field, f: Field, sets: dict[str, Any]) -> Any:
    """``_column`` by name: a singular field the writer left unset is the writer's unset value (null with presence,
    else its default as the column holds it; quarantined when it cannot, as a set value: null is not the writer's
    meaning)."""
    if (w.name in sets and _written(w, sets[w.name])) or "repeated" in (w.label, f.label) or "map" in (w.label,
                                                                                                       f.label):
        return _column(w, f, sets, "")
    if w.presence:
        return None
    return _convert(w, f, 0 if w.type == "enum" else _unset(w), f.name)


def _column(w: Field | None, f: Field, sets: dict[str, Any], path: str) -> Any:
    """Column ``f``'s value of a record whose writer's field ``w`` (None: not declared) was set as ``sets`` says."""
    if w is None or w.name not in sets or not _written(w, sets[w.name]):
        return _unset(f)
    where, value = path + f.name, sets[w.name]
    if (w.label in ("repeated", "map") or f.label in ("repeated", "map")) and w.label != f.label:
        raise Quarantined(where)
    if f.label == "map":
        return [(_convert(replace(w, type=w.key), replace(f, type=f.key), k, where), _convert(w, f, v, where))
                for k, v in value.items()]
    if f.label == "repeated":
        return [_convert(w, f, v, where) for v in value]
    return _convert(w, f, value, where)


def _number(w: Field, value: Any) -> int | None:
    if w.type in INT_RANGES or w.type in ("enum", "bool"):
        return int(value)
    return None


def _convert(w: Field, f: Field, value: Any, where: str) -> Any:
    number = _number(w, value)
    if f.type in INT_RANGES and number is not None:
        low, high = INT_RANGES[f.type]
        if low <= number <= high:
            return number
        raise Quarantined(where)
    if f.type == "bool" and number is not None:
        if number in (0, 1):
            return bool(number)
        raise Quarantined(where)
    if f.type == "enum" and number is not None:
        if -(2**31) <= number < 2**31:
            return f"E{f.number}_V{number}" if 0 <= number < f.enum_size else str(number)
        raise Quarantined(where)
    if f.type in ("double", "float") and w.type in ("double", "float"):
        if f.type == "float" and _f32(value) != value:
            raise Quarantined(where)
        return value
    if (w.type, f.type) in (("string", "string"), ("bytes", "bytes")):
        return value
    if (w.type, f.type) == ("string", "bytes"):
        return value.encode()
    if (w.type, f.type) == ("bytes", "string"):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise Quarantined(where) from None
    if w.type == f.type == "message":
        return expected(w.nested, f.nested, value, f"{where}.") if f.nested else True
    if w.type == f.type == ".google.protobuf.Timestamp":
        return EPOCH + dt.timedelta(microseconds=(value[0] * 10**9 + value[1]) // 1000)
    if w.type == f.type == ".google.protobuf.Duration":
        return (value[0] * 10**9 + value[1]) // 1000
    if w.type in WRAPPERS and f.type in WRAPPERS:
        return _convert(Field(0, "", WRAPPERS[w.type], "implicit"), Field(0, "", WRAPPERS[f.type], "implicit"),
                        value, where)
    raise Quarantined(where)
