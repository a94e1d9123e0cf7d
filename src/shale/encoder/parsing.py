"""Parsing a chunk's records: the seam between the encoder and its parsers (docs/design/schemas.md, "The parsing
seam"). ``parse_records`` takes a chunk's Kafka records as an Arrow table and gives the parsed rows as typed columns,
with a reason for every record it rejects. A parser's batch path (``Parser.parse_batch``) reads the records it can
in native code; the rest go through its per-record ``parse``. Either way the encoder's rules hold: a label no
longer than ``MAX_LABEL_VALUE_BYTES``, an event time inside [1970, read time + a day], a value its column holds
exactly, or the record is quarantined with the reason."""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shale.block import KAFKA_FIELDS, PARTITION_BASE_FIELDS, TIMESTAMP, TIMESTAMP_MS
from shale.encoder.parsers import BatchParse, ParseError, Parser

HOUR_MS = 3_600_000


def _date(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC)


def hour_partitions(micros: pa.Array, by_hour: bool) -> tuple[pa.Array, pa.Array]:
    """The ``dt`` (UTC day, YYYY-MM-DD) and ``hour`` (UTC hour, or null unless ``by_hour``) columns of event
    times in microseconds since the epoch (none negative): one strftime per distinct hour, not per record."""
    hours = pc.divide(micros, HOUR_MS * 1000).dictionary_encode()
    starts = [_date(h * HOUR_MS) for h in hours.dictionary.to_pylist()]
    day = pa.array([d.strftime("%Y-%m-%d") for d in starts], pa.string()).take(hours.indices)
    hour = pa.array([d.hour if by_hour else None for d in starts], pa.int8()).take(hours.indices)
    return day, hour


def values_of(table: pa.Table, column: str = "value", rows: int = 1024) -> Iterator[bytes | None]:
    """The record values (or keys) as Python bytes, a slice at a time (not all of a chunk's copied at once)."""
    for offset in range(0, table.num_rows, rows):
        yield from table.column(column).slice(offset, rows).to_pylist()


KEY_HEADER_BYTES = 64
"""What ``Parser.prepare_keys`` sees of each key: a Schema Registry header and a Protobuf message-index array."""
MAX_LABEL_VALUE_BYTES = 2048
"""A label value is kept in the block's metadata and the metastore's index: a record whose label is longer is
quarantined with the reason (a few megabyte values would make a commit larger than the metastore takes)."""


def _field_problem(fields: dict[str, Any], columns: dict[str, list[Any]], labels: list[str],
                   typed: bool = False) -> str | None:
    """Why a parser's fields cannot be stored in its columns (string columns, unless the parser is typed), or
    None. Labels are strings whatever the parser."""
    for name in labels if typed else columns:
        value = fields.get(name)
        if value is not None and not isinstance(value, str):
            return f"column {name!r}: the parser gave a {type(value).__name__}, not a string"
    for name in labels:
        value = fields.get(name)
        if value is not None and len(value) * 4 > MAX_LABEL_VALUE_BYTES \
                and len(value.encode("utf-8", "surrogatepass")) > MAX_LABEL_VALUE_BYTES:
            return (f"label {name!r} is {len(value.encode('utf-8', 'surrogatepass'))} bytes, over the "
                    f"{MAX_LABEL_VALUE_BYTES}-byte limit of a label value")
    return None


_STR_OR_NONE = frozenset({str, type(None)})


def _field_problems(columns: dict[str, list[Any]], labels: list[str], typed: bool) -> dict[int, str]:
    """The rows (positions) whose fields ``_field_problem`` refuses, with the reason. Checked a column at a time at
    C speed (the types seen, the longest label); only a column that fails is looked at row by row."""
    must_be_str = [n for n in (labels if typed else columns) if n in columns]
    suspect = [n for n in must_be_str if not set(map(type, columns[n])) <= _STR_OR_NONE]
    suspect += [n for n in labels if n in columns and n not in suspect
                and max(map(len, filter(None, columns[n])), default=0) * 4 > MAX_LABEL_VALUE_BYTES]
    if not suspect:
        return {}
    bad: dict[int, str] = {}
    for k in range(len(next(iter(columns.values())))):
        problem = _field_problem({n: columns[n][k] for n in columns}, columns, labels, typed)
        if problem is not None:
            bad[k] = problem
    return bad


def _unstorable(columns: dict[str, list[Any]], types: dict[str, pa.DataType]) -> dict[int, str]:
    """The rows (positions) whose values cannot be stored in their columns' types, with the reason: strings that
    are not valid Unicode; for a typed parser, a value its Arrow type does not hold (a decimal past its
    precision)."""
    bad: dict[int, str] = {}
    for name, values in columns.items():
        for k, value in enumerate(values):
            if k in bad or value is None:
                continue
            if isinstance(value, str):
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError as exc:
                    bad[k] = f"column {name!r} is not valid Unicode ({exc.reason} at position {exc.start})"
                    continue
            if types[name] != pa.string() or not isinstance(value, str):  # a non-string must not fail the chunk
                try:
                    pa.array([value], types[name])
                except (pa.ArrowException, ValueError, TypeError, OverflowError, UnicodeEncodeError) as exc:
                    bad[k] = f"column {name!r}: the value does not fit {types[name]}: {exc}"[:1000]
    return bad


def _fraction_into_integer(value: Any, arrow_type: pa.DataType) -> bool:
    """Whether Arrow would store ``value`` in ``arrow_type`` by dropping a fraction: ``pa.array([1.5], pa.int32())``
    stores 1, silently, for a float anywhere an integer type is (nested ones included)."""
    if value is None:
        return False
    if pa.types.is_integer(arrow_type):
        return isinstance(value, float) and not value.is_integer()
    if pa.types.is_struct(arrow_type) and isinstance(value, dict):
        return any(_fraction_into_integer(value.get(f.name), f.type) for f in arrow_type)
    if pa.types.is_map(arrow_type) and isinstance(value, list | tuple | dict):
        pairs = value.items() if isinstance(value, dict) else value
        return any(isinstance(pair, tuple | list) and len(pair) == 2 and (
            _fraction_into_integer(pair[0], arrow_type.key_type) or _fraction_into_integer(pair[1],
                                                                                           arrow_type.item_type))
            for pair in pairs)
    if (pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type)) and isinstance(value, list | tuple):
        return any(_fraction_into_integer(v, arrow_type.value_type) for v in value)
    return False


def _has_integers(arrow_type: pa.DataType) -> bool:
    if pa.types.is_integer(arrow_type):
        return True
    return any(_has_integers(arrow_type.field(i).type) for i in range(arrow_type.num_fields))


def _truncated(columns: dict[str, list[Any]], types: dict[str, pa.DataType]) -> dict[int, str]:
    """The rows (positions) holding a fraction where their column's type has an integer: quarantined with the
    reason, never stored as a different number (a rule over every parser, whatever its own checks)."""
    bad: dict[int, str] = {}
    for name, values in columns.items():
        if not _has_integers(types[name]):
            continue
        if pa.types.is_integer(types[name]) and float not in set(map(type, values)):
            continue  # a flat integer column without a float: checked at C speed, as _field_problems does
        for k, value in enumerate(values):
            if k not in bad and _fraction_into_integer(value, types[name]):
                bad[k] = f"column {name!r}: {value!r} has a fraction, which {types[name]} cannot hold"[:1000]
    return bad


def field_problems(columns: dict[str, list[Any]], labels: list[str],
                   types: dict[str, pa.DataType]) -> dict[int, str]:
    """The rows (positions) a typed parser's values may not be stored in: a label that is not a string or is too
    long, a fraction where the column's type has an integer (the checks the per-record path makes, for a batch
    path that gathers a typed parser's values itself)."""
    bad = _field_problems(columns, labels, True) if columns else {}
    bad.update({k: v for k, v in _truncated(columns, types).items() if k not in bad})
    return bad


def _drop(bad: dict[int, str], rejected: list[tuple[int, str]], good: list[int], times: list[int],
          columns: dict[str, list[Any]]) -> tuple[list[tuple[int, str]], list[int], list[int], dict[str, list[Any]]]:
    """The parsed rows without the ``bad`` ones (positions among them), which join the rejected with their reason."""
    rejected = sorted([*rejected, *((good[k], reason) for k, reason in bad.items())])
    keep = [k for k in range(len(good)) if k not in bad]
    return rejected, [good[k] for k in keep], [times[k] for k in keep], {n: [v[k] for k in keep]
                                                                          for n, v in columns.items()}


def parse_records(parser: Parser | str, table: pa.Table, latest_ms: int,
                  by_hour: bool) -> tuple[pa.Table, list[int], list[tuple[int, str]], Parser | None]:
    """The records of ``table`` (Kafka records, the backup schema) parsed: a table of the parsed ones (their Kafka
    columns, event_time, dt, hour and the parser's typed columns), their row indexes in ``table``, the (row, reason)
    of every rejected record, and the parser (None when ``parser`` is the reason there is none). The parser's batch
    path (``Parser.parse_batch``) reads what it can in native code; every other record goes through ``parse``."""
    if isinstance(parser, str):
        return pa.table({}), [], [(i, parser) for i in range(table.num_rows)], None
    if table.num_rows:
        heads = pc.binary_slice(table.column("value"), 0, parser.header_bytes).to_pylist()
        parser.prepare(heads)  # RetryableError: retry the batch
        if parser.decodes_keys:
            parser.prepare_keys(pc.binary_slice(table.column("key"), 0, KEY_HEADER_BYTES).to_pylist())
    types = {**parser.columns(), **parser.key_columns()}
    per_ms = 1000 if parser.time_unit == "us" else 1
    batch = _batch(parser, table, latest_ms * per_ms, types) if table.num_rows and not parser.decodes_keys else None
    if batch is None or len(batch.rows) == 0:
        good, times, arrays, rejected = _parse_records(parser, table, latest_ms, types)
        times_array = pa.array(times, pa.int64())
    elif len(batch.rows) == table.num_rows:  # every record read at once (the rows are ascending)
        good, rejected, times_array = list(range(table.num_rows)), [], batch.times.cast(pa.int64())
        arrays = {name: batch.columns[name].cast(types[name]) for name in types}
    else:
        rest = _rest(batch.rows, table.num_rows)
        good, times, arrays, rejected = _parse_records(parser, table.take(rest), latest_ms, types)
        origin = rest.to_pylist()
        good = [origin[g] for g in good]
        rejected = [(origin[r], why) for r, why in rejected]
        rows = pa.concat_arrays([batch.rows, pa.array(good, pa.int64())])
        order = pc.sort_indices(rows)
        times_array = pa.concat_arrays([batch.times.cast(pa.int64()), pa.array(times, pa.int64())]).take(order)
        arrays = {name: pa.concat_arrays([batch.columns[name].cast(types[name]), arrays[name]]).take(order)
                  for name in types}
        good = rows.take(order).to_pylist()
    # Usually every record parses: no copy.
    base = table if len(good) == table.num_rows else table.take(pa.array(good, pa.int64()))
    micros = pc.multiply(times_array, 1000 // per_ms)  # the parser's unit to microseconds
    day, hour = hour_partitions(micros, by_hour)
    out = pa.table({
        **{f.name: base.column(f.name) for f in KAFKA_FIELDS},
        "event_time": micros.cast(TIMESTAMP),
        "dt": day,
        "hour": hour,
        **arrays,
    })
    return out.cast(pa.schema([*PARTITION_BASE_FIELDS, *(pa.field(n, t) for n, t in types.items())])), \
        good, rejected, parser


def _rest(rows: pa.Array, n: int) -> pa.Array:
    """The rows of ``range(n)`` not in ``rows``."""
    left = np.ones(n, np.bool_)
    left[rows.to_numpy()] = False
    return pa.array(np.flatnonzero(left), pa.int64())


def _batch(parser: Parser, table: pa.Table, latest: int, types: dict[str, pa.DataType]) -> BatchParse | None:
    """The records the parser's batch path read, less those the encoder's rules would quarantine or that are not
    of their column's type: those go through ``parse``, whose reasons are the record's (a label over
    ``MAX_LABEL_VALUE_BYTES``, an event time outside [0, ``latest``])."""
    batch = parser.parse_batch(table.column("value"))
    if batch is None or len(batch.rows) == 0:
        return batch
    if set(batch.columns) != set(types) or any(not batch.columns[n].type.equals(t) for n, t in types.items()):
        return None  # a parser's batch that is not its declared columns: every record through ``parse``
    keep = pc.and_(pc.greater_equal(batch.times, 0), pc.less_equal(batch.times, latest))
    for name in parser.labels():
        keep = pc.and_(keep, pc.fill_null(pc.less_equal(pc.binary_length(batch.columns[name]),
                                                         MAX_LABEL_VALUE_BYTES), True))
    keep = pc.fill_null(keep, False)
    if pc.all(keep).as_py():
        return batch
    return BatchParse(batch.rows.filter(keep), batch.times.filter(keep),
                      {n: c.filter(keep) for n, c in batch.columns.items()})


def _parse_records(parser: Parser, table: pa.Table, latest_ms: int, types: dict[str, pa.DataType]) -> tuple[
        list[int], list[int], dict[str, pa.Array], list[tuple[int, str]]]:
    """The per-record path: each record through ``parse``; the parsed rows, their times, columns and the
    rejected (row, reason)."""
    stamps = table.column("timestamp").cast(TIMESTAMP_MS, safe=False).cast(pa.int64()).to_pylist()
    keys = values_of(table, "key") if parser.decodes_keys else itertools.repeat(None, table.num_rows)
    good: list[int] = []
    times: list[int] = []
    columns: dict[str, list[Any]] = {name: [] for name in types}
    parsed: list[dict[str, Any]] = []  # the last few records' fields, moved into ``columns`` a thousand at a time

    def to_columns() -> None:
        for name, values_of in columns.items():
            values_of.extend([fields.get(name) for fields in parsed])
        parsed.clear()

    rejected: list[tuple[int, str]] = []
    labels = parser.labels()
    per_ms = 1000 if parser.time_unit == "us" else 1
    decodes_keys, parse, latest = parser.decodes_keys, parser.parse, latest_ms * per_ms
    for i, (value, stamp, key) in enumerate(zip(values_of(table), stamps, keys, strict=True)):
        try:
            event_time, fields = parse(value, stamp)
            if decodes_keys:
                fields = {**fields, **parser.parse_key(key)}
        except ParseError as exc:
            rejected.append((i, exc.reason))
            continue
        except (ValueError, OverflowError, OSError) as exc:  # a Kafka time no calendar holds, for example
            rejected.append((i, f"the record's time cannot be read ({exc}); Kafka timestamp {stamp}"))
            continue
        except Exception as exc:  # a parser's bug on one record quarantines it, never the group
            rejected.append((i, f"parser {parser.name} failed on this record: {type(exc).__name__}: {exc}"[:1000]))
            continue
        if not isinstance(event_time, int) or not 0 <= event_time <= latest:
            shown = event_time // per_ms if isinstance(event_time, int) else repr(event_time)
            rejected.append((i, f"event time {shown} ms is outside [1970-01-01, read time + 1 day]"))
            continue
        good.append(i)
        times.append(event_time)
        parsed.append(fields)
        if len(parsed) >= 1024:
            to_columns()
    to_columns()
    bad = _field_problems(columns, labels, parser.typed) if columns else {}
    bad.update({k: v for k, v in _truncated(columns, types).items() if k not in bad})
    if bad:
        rejected, good, times, columns = _drop(bad, rejected, good, times, columns)
    try:
        arrays = {name: pa.array(vals, types[name]) for name, vals in columns.items()}
    except (UnicodeEncodeError, pa.ArrowException, ValueError, TypeError, OverflowError):
        # A lone surrogate (JSON allows "\ud800"), or a typed value its column cannot hold.
        rejected, good, times, columns = _drop(_unstorable(columns, types), rejected, good, times, columns)
        arrays = {name: pa.array(vals, types[name]) for name, vals in columns.items()}
    return good, times, arrays, rejected
