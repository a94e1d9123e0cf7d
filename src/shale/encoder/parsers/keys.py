"""Schema-encoded record keys: a key written by a Schema Registry serializer (Avro, Protobuf or JSON Schema, Confluent
wire format) decoded into ONE typed column (a struct for a record, message or object; the scalar for a primitive
Avro key such as ``"string"``).

Per chunk, ``prepare`` fetches the key schemas of the chunk's ids; the column's type is the newest (highest id) key
schema's. A key of an older Avro version is resolved into the newest; a Protobuf key is parsed with its writer's
descriptor and read into the newest message by field number, converted only where the type holds the value exactly
(``shale.schemas.protobuf_versions``); JSON keys are decoded with their own schema and converted into the newest
type by name when the block is written (a value that no longer fits is quarantined with the reason). A null key
reads as null; a key that cannot be decoded quarantines its record with the reason, prefixed "key:".
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Literal

import pyarrow as pa
from google.protobuf.message import DecodeError

from shale.encoder.parsers.base import ParseError
from shale.schemas import (
    FramingError,
    RegisteredSchema,
    RegistryClient,
    Resolver,
    SchemaError,
    UnknownSchemaError,
    avro,
    jsonschema,
    message_indexes,
    protobuf,
    schema_id,
)

KeyFormat = Literal["", "avro", "protobuf", "json_schema"]
SCHEMA_TYPES = {"avro": "AVRO", "protobuf": "PROTOBUF", "json_schema": "JSON"}


Compiled = tuple[Callable[[memoryview], Any], pa.DataType] | str
"""A key schema's decoder and Arrow type, or why it cannot be used."""


class KeyDecoder:
    """Decodes the keys of one topic's chunks written in ``key_format``; not thread-safe (one per parser)."""

    def __init__(self, key_format: str, registry: Callable[[], RegistryClient]) -> None:
        self.format = key_format
        self._registry = registry
        self._compiled: dict[tuple[int, tuple[int, ...], int, str], Compiled] = {}
        self._schemas: dict[int, RegisteredSchema] = {}
        self._problems: dict[int, str] = {}
        self.arrow: pa.DataType | None = None
        self._newest = 0
        self._reader: protobuf.Decoder | None = None
        self._files: dict[int, protobuf.ProtoFile] = {}

    def prepare(self, heads: list[bytes | None]) -> None:
        """Fetch the chunk's key schemas (``RegistryUnavailableError``: the partition pauses) and fix the type."""
        ids: set[int] = set()
        for head in heads:
            with contextlib.suppress(FramingError):
                ids.add(schema_id(head))
        self._problems, self.arrow, self._newest, self._reader = {}, None, 0, None
        usable = []
        for sid in sorted(ids):
            try:
                registered = self._registry().schema(sid)
            except UnknownSchemaError as exc:
                self._problems[sid] = str(exc)
                continue
            if registered.schema_type != SCHEMA_TYPES[self.format]:
                self._problems[sid] = f"schema id {sid} is a {registered.schema_type} schema, not {self.format}"
                continue
            self._schemas[sid] = registered
            usable.append(sid)
        if not usable:
            return
        self._newest = usable[-1]
        for head in heads:  # the column's type: the newest key schema's (its message, for Protobuf)
            with contextlib.suppress(FramingError):
                if schema_id(head) == self._newest:
                    indexes = self._indexes(head or b"")
                    found = self._compile(self._newest, indexes)
                    if not isinstance(found, str):
                        self.arrow = found[1]
                        self._reader_for(indexes)
                        return

    def _reader_for(self, indexes: tuple[int, ...]) -> None:
        """The newest Protobuf key message, the one older key versions are read into."""
        if self.format == "protobuf":
            file = self._proto_file(self._schemas[self._newest])
            self._reader = protobuf.Decoder(file.message(list(indexes)))

    def _proto_file(self, registered: RegisteredSchema) -> protobuf.ProtoFile:
        if registered.id not in self._files:
            self._files[registered.id] = protobuf.load(self._registry(), registered)
        return self._files[registered.id]

    def _indexes(self, key: bytes) -> tuple[int, ...]:
        return tuple(message_indexes(key)[0]) if self.format == "protobuf" else ()

    def _compile(self, sid: int, indexes: tuple[int, ...]) -> Compiled:
        cache = (sid, indexes, self._newest, self._reader.descriptor.full_name if self._reader else "")
        found = self._compiled.get(cache)
        if found is None:
            registered = self._schemas[sid]
            try:
                if self.format == "avro":
                    reader = self._schemas[self._newest].text if sid != self._newest else None
                    decoder = avro.Decoder(registered.text, reader)
                    found = decoder.decode, decoder.arrow
                elif self.format == "protobuf":
                    found = self._protobuf(registered, sid, indexes)
                else:
                    value = jsonschema.Decoder(registered.text)
                    found = value.decode, value.arrow
            except (SchemaError, UnknownSchemaError) as exc:
                found = f"schema id {sid}: {exc}"
            self._compiled[cache] = found
        return found

    def _protobuf(self, registered: RegisteredSchema, sid: int, indexes: tuple[int, ...]) -> Compiled:
        """A Protobuf key is parsed with its writer's descriptor; a key of another version than the newest is then
        read into the newest's message by field number, converted only where the type holds the value exactly
        (``protobuf_versions``; ``ValueMismatchError`` quarantines its record)."""
        writer = self._proto_file(registered).message(list(indexes))
        if sid == self._newest or self._reader is None:
            decoder = protobuf.Decoder(writer)
            return decoder.decode, decoder.arrow
        resolver = Resolver(writer, self._reader)
        return resolver.decode, self._reader.arrow

    def decode(self, key: bytes | None) -> Any:
        """The key's value (None for a null key); ``ParseError`` with the reason."""
        if key is None:
            return None
        try:
            sid = schema_id(key)
            indexes, start = message_indexes(key) if self.format == "protobuf" else ([], 5)
        except FramingError as exc:
            raise ParseError(f"key: {exc}") from None
        if sid in self._problems:
            raise ParseError(f"key: {self._problems[sid]}")
        if sid not in self._schemas or not self._newest:
            raise ParseError(f"key: schema id {sid} was not prepared for this chunk")
        found = self._compile(sid, tuple(indexes))
        if isinstance(found, str):
            raise ParseError(f"key: {found}")
        try:
            return found[0](memoryview(key)[start:])
        except (jsonschema.InvalidValueError, DecodeError, ValueError, EOFError, IndexError, KeyError,
                TypeError) as exc:
            raise ParseError(f"key written with schema id {sid} does not decode: {type(exc).__name__}: "
                             f"{exc}"[:1000]) from None
