"""Arrow schemas of the rows in blocks: the backup group's verbatim Kafka records, the partition group's parsed
records (base columns; parsers add their own), and quarantined records with the reason they were rejected."""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping

import pyarrow as pa

TIMESTAMP = pa.timestamp("us", tz="UTC")
"""Every time column is UTC microseconds: what Spark and Iceberg use (block metadata keeps milliseconds)."""
TIMESTAMP_MS = pa.timestamp("ms", tz="UTC")
HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))

KAFKA_FIELDS = [
    pa.field("topic", pa.string(), nullable=False),
    pa.field("partition", pa.int32(), nullable=False),
    pa.field("offset", pa.int64(), nullable=False),
    pa.field("timestamp", TIMESTAMP, nullable=False),
    pa.field("timestamp_type", pa.int8(), nullable=False),
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("headers", HEADERS),
]

BACKUP_SCHEMA = pa.schema(KAFKA_FIELDS)
"""A Kafka record, verbatim: what the backup group stores."""

PARTITION_BASE_FIELDS = [
    *KAFKA_FIELDS,
    pa.field("event_time", TIMESTAMP, nullable=False),
    pa.field("dt", pa.string(), nullable=False),
    pa.field("hour", pa.int8()),
]
"""The columns every partition-group row has; a parser's label and field columns follow them."""

QUARANTINE_SCHEMA = pa.schema([
    *KAFKA_FIELDS,
    pa.field("reason", pa.string(), nullable=False),
    pa.field("parser", pa.string(), nullable=False),
])
"""A record a parser rejected: the Kafka record verbatim, why, and which parser."""

RESERVED_COLUMNS = frozenset(f.name for f in PARTITION_BASE_FIELDS) | {"reason", "parser"}
BASE_COLUMNS = RESERVED_COLUMNS
"""Columns of the base schemas; any other column in a dataset is a parser's column (a string column unless the
dataset's metadata records its type: ``column_types``)."""


def encode_column_types(fields: Iterable[pa.Field]) -> str:
    """A parser's typed columns as block metadata keeps them: an Arrow IPC schema, base64."""
    return base64.b64encode(pa.schema(list(fields)).serialize().to_pybytes()).decode()


def decode_column_types(text: str | None) -> dict[str, pa.DataType]:
    """The column types ``encode_column_types`` wrote ({} for None or '')."""
    if not text:
        return {}
    schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))
    return {f.name: f.type for f in schema}


def partition_schema(columns: list[str], types: Mapping[str, pa.DataType] | None = None) -> pa.Schema:
    """A partition-group records schema with these parser columns (strings, unless ``types`` names theirs)."""
    known = types or {}
    return pa.schema([*PARTITION_BASE_FIELDS, *(pa.field(c, known.get(c, pa.string())) for c in columns)])
