"""What the typed parsers of Schema Registry formats share (``avro``, ``protobuf``, ``json_schema``): the registry
client, the options (time field, labels, column prefix), fetching a chunk's writer schemas and the problems that
quarantine their records, and the columns of the chunk's newest schema.

A registry that does not answer raises ``RegistryUnavailableError`` out of ``prepare``: the ingest task pauses its
partition at that chunk (nothing of the chunk is written or quarantined) and the driver plans it again later. An id
the registry says does not exist, or a schema of another format, quarantines the records written with it, with the
reason.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
from typing import Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, model_validator

from shale.block import RECORD_LABEL, RESERVED_COLUMNS, check_label_name
from shale.config import IngestConfig, ParserOptions, SchemaRegistryConfig
from shale.encoder.parsers.base import BatchParse, ParseError, Parser, to_us
from shale.encoder.parsers.keys import KeyDecoder, KeyFormat
from shale.errors import ConfigError
from shale.schemas import FramingError, RegisteredSchema, RegistryClient, UnknownSchemaError, schema_id

ONE_TYPE = ("under subject_name_strategy 'topic' (set the parser's subject_name_strategy to 'record' or "
            "'topic_record' to store each record type as its own dataset)")
"""The end of the reason of a record of another type than its chunk's, with the topic strategy."""


class RegistryOptions(ParserOptions):
    """Options of the ``protobuf`` and ``json_schema`` parsers."""

    time_field: str = Field(default="", description="dot path of the event time: a timestamp field (Protobuf "
                            "google.protobuf.Timestamp, JSON Schema format date-time), or an integer of epoch "
                            "milliseconds ('' = the Kafka record's timestamp)")
    label_fields: list[str] = Field(default_factory=list, description="top-level string or enum fields whose "
                                    "values become labels (few, low-cardinality)")
    column_prefix: str = Field(default="", description="prefix of every column name (for records with a field "
                               "named like a built-in column: topic, offset, timestamp, key, value, ...)")
    key_format: KeyFormat = Field(default="", description="the Schema Registry format the record keys are written "
                                  "in: avro, protobuf or json_schema; the decoded key becomes one typed column "
                                  "('' = keys stay bytes in the key column only)")
    key_column: str = Field(default="record_key", description="name of the decoded key's column (with key_format)")
    reader_schema_id: int = Field(default=0, ge=0, description="a named reader schema: every record is read as "
                                  "this registry id (Avro: resolved from its writer schema; Protobuf: parsed with "
                                  "its descriptor; JSON Schema: validated and converted by it), a record that cannot "
                                  "be is quarantined with the reason (0 = each chunk's newest schema; `shale "
                                  "reprocess --schema-id` sets it)")
    subject_name_strategy: Literal["topic", "record", "topic_record"] = Field(
        default="topic", description="how the producers' serializers name subjects: topic (one record type per "
        "topic; a chunk is typed by the type most of its records carry, the others are quarantined), record or "
        "topic_record (RecordNameStrategy, TopicRecordNameStrategy: several types in a topic; each type is stored "
        "as its own dataset `records/<topic>/<type>` with a `record` label, queried with {record=\"<type>\"}, and "
        "published as its own Iceberg table `<topic>__<type with . as _>`)")

    @model_validator(mode="after")
    def _one_reader(self) -> RegistryOptions:
        if self.reader_schema_id and self.subject_name_strategy != "topic":
            raise ValueError(f"reader_schema_id names one schema, of one record type; with subject_name_strategy "
                             f"{self.subject_name_strategy!r} a topic carries several: reprocess with the "
                             "chunk's newest schema of each type (no --schema-id)")
        return self


class RegistryParser(Parser):
    """A parser of one Schema Registry format (``schema_type``); subclasses fix ``prepare`` and ``decode``."""

    time_unit = "us"
    typed: ClassVar[bool] = True
    schema_type: ClassVar[str]
    """The registry's ``schemaType`` of this format: AVRO, PROTOBUF or JSON."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        settings: Any = self.settings
        self.prefix: str = settings.column_prefix
        self.time_path: list[str] = settings.time_field.split(".") if settings.time_field else []
        self.label_names = [self.prefix + f for f in settings.label_fields]
        self.registry_config = SchemaRegistryConfig()
        self._registry: RegistryClient | None = None
        self._columns: dict[str, pa.DataType] = {}
        self._time_type: pa.DataType | None = None
        self.schema_ids: list[int] = []
        self.fingerprint = ""
        self._keys = KeyDecoder(settings.key_format, lambda: self.registry) if settings.key_format else None
        self.key_column: str = settings.key_column
        self.reader_schema_id: int = settings.reader_schema_id
        self.by_record: bool = settings.subject_name_strategy != "topic"

    @property
    def decodes_keys(self) -> bool:
        return self._keys is not None

    def prepare_keys(self, heads: list[bytes | None]) -> None:
        if self._keys is not None:
            self._keys.prepare(heads)  # RegistryUnavailableError: the partition pauses

    def key_columns(self) -> dict[str, pa.DataType]:
        if self._keys is None or self._keys.arrow is None or self.key_column in self._columns:
            return {}
        return {self.key_column: self._keys.arrow}

    def parse_key(self, key: bytes | None) -> dict[str, Any]:
        if self._keys is None:
            return {}
        if self.key_column in self._columns:
            raise ParseError(f"key column {self.key_column!r} clashes with a field of the value: set the {self.name} "
                             "parser's key_column")
        return {self.key_column: self._keys.decode(key)}

    def bind(self, ingest: IngestConfig) -> None:
        self.registry_config = ingest.schema_registry

    def check(self) -> None:
        if self._keys is not None:
            check_label_name(self.key_column)
            if self.key_column in RESERVED_COLUMNS or self.key_column.startswith("__"):
                raise ConfigError(f"parser {self.name}: key_column {self.key_column!r} clashes with a built-in "
                                  "column")
        for column in self.label_names:
            check_label_name(column)
            if self.by_record and column == RECORD_LABEL:
                raise ConfigError(f"parser {self.name}: label {column!r} clashes with the label naming each record "
                                  "type (subject_name_strategy): set column_prefix")
            if column in RESERVED_COLUMNS:
                raise ConfigError(f"parser {self.name}: label {column!r} clashes with a built-in column "
                                  "(set column_prefix)")

    def columns(self) -> dict[str, pa.DataType]:
        return self._columns

    @property
    def per_record_type(self) -> bool:
        return self.by_record

    def record_types(self, headers: list[bytes | None]) -> list[str | None] | None:
        if not self.by_record:
            return None
        return self.types_of(headers)

    def types_of(self, headers: list[bytes | None]) -> list[str | None]:
        """Each record's type by its writer schema (see ``record_types``); subclasses name it."""
        raise NotImplementedError

    def schema_info(self) -> tuple[list[int], str]:
        return list(self.schema_ids), self.fingerprint

    def labels(self) -> list[str]:
        return [name for name in self.label_names if name in self._columns]

    @property
    def registry(self) -> RegistryClient:
        if self._registry is None:
            self._registry = RegistryClient(self.registry_config)
        return self._registry

    def named_schema_id(self) -> int | None:
        return self.reader_schema_id or None

    def named_reader(self) -> RegisteredSchema | str | None:
        """The named reader schema (option ``reader_schema_id``), or why it cannot be used (its records are then
        quarantined with it), or None when none is named. ``RegistryUnavailableError`` when the registry does not
        answer."""
        if not self.reader_schema_id:
            return None
        try:
            registered = self.registry.schema(self.reader_schema_id)
        except UnknownSchemaError as exc:
            return f"the named reader schema: {exc}"
        if registered.schema_type != self.schema_type:
            return (f"the named reader schema id {registered.id} is a {registered.schema_type} schema, not "
                    f"{self.schema_type}")
        return registered

    @property
    def reader_word(self) -> str:
        """How reasons name the schema records are read as."""
        return "named reader" if self.reader_schema_id else "newest"

    @staticmethod
    def ids_of(headers: list[bytes | None]) -> set[int]:
        ids: set[int] = set()
        for value in headers:
            with contextlib.suppress(FramingError):  # parse quarantines it with the reason
                ids.add(schema_id(value))
        return ids

    def fetch(self, ids: set[int], problems: dict[int, str]) -> list[RegisteredSchema]:
        """The schemas of ``ids`` that exist and are of this parser's format, oldest first; the others' reasons go
        into ``problems``. ``RegistryUnavailableError`` when the registry does not answer."""
        usable = []
        for sid in sorted(ids):
            try:
                registered = self.registry.schema(sid)  # RegistryUnavailableError: the partition pauses
            except UnknownSchemaError as exc:
                problems[sid] = str(exc)
                continue
            if registered.schema_type != self.schema_type:
                problems[sid] = f"schema id {sid} is a {registered.schema_type} schema, not {self.schema_type}"
                continue
            usable.append(registered)
        return usable

    def set_columns(self, arrow: pa.StructType) -> str | None:
        """Take the fields of ``arrow`` (the chunk's newest schema) as the columns, or say why they cannot be."""
        columns = {self.prefix + f.name: f.type for f in arrow}
        clash = sorted(set(columns) & RESERVED_COLUMNS)
        if clash:
            return f"fields {clash} clash with built-in columns: set the {self.name} parser's column_prefix"
        self._columns = columns
        self._time_type = _type_at(arrow, self.time_path)
        return None

    def clear(self) -> None:
        self._columns, self.schema_ids, self.fingerprint, self._time_type = {}, [], "", None

    def finish(self, datum: dict[str, Any], kafka_time_ms: int) -> tuple[int, dict[str, Any]]:
        """The event time and the columns of a decoded record."""
        event_time = kafka_time_ms * 1000
        if self.time_path:
            event_time = self.time_us(datum)
        return event_time, {self.prefix + k: v for k, v in datum.items()} if self.prefix else datum

    def batch_time(self) -> str | None:
        """The column a batch path takes the event time from: a top-level time field of a timestamp or an integer
        type; None otherwise (the batch path is not taken: every record through ``parse``)."""
        column = self.prefix + self.time_path[0] if len(self.time_path) == 1 else None
        kind = self.columns().get(column or "")
        return column if kind is not None and (pa.types.is_timestamp(kind) or pa.types.is_integer(kind)) else None

    def batch_of(self, rows: list[int], data: list[dict[str, Any]]) -> BatchParse | None:
        """The batch of decoded records ``data`` (each a record of the chunk's row in ``rows``, as ``finish``
        would read it): each column made at once, the event time from ``batch_time``'s column as ``time_us``
        reads it. A record whose values break the encoder's per-value rules (``field_problems``) or whose time is
        null is left to ``parse``, which says why; a value its column cannot hold at all makes the whole chunk go
        through ``parse`` (None)."""
        from shale.encoder.parsing import field_problems  # the encoder's per-value rules, the same as ``parse``'s

        columns = self.columns()
        time_column = self.batch_time()
        if time_column is None:
            return None
        fields = {name: list(map(dict.get, data, itertools.repeat(name[len(self.prefix):]))) for name in columns}
        bad = field_problems(fields, self.labels(), columns)
        time_type = columns[time_column]
        try:
            arrays = {name: pa.array(v, columns[name]) for name, v in fields.items()}
            times = arrays[time_column]
            if pa.types.is_timestamp(time_type):
                times = times.cast(pa.timestamp("us", time_type.tz)).cast(pa.int64())
            else:
                times = pc.multiply_checked(times.cast(pa.int64()), 1000)  # epoch milliseconds
        except (pa.ArrowException, ValueError, TypeError, OverflowError, UnicodeEncodeError):
            return None  # a value its column cannot hold: every record through ``parse``, which says which
        keep = np.ones(len(rows), np.bool_)
        keep[list(bad)] = False
        keep &= pc.is_valid(times).to_numpy(zero_copy_only=False)
        mask = pa.array(keep)
        return BatchParse(pa.array(rows, pa.int64()).filter(mask), times.filter(mask),
                          {name: array.filter(mask) for name, array in arrays.items()})

    def time_us(self, datum: dict[str, Any]) -> int:
        found: Any = datum
        for part in self.time_path:
            found = found.get(part) if isinstance(found, dict) else None
        if isinstance(found, dt.datetime):
            return to_us(found if found.tzinfo is not None else found.replace(tzinfo=dt.UTC))
        if isinstance(found, int) and not isinstance(found, bool):
            is_timestamp = self._time_type is not None and pa.types.is_timestamp(self._time_type)
            return found if is_timestamp else found * 1000  # a timestamp column's integers are microseconds
        raise ParseError(f"time field {'.'.join(self.time_path)!r} is {found!r}, not a timestamp or epoch "
                         "milliseconds")


def _type_at(arrow: pa.DataType, path: list[str]) -> pa.DataType | None:
    found: pa.DataType | None = arrow
    for part in path:
        if found is None or not pa.types.is_struct(found) or found.get_field_index(part) < 0:
            return None
        found = found.field(part).type
    return found if path else None
