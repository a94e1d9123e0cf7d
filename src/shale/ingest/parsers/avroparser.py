"""``avro``: Avro records in the Confluent wire format, their writer schemas read from a Schema Registry; every
top-level field of the record becomes a TYPED column (``shale.schemas.avro`` maps the types).

Per chunk, ``prepare`` reads the schema ids of its records, fetches the schemas it has not cached, and takes the
newest of them (the highest id) as the chunk's reader schema: records written with an older compatible version
are resolved into it (a field added with a default gets its default), so one chunk's rows land in one block under
one schema, however the producers interleave versions. A record written with a version that cannot be resolved
into the newest (an incompatible change) is quarantined with the reason, as are records without the magic byte
and records whose id the registry says does not exist. A registry that does not answer raises
``RegistryUnavailableError`` out of ``prepare``: the batch fails before its commit and is retried, no record is
quarantined for it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from typing import Any, ClassVar

import pyarrow as pa
from pydantic import Field

from shale.block.names import check_label_name
from shale.block.schemas import RESERVED_COLUMNS
from shale.config import IngestConfig, SchemaRegistryConfig
from shale.config.parsers import ParserOptions
from shale.errors import ConfigError
from shale.ingest.parsers.base import ParseError, Parser, to_us
from shale.schemas import avro
from shale.schemas.registry import RegistryClient, UnknownSchemaError
from shale.schemas.wire import FramingError, payload, schema_id


class AvroOptions(ParserOptions):
    """Options of ``avro``."""

    time_field: str = Field(default="", description="dot path of the event time: a timestamp-millis/micros (or "
                            "local-) field, or a long of epoch milliseconds ('' = the Kafka record's timestamp)")
    label_fields: list[str] = Field(default_factory=list, description="top-level string or enum fields whose "
                                    "values become labels (few, low-cardinality)")
    column_prefix: str = Field(default="", description="prefix of every column name (for records with a field "
                               "named like a built-in column: topic, offset, timestamp, key, value, ...)")


class AvroParser(Parser):
    """Confluent-framed Avro; its options are ``AvroOptions``; the registry is ``ingest.schema_registry``."""

    name = "avro"
    options_model = AvroOptions
    time_unit = "us"
    typed: ClassVar[bool] = True

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        settings = self.settings
        assert isinstance(settings, AvroOptions)
        self.prefix = settings.column_prefix
        self.time_path = settings.time_field.split(".") if settings.time_field else []
        self.label_names = [self.prefix + f for f in settings.label_fields]
        self.registry_config = SchemaRegistryConfig()
        self._registry: RegistryClient | None = None
        self._decoders: dict[tuple[int, int], avro.Decoder] = {}
        self._columns: dict[str, pa.DataType] = {}
        self._reader_id = 0
        self._problems: dict[int, str] = {}
        self.schema_ids: list[int] = []
        self.fingerprint = ""

    def bind(self, ingest: IngestConfig) -> None:
        self.registry_config = ingest.schema_registry

    def check(self) -> None:
        for column in self.label_names:
            check_label_name(column)
            if column in RESERVED_COLUMNS:
                raise ConfigError(f"parser avro: label {column!r} clashes with a built-in column (set column_prefix)")

    def columns(self) -> dict[str, pa.DataType]:
        return self._columns

    def schema_info(self) -> tuple[list[int], str]:
        return list(self.schema_ids), self.fingerprint

    def labels(self) -> list[str]:
        return [name for name in self.label_names if name in self._columns]

    @property
    def registry(self) -> RegistryClient:
        if self._registry is None:
            self._registry = RegistryClient(self.registry_config)
        return self._registry

    def prepare(self, headers: list[bytes | None]) -> None:
        """Fix the chunk's reader schema and columns from the schema ids its records carry (see the module)."""
        ids: set[int] = set()
        for value in headers:
            with contextlib.suppress(FramingError):  # parse quarantines it with the reason
                ids.add(schema_id(value))
        self._problems = {}
        usable = []
        for sid in sorted(ids):
            try:
                registered = self.registry.schema(sid)  # RegistryUnavailableError: the batch is retried
            except UnknownSchemaError as exc:
                self._problems[sid] = str(exc)
                continue
            if registered.schema_type != "AVRO":
                self._problems[sid] = f"schema id {sid} is a {registered.schema_type} schema, not Avro"
                continue
            usable.append((sid, registered.text))
        self._columns, self.schema_ids, self.fingerprint, self._reader_id = {}, [], "", 0
        if not usable:
            return
        reader_id, reader_text = usable[-1]
        self._reader_id = reader_id
        try:
            newest = avro.Decoder(reader_text)
        except avro.SchemaError as exc:
            self._problems.update({sid: f"schema id {sid}: {exc}" for sid, _ in usable})
            return
        if not pa.types.is_struct(newest.arrow):
            self._problems.update({sid: f"schema id {sid} is not a record schema" for sid, _ in usable})
            return
        columns = {self.prefix + f.name: f.type for f in newest.arrow}
        clash = sorted(set(columns) & RESERVED_COLUMNS)
        if clash:
            self._problems.update({sid: f"fields {clash} clash with built-in columns: set the avro parser's "
                                   "column_prefix" for sid, _ in usable})
            return
        self._columns = columns
        self.fingerprint = avro.fingerprint(reader_text)
        for sid, text in usable:
            key = (sid, reader_id)
            if key not in self._decoders:
                try:
                    self._decoders[key] = newest if sid == reader_id else avro.Decoder(text, reader_text)
                except avro.SchemaError as exc:
                    self._problems[sid] = f"schema id {sid}: {exc}"
        self.schema_ids = sorted(sid for sid, _ in usable if sid not in self._problems)

    def parse(self, value: bytes | None, kafka_time_ms: int) -> tuple[int, dict[str, Any]]:
        try:
            sid = schema_id(value)
        except FramingError as exc:
            raise ParseError(str(exc)) from None
        assert value is not None
        if sid in self._problems:
            raise ParseError(self._problems[sid])
        decoder = self._decoders.get((sid, self._reader_id))
        if decoder is None:
            raise ParseError(f"schema id {sid} was not prepared for this chunk")
        try:
            datum = decoder.decode(payload(value))
        except Exception as exc:  # fastavro raises many kinds on bytes that are not a datum of the schema
            kind = "cannot be read as the newest schema id" if sid != self._reader_id else "is not a datum of"
            raise ParseError(f"the record written with schema id {sid} {kind} {self._reader_id}: "
                             f"{type(exc).__name__}: {exc}"[:1000]) from None
        if not isinstance(datum, dict):
            raise ParseError(f"schema id {sid} does not describe a record")
        event_time = kafka_time_ms * 1000
        if self.time_path:
            event_time = _time_us(datum, self.time_path)
        return event_time, {self.prefix + k: v for k, v in datum.items()}


def _time_us(datum: dict[str, Any], path: list[str]) -> int:
    found: Any = datum
    for part in path:
        found = found.get(part) if isinstance(found, dict) else None
    if isinstance(found, dt.datetime):
        return to_us(found if found.tzinfo is not None else found.replace(tzinfo=dt.UTC))
    if isinstance(found, int) and not isinstance(found, bool):
        return found * 1000
    raise ParseError(f"time field {'.'.join(path)!r} is {found!r}, not a timestamp or epoch milliseconds")
