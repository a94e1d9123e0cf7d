"""Writing a query's stream: table (for people), json (one object per line), csv, parquet."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
from collections.abc import Iterator
from typing import IO, Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from shale.schemas import parquet_type

FORMATS = ("table", "json", "csv", "parquet")


def iso_time(value: dt.datetime) -> str:
    """The one time format of every output: ISO 8601 in UTC, microseconds kept, ``Z``."""
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC)
    return value.replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def text_value(value: Any) -> Any:
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return "base64:" + base64.b64encode(value).decode()
    if isinstance(value, dt.datetime):
        return iso_time(value)
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)  # exact: a decimal column never goes through a float
    if isinstance(value, list | tuple):  # a map's entries are (key, value) tuples
        return [text_value(v) for v in value]
    if isinstance(value, dict):
        return {k: text_value(v) for k, v in value.items()}
    return value



def by_time(schema: pa.Schema, batches: Iterator[pa.RecordBatch], limit: int | None) -> Iterator[pa.RecordBatch]:
    """The rows sorted by event time (records of the partition group) or Kafka time (the others), then offset."""
    column = "event_time" if "event_time" in schema.names else "timestamp"
    keys = [(name, "ascending") for name in (column, "topic", "partition", "offset") if name in schema.names]
    table = pa.Table.from_batches(list(batches), schema=schema)
    if keys:
        table = table.sort_by(keys)
    if limit is not None:
        table = table.slice(0, limit)
    yield from table.to_batches()


def write_json(batches: Iterator[pa.RecordBatch], out: IO[str]) -> None:
    """Binary values are text when they are UTF-8, else ``base64:...``; times are ISO 8601."""
    for batch in batches:
        for row in batch.to_pylist():
            out.write(json.dumps(text_value(row)) + "\n")


def _flat(batch: pa.RecordBatch) -> pa.RecordBatch:
    """CSV has no binary or nested values: binary as text (as for json), headers and a typed parser's lists,
    maps and structs as JSON; times as in json."""
    arrays = []
    for column in batch.columns:
        if pa.types.is_timestamp(column.type):
            arrays.append(pa.array([None if v is None else iso_time(v) for v in column.to_pylist()], pa.string()))
        elif pa.types.is_binary(column.type) or pa.types.is_nested(column.type):
            values = [text_value(v) for v in column.to_pylist()]
            arrays.append(pa.array([json.dumps(v) if isinstance(v, list | dict) else v for v in values], pa.string()))
        else:
            arrays.append(column)
    return pa.RecordBatch.from_arrays(arrays, names=batch.schema.names)


def write_csv(schema: pa.Schema, batches: Iterator[pa.RecordBatch], out: IO[bytes]) -> None:
    writer = None
    for batch in batches:
        flat = _flat(batch)
        if writer is None:
            writer = pacsv.CSVWriter(out, flat.schema)
        writer.write_batch(flat)
    if writer is None:
        empty = _flat(pa.RecordBatch.from_pylist([], schema=schema))
        writer = pacsv.CSVWriter(out, empty.schema)
    writer.close()


def write_parquet(schema: pa.Schema, batches: Iterator[pa.RecordBatch], path: str) -> None:
    """Parquet cannot write an empty record (``struct<>``): it goes out with its marker (``shale.schemas.empty``)."""
    storable = pa.schema([f.with_type(parquet_type(f.type)) for f in schema])
    with pq.ParquetWriter(path, storable, compression="zstd") as writer:
        for batch in batches:
            writer.write_batch(batch if storable == schema else batch.cast(storable))
