"""A Protobuf record of one schema version read into the columns of another (the chunk's newest, or a named reader
schema): the record is parsed with ITS WRITER's descriptor, so every value is what the writer meant, and each field
of the reader's message then takes the writer's field of the same number, converted only where the reader's type
holds the writer's value exactly.

Protobuf's own resolution (parsing old bytes with the new descriptor) is not used for this: a wire-compatible change
can change what the bytes mean. An ``int64`` read as ``int32`` is truncated (5,000,000,000 becomes 705,032,704),
``int32`` -1 read as ``uint32`` becomes 4,294,967,295, a ``sint32`` read as ``int32`` loses its zigzag coding, a
``fixed32`` read as ``float`` reinterprets its bits, and a value of another wire type is silently kept as an unknown
field while the reader sees the default.

The conversions (anything else is refused when the writer's field holds a value, see ``present``):

==========================================  =====================================================================
writer's value                              reader's column
==========================================  =====================================================================
any integer, enum number, bool (0/1)        an integer type whose range holds the number
an integer or enum number 0 or 1, a bool    bool
an integer, enum number or bool in int32    enum: the reader's name of the number (its digits when unnamed)
float / double                              double; float only when the double is exactly a float
string                                      string; bytes (its UTF-8)
bytes                                       bytes; string only when the bytes are UTF-8
a message                                   a message of the reader's by field number, recursively; a well-known
                                            type only as the same type (wrappers: as another wrapper, by value)
==========================================  =====================================================================

A field the writer's schema does not declare, or declares but did not set (nothing on the wire), takes the reader's
unset value: null for a field with presence, an empty list for repeated and map fields, the default otherwise; but
a field on the wire that the writer's schema does not declare and the reader's does (a producer that framed its
record with another schema's id) is refused rather than guessed.
A repeated field is read only as a repeated field, a map only as a map.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from typing import Any

from google.protobuf import descriptor_pb2, message_factory, unknown_fields
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from shale.schemas.protobuf import JSON_TYPES, WRAPPERS, Decoder, enum_names

Converter = Callable[[Any], Any]
FD = FieldDescriptor

INTEGER_RANGES: dict[int, tuple[int, int]] = {
    FD.TYPE_INT32: (-(2**31), 2**31 - 1), FD.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FD.TYPE_SFIXED32: (-(2**31), 2**31 - 1), FD.TYPE_INT64: (-(2**63), 2**63 - 1),
    FD.TYPE_SINT64: (-(2**63), 2**63 - 1), FD.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FD.TYPE_UINT32: (0, 2**32 - 1), FD.TYPE_FIXED32: (0, 2**32 - 1),
    FD.TYPE_UINT64: (0, 2**64 - 1), FD.TYPE_FIXED64: (0, 2**64 - 1),
}
"""The numbers each integer type holds; an enum's are int32's."""
_NUMBERS = {*INTEGER_RANGES, FD.TYPE_ENUM, FD.TYPE_BOOL}
_SPECIAL = {"google.protobuf.Timestamp", "google.protobuf.Duration", *WRAPPERS, *JSON_TYPES}
_INT32 = INTEGER_RANGES[FD.TYPE_INT32]


class ValueMismatchError(ValueError):
    """The writer's value of a field cannot be stored in the reader's column without changing it."""

    def __init__(self, path: str, number: int, detail: str) -> None:
        super().__init__(f"field {path!r} (number {number}) {detail}")


def type_name(field: FieldDescriptor) -> str:
    """How reasons name a field's declared type (``int64``, ``enum shop.Status``, ``message shop.Item``)."""
    if field.type == FD.TYPE_ENUM:
        return f"enum {field.enum_type.full_name}"
    if field.type in (FD.TYPE_MESSAGE, FD.TYPE_GROUP):
        return f"message {field.message_type.full_name}"
    return str(descriptor_pb2.FieldDescriptorProto.Type.Name(field.type)).removeprefix("TYPE_").lower()


class Resolver:
    """Decodes the bytes of ``writer`` messages into the columns of ``reader`` (``Decoder.arrow`` of the reader), its
    top-level fields matched by number; or, when ``columns`` is given, into those columns matched by NAME (see
    ``by_name``). ``decode`` raises ``DecodeError`` on bytes that are not a writer message and ``ValueMismatchError``
    on a value the reader's type cannot hold. Not thread-safe (nor needs to be: one per parser)."""

    def __init__(self, writer: Descriptor, reader: Decoder, columns: list[FieldDescriptor] | None = None) -> None:
        self.writer = writer
        self.reader = reader
        self._class = message_factory.GetMessageClass(writer)
        self._convert = _struct(writer, reader.descriptor, "") if columns is None else by_name(writer, columns)

    def decode(self, body: bytes | memoryview) -> dict[str, Any]:
        return dict(self._convert(self._class.FromString(bytes(body))))


def _struct(writer: Descriptor, reader: Descriptor, path: str) -> Converter:
    parts: list[tuple[str, Converter]] = []
    for field in reader.fields:
        written = writer.fields_by_number.get(field.number)
        where = path + field.name
        parts.append((field.name, _unset(field) if written is None else _field(written, field, where)))
    only_read = {f.number: path + f.name for f in reader.fields if f.number not in writer.fields_by_number}

    def convert(message: Message) -> dict[str, Any]:
        if only_read:
            _undeclared(message, only_read, writer)
        return {name: part(message) for name, part in parts}
    return convert


def by_name(writer: Descriptor, columns: list[FieldDescriptor]) -> Converter:
    """The converter of a ``writer`` message into ``columns`` (top-level fields of one or more versions, unique by
    name) matched by name: a column takes the writer's field of its name, converted by the same rule as by number
    (unset, the writer's unset value: see ``_field``); a column whose name the writer's schema does not declare is
    left out (null), so a renamed field's values stay in the column of their writer's name whatever else a chunk
    holds. A field on the wire whose number the writer's
    schema does not declare but a column's does is refused, as by number."""
    parts = [(f.name, _field(writer.fields_by_name[f.name], f, f.name, writers_unset=True)) for f in columns
             if f.name in writer.fields_by_name]
    only_read = {f.number: f.name for f in reversed(columns) if f.number not in writer.fields_by_number}

    def convert(message: Message) -> dict[str, Any]:
        if only_read:
            _undeclared(message, only_read, writer)
        return {name: part(message) for name, part in parts}
    return convert


def _undeclared(message: Message, only_read: dict[int, str], writer: Descriptor) -> None:
    """A field on the wire that the writer's schema does not declare (its producer wrote with another schema than
    it named) but the reader's does: its meaning is unknown, so the reader's unset value would be a guess."""
    for field in unknown_fields.UnknownFieldSet(message):
        if field.field_number in only_read:
            raise ValueMismatchError(only_read[field.field_number], field.field_number,
                                     f"is on the wire, but the writer's schema does not declare it in "
                                     f"{writer.full_name} (the producer wrote with another schema than the id it "
                                     "framed the record with)")


def _unset(field: FieldDescriptor) -> Converter:
    """The reader's value of a field the writer did not set."""
    if field.is_repeated:
        return lambda _: []
    if field.has_presence:
        return lambda _: None
    if field.type == FD.TYPE_ENUM:
        name = enum_names(field)(field.default_value)
        return lambda _: name
    default = field.default_value
    return lambda _: default


def present(field: FieldDescriptor) -> Callable[[Message], bool]:
    """Whether the writer's message carries a value of ``field`` on the wire (proto3 writes a scalar without
    presence only when it is not its default; -0.0 is not the default)."""
    name = field.name
    if field.is_repeated:
        return lambda m: len(getattr(m, name)) > 0
    if field.has_presence:
        return lambda m: m.HasField(name)
    if field.type in (FD.TYPE_FLOAT, FD.TYPE_DOUBLE):
        return lambda m: (value := getattr(m, name)) != 0 or math.copysign(1.0, value) < 0
    return lambda m: bool(getattr(m, name))


def _is_map(field: FieldDescriptor) -> bool:
    return field.is_repeated and field.message_type is not None and field.message_type.GetOptions().map_entry


def _field(written: FieldDescriptor, field: FieldDescriptor, path: str, writers_unset: bool = False) -> Converter:
    """The column ``field``'s value from the writer's field ``written``. Unset on the wire, it takes the column's unset
    value; or, with ``writers_unset`` (by name), the WRITER's (null when the writer's field has presence, else its
    default converted into the column; a default the column cannot hold is refused, as a set value would be: null
    is not what a proto3 writer meant), so that the value does not depend on which version's field types the
    column."""
    name = written.name
    convert: Converter
    unset = _unset(field)
    if _is_map(written) and _is_map(field):
        entry, into = written.message_type, field.message_type
        key = _value(entry.fields_by_name["key"], into.fields_by_name["key"], path, field.number)
        value = _value(entry.fields_by_name["value"], into.fields_by_name["value"], path, field.number)
        convert = lambda m: [(key(k), value(v)) for k, v in getattr(m, name).items()]  # noqa: E731
    elif _is_map(written) or _is_map(field) or written.is_repeated != field.is_repeated:
        convert = _refuse(path, field.number, f"is {_label(written)} in the writer's schema and {_label(field)} in "
                          "the reader's")
    elif field.is_repeated:
        each = _value(written, field, path, field.number)
        convert = lambda m: [each(v) for v in getattr(m, name)]  # noqa: E731
    else:
        one = _value(written, field, path, field.number)
        convert = lambda m: one(getattr(m, name))  # noqa: E731
        if writers_unset:
            unset = _writers_unset(written, one)
    has = present(written)
    return lambda m: convert(m) if has(m) else unset(m)


def _writers_unset(written: FieldDescriptor, one: Converter) -> Converter:
    if written.has_presence:
        return lambda _: None
    try:
        value = one(written.default_value)
    except ValueMismatchError:
        default = written.default_value
        return lambda _: one(default)  # the same mismatch for every record of this writer
    return lambda _: value


def _label(field: FieldDescriptor) -> str:
    if _is_map(field):
        return "a map"
    return f"a repeated {type_name(field)}" if field.is_repeated else f"a single {type_name(field)}"


def _refuse(path: str, number: int, detail: str) -> Converter:
    def refuse(_: Any) -> Any:
        raise ValueMismatchError(path, number, detail)
    return refuse


def _value(written: FieldDescriptor, field: FieldDescriptor, path: str, number: int) -> Converter:
    """One value of ``written`` (as protobuf gives it) as a value of ``field``'s column, or ``ValueMismatchError``."""
    source, target = written.type, field.type
    cannot = f"was written as {type_name(written)}, which its type in the reader's schema, {type_name(field)}, " \
             "cannot hold without changing it"
    if target in (FD.TYPE_MESSAGE, FD.TYPE_GROUP):
        if source not in (FD.TYPE_MESSAGE, FD.TYPE_GROUP):
            return _refuse(path, number, cannot)
        return _message(written.message_type, field.message_type, path, number, cannot)
    if source in (FD.TYPE_MESSAGE, FD.TYPE_GROUP):
        return _refuse(path, number, cannot)
    if target in INTEGER_RANGES and source in _NUMBERS:
        return _number(INTEGER_RANGES[target], int, path, number, type_name(field))
    if target == FD.TYPE_BOOL and source in _NUMBERS:
        return _number((0, 1), bool, path, number, "bool")
    if target == FD.TYPE_ENUM and source in _NUMBERS:
        return _number(_INT32, enum_names(field), path, number, type_name(field))
    if target == FD.TYPE_DOUBLE and source in (FD.TYPE_FLOAT, FD.TYPE_DOUBLE):
        return float
    if target == FD.TYPE_FLOAT and source in (FD.TYPE_FLOAT, FD.TYPE_DOUBLE):
        return _float32(path, number)
    if target == source:  # string, bytes
        return lambda v: v
    if target == FD.TYPE_BYTES and source == FD.TYPE_STRING:
        return lambda v: v.encode("utf-8")
    if target == FD.TYPE_STRING and source == FD.TYPE_BYTES:
        return _utf8(path, number)
    return _refuse(path, number, cannot)


def _number(bounds: tuple[int, int], then: Converter, path: str, number: int, name: str) -> Converter:
    low, high = bounds

    def convert(value: int) -> Any:
        if low <= int(value) <= high:
            return then(int(value))
        raise ValueMismatchError(path, number, f"holds {int(value)}, which its type in the reader's schema, "
                                 f"{name}, cannot hold")
    return convert


def _float32(path: str, number: int) -> Converter:
    def convert(value: float) -> float:
        try:
            narrowed: float = struct.unpack("<f", struct.pack("<f", value))[0]
        except OverflowError:
            narrowed = math.nan
        if narrowed == value or (math.isnan(value) and math.isnan(narrowed)):
            return narrowed
        raise ValueMismatchError(path, number, f"holds the double {value!r}, which its type in the reader's "
                                 "schema, float, cannot hold exactly")
    return convert


def _utf8(path: str, number: int) -> Converter:
    def convert(value: bytes) -> str:
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueMismatchError(path, number, "holds bytes that are not UTF-8, and its type in the reader's "
                                     "schema is string") from None
    return convert


def _message(written: Descriptor, reader: Descriptor, path: str, number: int, cannot: str) -> Converter:
    source, target = written.full_name, reader.full_name
    if target in _SPECIAL or source in _SPECIAL:
        if source == target:  # the well-known types are the same in every pool
            return Decoder.value_converter(reader)
        if source in WRAPPERS and target in WRAPPERS:
            inner = _value(written.fields_by_name["value"], reader.fields_by_name["value"], path, number)
            return lambda m: inner(m.value)
        return _refuse(path, number, cannot)
    if not reader.fields:  # an empty message is a bool: true when set
        return lambda _: True
    return _struct(written, reader, f"{path}.")
