"""Protobuf schemas from a Schema Registry as descriptors (no generated classes), their messages as Arrow types, and
decoded messages as values of those types.

A registry answers a Protobuf schema either as ``.proto`` text (what Java producers register and what Confluent's
registry answers by default) or as a base64 ``FileDescriptorProto`` (what confluent-kafka's Python
``ProtobufSerializer`` registers, and Apicurio keeps as it was given; Apicurio ignores ``?format=serialized``).
Base64 is parsed as it is; text is compiled by ``protoc`` itself (grpcio-tools ships it as a Python module, run in a
subprocess so that its messages can be read and a crash cannot take the worker down). Imports of the well-known types
(and of ``google/type/*``) come from the protobuf packages; other imports are the schema's registry references.

The mapping (docs/DESIGN.md, "Typed tables"):

=========================================  ==========================================================
Protobuf                                   Arrow
=========================================  ==========================================================
double, float, bool, string, bytes         float64, float32, bool, string, binary
int32, sint32, sfixed32                    int32
int64, sint64, sfixed64                    int64 (exact)
uint32, fixed32 / uint64, fixed64          uint32 / uint64 (exact)
enum                                       string (the value's name; a number the enum does not name: its digits)
message                                    struct, null when the field is not set
repeated T                                 list<T> (an empty list when there are none)
map<K, V>                                  map<K, V>
oneof                                      each member is a nullable field in its place among the message's fields;
                                           the member that is set holds its value, the others are null
proto3 ``optional``, proto2 optional       nullable (null when not set); other proto3 scalars hold their default
google.protobuf.Timestamp                  timestamp(us, UTC) (nanoseconds floored to microseconds)
google.protobuf.Duration                   int64 microseconds (floored; see DESIGN for why not duration)
google.protobuf.*Value wrappers            the wrapped scalar, null when not set
google.protobuf.Struct, Value, ListValue   string: the value as JSON text (keys sorted)
a message with no fields (Empty)           bool: true when set, null when not
=========================================  ==========================================================

Recursive messages have no Arrow type: ``SchemaError``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import importlib
import importlib.resources
import json
import operator
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

import pyarrow as pa
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, FileDescriptor
from google.protobuf.message import DecodeError, Message

from shale.schemas.avro import SchemaError
from shale.schemas.registry import RegisteredSchema, RegistryClient

Converter = Callable[[Any], Any]
PROTOC_TIMEOUT_S = 60.0

_SCALARS: dict[int, pa.DataType] = {
    FieldDescriptor.TYPE_DOUBLE: pa.float64(), FieldDescriptor.TYPE_FLOAT: pa.float32(),
    FieldDescriptor.TYPE_INT32: pa.int32(), FieldDescriptor.TYPE_SINT32: pa.int32(),
    FieldDescriptor.TYPE_SFIXED32: pa.int32(), FieldDescriptor.TYPE_INT64: pa.int64(),
    FieldDescriptor.TYPE_SINT64: pa.int64(), FieldDescriptor.TYPE_SFIXED64: pa.int64(),
    FieldDescriptor.TYPE_UINT32: pa.uint32(), FieldDescriptor.TYPE_FIXED32: pa.uint32(),
    FieldDescriptor.TYPE_UINT64: pa.uint64(), FieldDescriptor.TYPE_FIXED64: pa.uint64(),
    FieldDescriptor.TYPE_BOOL: pa.bool_(), FieldDescriptor.TYPE_STRING: pa.string(),
    FieldDescriptor.TYPE_BYTES: pa.binary(),
}
WRAPPERS = {f"google.protobuf.{n}Value" for n in ("Double", "Float", "Int64", "UInt64", "Int32", "UInt32", "Bool",
                                                   "String", "Bytes")}
JSON_TYPES = {"google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue"}
_BUILTIN_MODULES = [f"google.protobuf.{m}_pb2" for m in ("any", "api", "descriptor", "duration", "empty",
                                                         "field_mask", "source_context", "struct", "timestamp",
                                                         "type", "wrappers")] + \
    [f"google.type.{m}_pb2" for m in ("calendar_period", "color", "date", "datetime", "dayofweek", "expr",
                                      "fraction", "latlng", "money", "month", "postal_address", "quaternion",
                                      "timeofday")]


_BUILTINS: list[descriptor_pb2.FileDescriptorProto] = []


def _builtin_files() -> list[descriptor_pb2.FileDescriptorProto]:
    """The well-known files (google/type/* only when googleapis-common-protos is installed), each after the files
    it imports."""
    if not _BUILTINS:
        files = []
        for name in _BUILTIN_MODULES:
            try:
                module = importlib.import_module(name)
            except ImportError:
                continue
            files.append(descriptor_pb2.FileDescriptorProto.FromString(module.DESCRIPTOR.serialized_pb))
        _BUILTINS[:] = _in_import_order(files)  # one assignment: two threads at once build the same list
    return _BUILTINS


def builtin_names() -> set[str]:
    """The files every pool has (the import paths of the well-known types)."""
    return {f.name for f in _builtin_files()}


def _in_import_order(files: list[descriptor_pb2.FileDescriptorProto]) -> list[descriptor_pb2.FileDescriptorProto]:
    ordered: list[descriptor_pb2.FileDescriptorProto] = []
    done: set[str] = set()
    waiting = list(files)
    while waiting:
        ready = [f for f in waiting if all(d in done or d not in {w.name for w in waiting} for d in f.dependency)]
        if not ready:  # a cycle: leave the rest in the order given, the pool says what is wrong
            return [*ordered, *waiting]
        for file in ready:
            ordered.append(file)
            done.add(file.name)
        waiting = [f for f in waiting if f.name not in done]
    return ordered


def _from_base64(text: str) -> descriptor_pb2.FileDescriptorProto | None:
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    try:
        proto = descriptor_pb2.FileDescriptorProto.FromString(raw)
    except DecodeError:
        return None
    return proto if proto.message_type or proto.enum_type or proto.name else None


def _safe_name(name: str) -> str:
    path = PurePosixPath(name)
    if not name or path.is_absolute() or ".." in path.parts or not name.endswith(".proto"):
        raise SchemaError(f"a Protobuf file name {name!r} is not a relative .proto path")
    return name


def compile_text(text: str, name: str, dependencies: list[descriptor_pb2.FileDescriptorProto]) \
        -> descriptor_pb2.FileDescriptorProto:
    """``.proto`` text compiled by protoc into its ``FileDescriptorProto``; ``dependencies`` are the compiled files it
    imports (other than the well-known types, which protoc knows)."""
    try:
        include = str(importlib.resources.files("grpc_tools") / "_proto")
    except ModuleNotFoundError:
        raise SchemaError("a .proto text schema needs protoc: install grpcio-tools") from None
    with tempfile.TemporaryDirectory(prefix="shale-proto-") as tmp:
        root = Path(tmp)
        source = root / "src" / _safe_name(name)
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_text(text, encoding="utf-8")
        out = root / "out.pb"
        command = [sys.executable, "-m", "grpc_tools.protoc", f"-I{root / 'src'}", f"-I{include}",
                   f"--descriptor_set_out={out}", name]
        if dependencies:
            given = root / "deps.pb"
            given.write_bytes(descriptor_pb2.FileDescriptorSet(file=dependencies).SerializeToString())
            command.insert(3, f"--descriptor_set_in={given}")
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=PROTOC_TIMEOUT_S,
                                  check=False, cwd=root)
        except subprocess.TimeoutExpired:
            raise SchemaError(f"protoc took over {PROTOC_TIMEOUT_S:.0f} s on the schema") from None
        if done.returncode != 0 or not out.exists():
            problem = " ".join(done.stderr.strip().splitlines()[-3:]) or f"exit status {done.returncode}"
            raise SchemaError(f"the .proto schema does not compile: {problem}"[:600])
        found = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
        return found[0]


def file_proto(text: str, name: str, dependencies: list[descriptor_pb2.FileDescriptorProto]) \
        -> descriptor_pb2.FileDescriptorProto:
    """The registry's schema text (base64 descriptor or .proto text) as a ``FileDescriptorProto``."""
    parsed = _from_base64(text)
    if parsed is None:
        return compile_text(text, name, dependencies)
    if not parsed.name:
        parsed.name = name
    return parsed


class ProtoFile:
    """One registered Protobuf file in its own descriptor pool, with the files it imports."""

    def __init__(self, main: descriptor_pb2.FileDescriptorProto,
                 dependencies: list[descriptor_pb2.FileDescriptorProto]) -> None:
        self.proto = main
        pool = descriptor_pool.DescriptorPool()
        added: set[str] = set()
        try:
            for file in _builtin_files():
                pool.Add(file)
                added.add(file.name)
            for dependency in [*_in_import_order(dependencies), main]:
                if dependency.name not in added:
                    pool.Add(dependency)
                    added.add(dependency.name)
            self.file: FileDescriptor = pool.FindFileByName(main.name)
        except (TypeError, KeyError, ValueError) as exc:
            raise SchemaError(f"the Protobuf schema cannot be loaded: {exc}"[:600]) from None
        self.pool = pool

    def message(self, indexes: list[int]) -> Descriptor:
        """The message type a record's message-index array names."""
        found: Any = self.file.message_types_by_name.values()
        descriptor: Descriptor | None = None
        for index in indexes:
            types = list(found)
            if index >= len(types):
                raise SchemaError(f"the message-index array {indexes} names no message of the schema")
            descriptor = types[index]
            found = descriptor.nested_types
        assert descriptor is not None  # indexes is never empty
        return descriptor

    def declared(self, full_name: str) -> Descriptor | None:
        """The message of that full name this file declares (nested ones too; not those it imports), or None."""
        try:
            found: Descriptor = self.pool.FindMessageTypeByName(full_name)
        except KeyError:
            return None
        return found if found.file.name == self.file.name else None

    def fingerprint(self, message: Descriptor) -> str:
        """SHA-256 of the file's deterministic serialization and the message's full name, 16 hex digits."""
        digest = hashlib.sha256(self.proto.SerializeToString(deterministic=True))
        digest.update(message.full_name.encode())
        return digest.hexdigest()[:16]


def enum_names(field: FieldDescriptor) -> Converter:
    """An enum field's number as the column holds it: the value's name, or its digits when the enum names none."""
    names = {v.number: v.name for v in field.enum_type.values}
    return lambda n: names.get(n) or str(n)


def _json_text(message: Message) -> str:
    return json.dumps(json_format.MessageToDict(message), separators=(",", ":"), sort_keys=True)


def _micros(value: Any) -> int:
    return (int(value.seconds) * 1_000_000_000 + int(value.nanos)) // 1000


class _Compiler:
    def __init__(self) -> None:
        self.open: set[str] = set()

    def value(self, field: FieldDescriptor) -> tuple[pa.DataType, Converter | None]:
        """The Arrow type of one (not repeated) value of ``field``, and its converter (None: as it is)."""
        if field.type == FieldDescriptor.TYPE_ENUM:
            return pa.string(), enum_names(field)
        if field.type in (FieldDescriptor.TYPE_MESSAGE, FieldDescriptor.TYPE_GROUP):
            return self.message(field.message_type)
        return _SCALARS[field.type], None

    def message(self, descriptor: Descriptor) -> tuple[pa.DataType, Converter]:
        name = descriptor.full_name
        if name == "google.protobuf.Timestamp":
            return pa.timestamp("us", tz="UTC"), _micros
        if name == "google.protobuf.Duration":
            return pa.int64(), _micros
        if name in WRAPPERS:
            inner, unwrap = self.value(descriptor.fields_by_name["value"])
            return inner, (lambda m: m.value) if unwrap is None else (lambda m: unwrap(m.value))
        if name in JSON_TYPES:
            return pa.string(), _json_text
        if not descriptor.fields:
            return pa.bool_(), lambda m: True
        if name in self.open:
            raise SchemaError(f"message {name!r} is recursive: a recursive message has no Arrow type")
        self.open.add(name)
        fields, getters = [], []
        for field in descriptor.fields:
            arrow, getter = self.field(field)
            fields.append(pa.field(field.name, arrow))
            getters.append((field.name, getter))
        self.open.discard(name)

        def convert(message: Message) -> dict[str, Any]:
            return {name: get(message) for name, get in getters}
        return pa.struct(fields), convert

    def field(self, field: FieldDescriptor) -> tuple[pa.DataType, Converter]:
        """The Arrow type of ``field`` in its message and the getter of its value from a message."""
        name = field.name
        entry = field.message_type if field.type == FieldDescriptor.TYPE_MESSAGE else None
        if field.is_repeated and entry is not None and entry.GetOptions().map_entry:
            key_type, key = self.value(entry.fields_by_name["key"])
            value_type, value = self.value(entry.fields_by_name["value"])
            keys, values = key or (lambda k: k), value or (lambda v: v)
            return pa.map_(key_type, value_type), \
                lambda m: [(keys(k), values(v)) for k, v in getattr(m, name).items()]
        arrow, convert = self.value(field)
        if field.is_repeated:
            if convert is None:
                return pa.list_(arrow), lambda m: list(getattr(m, name))
            each = convert
            return pa.list_(arrow), lambda m: [each(v) for v in getattr(m, name)]
        if field.has_presence:
            if convert is None:
                return arrow, lambda m: getattr(m, name) if m.HasField(name) else None
            one = convert
            return arrow, lambda m: one(getattr(m, name)) if m.HasField(name) else None
        if convert is None:
            return arrow, operator.attrgetter(name)  # native: the most common field, read per record
        plain = convert
        return arrow, lambda m: plain(getattr(m, name))


class Decoder:
    """Decodes one message type's wire bytes into a dict of its fields as values of ``arrow`` (a struct)."""

    def __init__(self, message: Descriptor) -> None:
        self.descriptor = message
        arrow, convert = _Compiler().message(message)
        if not pa.types.is_struct(arrow):
            raise SchemaError(f"message {message.full_name} is not a message with fields")
        self.arrow: pa.StructType = arrow
        self._convert = convert
        self._class = message_factory.GetMessageClass(message)

    def message(self, body: bytes | memoryview) -> Message:
        """The parsed message; ``DecodeError`` on bytes that are not one."""
        return self._class.FromString(bytes(body))

    @staticmethod
    def value_converter(message: Descriptor) -> Converter:
        """The converter of a set ``message`` to its value in the column (a dict for a struct)."""
        return _Compiler().message(message)[1]

    def values(self, message: Message) -> dict[str, Any]:
        """The message's fields as values of ``arrow`` (a new dict)."""
        return self._convert(message)  # type: ignore[no-any-return]

    def decode(self, body: bytes | memoryview) -> dict[str, Any]:
        return self.values(self.message(body))


def arrow_type(message: Descriptor) -> pa.DataType:
    return _Compiler().message(message)[0]


def load(registry: RegistryClient, registered: RegisteredSchema,
         seen: frozenset[str] = frozenset()) -> ProtoFile:
    """The registered schema and the files it imports (its references, read recursively) in one descriptor pool."""
    dependencies = _dependencies(registry, registered, seen)
    main = file_proto(registered.text, f"registry-schema-{registered.id}.proto", dependencies)
    return ProtoFile(main, dependencies)


def _dependencies(registry: RegistryClient, registered: RegisteredSchema, seen: frozenset[str]) -> list[Any]:
    found: dict[str, Any] = {}
    for reference in registered.references:
        if reference.name in seen or reference.name in found or reference.name in builtin_names():
            continue
        imported = registry.referenced(reference)  # UnknownSchemaError: quarantined; unavailable: retried
        inner = _dependencies(registry, imported, seen | {reference.name})
        for dependency in inner:
            found.setdefault(dependency.name, dependency)
        compiled = file_proto(imported.text, reference.name, inner)
        compiled.name = reference.name  # the path the importing file names it by
        found[reference.name] = compiled
    return list(found.values())
