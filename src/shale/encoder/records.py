"""Kafka records as Arrow: Spark's Kafka source columns normalized to Shale's block schema."""

from __future__ import annotations

import base64
import json

import pyarrow as pa
import pyarrow.compute as pc

from shale.block.schemas import BACKUP_SCHEMA, HEADERS, TIMESTAMP

SPARK_COLUMNS = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType",
                 "CASE WHEN size(headers) > 0 THEN to_json(headers) END AS headers_json"]
"""What tasks receive from Spark's Kafka source. Headers cross to Python as JSON text (binary values in base64),
and only for records that have any: Spark's Arrow conversion of the nested header column costs several times
the rest of the record (measured: 24 s against 10 s per million records on this project's machine)."""

WRITTEN_SCHEMA = "written string, paused string"
"""What an ingest task returns to the driver: one row per chunk written, a ``Written`` record as JSON, and one for a
partition it paused, a ``Paused`` record as JSON (each validated by the same model on both sides)."""


def normalize(table: pa.Table) -> pa.Table:
    """Spark's Kafka columns (key, value, topic, partition, offset, timestamp[us], timestampType, headers) of one
    partition as the backup schema, in offset order."""
    if "headers_json" in table.column_names:
        headers = _headers_from_json(table.column("headers_json"))
    elif "headers" in table.column_names:
        headers = table.column("headers")
    else:
        headers = pa.nulls(table.num_rows, HEADERS)
    out = pa.table({
        "topic": table.column("topic").cast(pa.string()),
        "partition": table.column("partition").cast(pa.int32()),
        "offset": table.column("offset").cast(pa.int64()),
        "timestamp": pc.cast(table.column("timestamp"), TIMESTAMP),  # Spark gives microseconds already
        "timestamp_type": table.column("timestampType").cast(pa.int8()),
        "key": table.column("key").cast(pa.binary()),
        "value": table.column("value").cast(pa.binary()),
        "headers": headers.cast(HEADERS),
    }, schema=BACKUP_SCHEMA)
    # Spark's Kafka source hands each task one partition's records in offset order; sort only if not.
    offsets = out.column("offset")
    if out.num_rows > 1 and not pc.all(pc.greater(offsets.slice(1), offsets.slice(0, out.num_rows - 1))).as_py():
        out = out.sort_by([("offset", "ascending")])
    return out


def _headers_from_json(column: pa.ChunkedArray) -> pa.Array:
    if column.null_count == len(column):
        return pa.nulls(len(column), HEADERS)
    decoded = [None if text is None else
               [{"key": h.get("key"), "value": None if h.get("value") is None else base64.b64decode(h["value"])}
                for h in json.loads(text)]
               for text in column.to_pylist()]
    return pa.array(decoded, HEADERS)


def header_value(headers: list[dict[str, object]] | None, name: str) -> bytes | None:
    for header in headers or []:
        if header.get("key") == name:
            value = header.get("value")
            return value if isinstance(value, bytes) else None
    return None
