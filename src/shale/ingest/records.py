"""Kafka records as Arrow: Spark's Kafka source columns normalized to Shale's block schema."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from shale.block.schemas import BACKUP_SCHEMA, HEADERS, TIMESTAMP

SPARK_OUTPUT_SCHEMA = (
    "topic string, partition int, start long, end long, records long, quarantined long, bytes long, meta string"
)
"""One row per block written by an ingest task (a range-only row has a null meta)."""


def normalize(table: pa.Table) -> pa.Table:
    """Spark's Kafka columns (key, value, topic, partition, offset, timestamp[us], timestampType, headers) as the
    backup schema (timestamp in ms, timestamp_type int8), in offset order within each partition."""
    headers = table.column("headers") if "headers" in table.column_names else pa.nulls(table.num_rows, HEADERS)
    out = pa.table({
        "topic": table.column("topic").cast(pa.string()),
        "partition": table.column("partition").cast(pa.int32()),
        "offset": table.column("offset").cast(pa.int64()),
        "timestamp": table.column("timestamp").cast(TIMESTAMP),
        "timestamp_type": table.column("timestampType").cast(pa.int8()),
        "key": table.column("key").cast(pa.binary()),
        "value": table.column("value").cast(pa.binary()),
        "headers": headers.cast(HEADERS),
    }, schema=BACKUP_SCHEMA)
    return out.sort_by([("topic", "ascending"), ("partition", "ascending"), ("offset", "ascending")])


def partitions_of(table: pa.Table) -> list[tuple[str, int]]:
    pairs = table.select(["topic", "partition"]).group_by(["topic", "partition"]).aggregate([])
    return sorted(zip(pairs.column("topic").to_pylist(), pairs.column("partition").to_pylist(), strict=True))


def of_partition(table: pa.Table, topic: str, partition: int) -> pa.Table:
    mask = pc.and_(pc.equal(table.column("topic"), topic), pc.equal(table.column("partition"), partition))
    return table.filter(mask)


def header_value(headers: list[dict[str, object]] | None, name: str) -> bytes | None:
    for header in headers or []:
        if header.get("key") == name:
            value = header.get("value")
            return value if isinstance(value, bytes) else None
    return None
