"""Kafka records as Arrow: an ingest task's consumer's columns normalized to Shale's block schema."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from shale.block import BACKUP_SCHEMA, HEADERS, TIMESTAMP


def normalize(table: pa.Table) -> pa.Table:
    """Kafka's columns as a task's consumer gives them (key, value, topic, partition, offset, timestamp[us],
    timestampType, headers: ``shale.ingest.source.COLUMNS``) of one partition as the backup schema, in offset
    order."""
    headers = table.column("headers") if "headers" in table.column_names else pa.nulls(table.num_rows, HEADERS)
    out = pa.table({
        "topic": table.column("topic").cast(pa.string()),
        "partition": table.column("partition").cast(pa.int32()),
        "offset": table.column("offset").cast(pa.int64()),
        "timestamp": pc.cast(table.column("timestamp"), TIMESTAMP),  # microseconds already
        "timestamp_type": table.column("timestampType").cast(pa.int8()),
        "key": table.column("key").cast(pa.binary()),
        "value": table.column("value").cast(pa.binary()),
        "headers": headers.cast(HEADERS),
    }, schema=BACKUP_SCHEMA)
    # A task's consumer hands on each partition's records in offset order; sort only if not.
    offsets = out.column("offset")
    if out.num_rows > 1 and not pc.all(pc.greater(offsets.slice(1), offsets.slice(0, out.num_rows - 1))).as_py():
        out = out.sort_by([("offset", "ascending")])
    return out


def header_value(headers: list[dict[str, object]] | None, name: str) -> bytes | None:
    for header in headers or []:
        if header.get("key") == name:
            value = header.get("value")
            return value if isinstance(value, bytes) else None
    return None
