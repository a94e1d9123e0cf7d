"""The ``json`` parser's batch path: a chunk's values read by Arrow's JSON reader (RapidJSON, in C++) in one pass,
into the same columns ``JsonTimestampParser.parse`` gives record by record.

The reader is trusted only where it cannot give another value than the per-record path (Python's ``json``, through
orjson): a record it might read differently is left to ``parse``, which decides it exactly (stores or quarantines
it with its reason). Left to ``parse``, by rule:

* a value that is null, empty, all blanks, holds a line break (the values are read as lines), starts with a
  byte-order mark, or has more than ``MAX_BRACKETS`` brackets (RapidJSON reads any depth; Python refuses past
  about a thousand levels);
* every record of a piece the reader refuses: invalid JSON or UTF-8, a value that is not an object, a key given twice
  on a path the columns read, a column's value of another JSON type than its column's (a number in a string
  column: ``parse`` writes its JSON text), an integer beyond 64 bits, a lone surrogate; the piece is split in
  halves, down to ``MIN_PIECE`` records, so that one hostile record does not send its chunk to ``parse``;
* a missing time, and an ISO 8601 time not in the form both readers read alike (``AWARE``; ``NAIVE`` when the
  zone is UTC).

Declared types the batch reads: string, long and boolean (a double or a decimal needs its literal's text, a timestamp
Python's ISO reading: such a configuration is read record by record). A time format other than ISO 8601 and the
epochs, and a path that is a prefix of another (``a`` and ``a.b``) are read record by record too.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from shale.encoder.parsers.base import BatchParse

MAX_BRACKETS = 256
"""A value with more opening brackets than this may nest deeper than Python reads: left to ``parse``."""
MIN_PIECE = 32
"""The smallest piece of a chunk read again after the reader refused a larger one; below it, ``parse``."""
SIMPLE_TYPES = {"string": pa.string(), "long": pa.int64(), "boolean": pa.bool_()}
EPOCH_UNITS = {"epoch_ms": 1000, "epoch_s": 1_000_000, "epoch_us": 1}
_LEFT = r"[\n\r]|^[ \t]*$|^\xef\xbb\xbf"
_CLOCK = r"\d{4}-\d\d-\d\d[T ](?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d{1,6})?"
AWARE = "^" + _CLOCK + r"(?:Z|[+-](?:[01]\d|2[0-3]):[0-5]\d)$"
"""ISO 8601 times with a zone that Arrow's cast and Python's ``fromisoformat`` read alike."""
NAIVE = "^" + _CLOCK + "$"
TIME_US = pa.timestamp("us")
TIME_UTC_US = pa.timestamp("us", "UTC")


class RefusedError(Exception):
    """The reader refused a piece, or read it otherwise than as one row per value."""


@dataclass(frozen=True)
class JsonBatch:
    """How a ``json`` parser's configuration reads a chunk in one pass (``plan`` says whether it can)."""

    schema: pa.Schema
    time_path: list[str]
    epoch_unit: int | None
    """Microseconds per unit of an epoch time; None for ISO 8601."""
    utc: bool
    columns: dict[str, list[str]]

    @classmethod
    def plan(cls, time_path: list[str], time_format: str, utc: bool, columns: dict[str, list[str]],
             declared: dict[str, str]) -> JsonBatch | None:
        """The batch reading of this configuration, or None when it is read record by record."""
        if time_format != "iso8601" and time_format not in EPOCH_UNITS:
            return None
        if any(name not in SIMPLE_TYPES for name in declared.values()):
            return None
        wanted: dict[tuple[str, ...], pa.DataType] = {
            tuple(path): SIMPLE_TYPES[declared.get(name, "string")] for name, path in columns.items()}
        time_type = pa.string() if time_format == "iso8601" else pa.int64()
        if wanted.setdefault(tuple(time_path), time_type) != time_type:
            return None  # the time field is also a column of another type
        paths = sorted(wanted)
        if any(b[:len(a)] == a for a, b in itertools.pairwise(paths)):
            return None  # ``a`` and ``a.b``: a value and an object at once
        return cls(_schema(wanted), time_path, EPOCH_UNITS.get(time_format), utc, columns)

    def read(self, values: pa.Array) -> BatchParse:
        """The records of ``values`` (binary) read in pieces; those left out go to ``parse``."""
        values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
        brackets = pc.add(pc.count_substring(values, "["), pc.count_substring(values, "{"))
        simple = pc.and_(pc.invert(pc.match_substring_regex(values, _LEFT)),
                         pc.less_equal(brackets, MAX_BRACKETS))
        rows = pc.indices_nonzero(pc.fill_null(simple, False)).cast(pa.int64())
        parts: list[BatchParse] = []
        self._read_pieces(values, rows, parts)
        if not parts:
            return BatchParse(pa.array([], pa.int64()), pa.array([], pa.int64()),
                              {name: pa.array([], self._type(path)) for name, path in self.columns.items()})
        return BatchParse(pa.concat_arrays([p.rows for p in parts]), pa.concat_arrays([p.times for p in parts]),
                          {name: pa.concat_arrays([p.columns[name] for p in parts]) for name in self.columns})

    def _type(self, path: list[str]) -> pa.DataType:
        node: Any = self.schema.field(path[0]).type
        for part in path[1:]:
            node = node.field(part).type
        return node

    def _read_pieces(self, values: pa.Array, rows: pa.Array, parts: list[BatchParse]) -> None:
        if len(rows) == 0:
            return
        try:
            parts.append(self._read(values.take(rows), rows))
        except (RefusedError, pa.ArrowException):
            if len(rows) < 2 * MIN_PIECE:
                return  # every record of the piece to ``parse``
            half = len(rows) // 2
            self._read_pieces(values, rows.slice(0, half), parts)
            self._read_pieces(values, rows.slice(half), parts)

    def _read(self, piece: pa.Array, rows: pa.Array) -> BatchParse:
        """One piece read; raises when the reader refuses any of it."""
        piece.cast(pa.string())  # invalid UTF-8 anywhere (the reader skips it in fields no column reads)
        lines = pc.binary_join_element_wise(piece, pa.scalar(b"", pa.binary()), pa.scalar(b"\n", pa.binary()))
        offsets = np.frombuffer(lines.buffers()[1], np.int32)
        start, end = int(offsets[lines.offset]), int(offsets[lines.offset + len(lines)])
        buffer = lines.buffers()[2].slice(start, end - start)
        longest = pc.max(pc.binary_length(piece)).as_py() or 0
        table = pj.read_json(pa.BufferReader(buffer),
                             read_options=pj.ReadOptions(use_threads=False, block_size=max(1 << 20, 2 * longest + 2)),
                             parse_options=pj.ParseOptions(explicit_schema=self.schema,
                                                           unexpected_field_behavior="ignore"))
        if table.num_rows != len(piece):
            raise RefusedError(f"{table.num_rows} rows from {len(piece)} values")
        batch = table.to_struct_array() if table.num_rows else pa.array([], pa.struct(list(self.schema)))
        if isinstance(batch, pa.ChunkedArray):
            batch = batch.combine_chunks()
        raw = _field(batch, self.time_path)
        if self.epoch_unit is not None:
            known = pc.is_valid(raw)
            times = pc.multiply_checked(raw, self.epoch_unit)
        else:
            aware = pc.fill_null(pc.match_substring_regex(raw, AWARE), False)
            naive = pc.fill_null(pc.match_substring_regex(raw, NAIVE), False) if self.utc else pc.and_(aware, False)
            known = pc.or_(aware, naive)
            times = pc.coalesce(pc.cast(pc.if_else(aware, raw, None), TIME_UTC_US).cast(pa.int64()),
                                pc.cast(pc.if_else(naive, raw, None), TIME_US).cast(pa.int64()))
        keep = pc.indices_nonzero(known)
        return BatchParse(rows.take(keep), times.take(keep),
                          {name: _field(batch, path).take(keep) for name, path in self.columns.items()})


def _field(batch: pa.StructArray, path: list[str]) -> pa.Array:
    """A column at a dot path: null wherever a struct on the way is."""
    node: pa.Array = batch
    for part in path:
        node = pc.struct_field(node, part)
    return node


def _schema(wanted: dict[tuple[str, ...], pa.DataType]) -> pa.Schema:
    tree: dict[str, Any] = {}
    for path, arrow_type in wanted.items():
        node = tree
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = arrow_type

    def build(node: dict[str, Any]) -> list[pa.Field]:
        return [pa.field(k, pa.struct(build(v)) if isinstance(v, dict) else v) for k, v in node.items()]

    return pa.schema(build(tree))
