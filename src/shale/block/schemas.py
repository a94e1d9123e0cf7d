"""Arrow schemas of the rows in blocks: the backup group's verbatim Kafka records, the partition group's parsed
records (base columns; parsers add their own), and quarantined records with the reason they were rejected."""

from __future__ import annotations

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
"""Columns of the base schemas; any other column in a dataset is a parser's string column."""


def partition_schema(columns: list[str]) -> pa.Schema:
    """A partition-group records schema with these parser columns (all strings)."""
    return pa.schema([*PARTITION_BASE_FIELDS, *(pa.field(c, pa.string()) for c in columns)])
