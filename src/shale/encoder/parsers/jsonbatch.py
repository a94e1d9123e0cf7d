"""The ``json`` parser's batch path: a chunk's documents decoded by orjson in one loop, then each column gathered,
checked and converted to Arrow a column at a time (C-level list passes and Arrow kernels), never record by record
through ``parse``'s per-field logic. It gives the columns ``JsonTimestampParser.parse`` gives record by record.

Exact by construction: the documents are decoded by the same reader ``parse`` tries first (orjson), and a record is
read here only when every value its columns take is one ``parse`` would store as orjson gave it. Left to ``parse``
(which decides it exactly: stores it, or quarantines it with its reason):

* a value orjson refuses (Python's ``json`` then decides: NaN, a byte-order mark, UTF-16, lone surrogates), a
  null value, or a document that is not an object;
* a column's value of another type than the column takes as it is: a string column takes strings (a number, a
  list or an object is written as JSON text by ``parse``, after reading its numbers exactly), a ``long`` an integer
  in 64 bits, a ``boolean`` a boolean; a string no UTF-8 holds (a lone surrogate);
* a missing time, an epoch time that is not an integer (``parse`` rounds fractions and reads numeric strings), and
  an ISO 8601 time not in the form Arrow's cast and Python's ``fromisoformat`` read alike (``AWARE``, and
  ``NAIVE`` when the zone is UTC).

Declared types read here: string, long and boolean; a ``double``, ``decimal`` or ``timestamp`` column, or a
strftime time format, sends the whole configuration to ``parse``. Arrow's JSON reader (RapidJSON) was measured
against this and lost on 1 KB values (docs/design/schemas.md, "The parsing seam").
"""

from __future__ import annotations

import datetime as dt
import itertools
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from shale.encoder.parsers.base import BatchParse

SIMPLE_TYPES = {"string": pa.string(), "long": pa.int64(), "boolean": pa.bool_()}
TAKES: dict[str, frozenset[type]] = {"string": frozenset({str, type(None)}), "long": frozenset({int, type(None)}),
                                     "boolean": frozenset({bool, type(None)})}
"""The Python types of the values a column of each declared type takes as orjson gave them (``type(x)``: a bool
is not an int)."""
EPOCH_UNITS = {"epoch_ms": 1000, "epoch_s": 1_000_000, "epoch_us": 1}
MAX_EPOCH = 2**53
"""Epoch times above this (in any unit) are left to ``parse`` (no event time near now is; no overflow here)."""
_CLOCK = r"\d{4}-\d\d-\d\d[T ](?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d{1,6})?"
AWARE = "^" + _CLOCK + r"(?:Z|[+-](?:[01]\d|2[0-3]):[0-5]\d)$"
"""ISO 8601 times with a zone that Arrow's cast and Python's ``fromisoformat`` read alike."""
NAIVE = "^" + _CLOCK + "$"
TIME_US = pa.timestamp("us")
TIME_UTC_US = pa.timestamp("us", "UTC")
_EMPTY: dict[str, Any] = {}


@dataclass(frozen=True)
class JsonBatch:
    """How a ``json`` parser's configuration reads a chunk at once (``plan`` says whether it can)."""

    time_path: list[str]
    epoch_unit: int | None
    """Microseconds per unit of an epoch time; None for ISO 8601."""
    utc: bool
    columns: dict[str, list[str]]
    declared: dict[str, str]
    """Each column's declared type name (string, long or boolean)."""

    @classmethod
    def plan(cls, time_path: list[str], time_format: str, utc: bool, columns: dict[str, list[str]],
             declared: dict[str, str]) -> JsonBatch | None:
        """The batch reading of this configuration, or None when it is read record by record."""
        if time_format != "iso8601" and time_format not in EPOCH_UNITS:
            return None
        if any(name not in SIMPLE_TYPES for name in declared.values()):
            return None
        return cls(time_path, EPOCH_UNITS.get(time_format), utc, columns,
                   {name: declared.get(name, "string") for name in columns})

    def read(self, values: pa.Array) -> BatchParse:
        """The records of ``values`` (binary) this path reads; those left out go to ``parse``."""
        documents = _documents(values.to_pylist())
        if {dict}.issuperset(map(type, documents)):
            keep = [True] * len(documents)
        else:
            keep = [type(d) is dict for d in documents]
            documents = [d if type(d) is dict else _EMPTY for d in documents]
        columns = {}
        for name, path in self.columns.items():
            kind = self.declared[name]
            columns[name] = _checked(_gather(documents, path), kind, SIMPLE_TYPES[kind], keep)
        raw = _gather(documents, self.time_path)
        if self.epoch_unit is not None:
            fits = [type(t) is int and 0 <= t <= MAX_EPOCH for t in raw]
            keep = [k and f for k, f in zip(keep, fits, strict=True)]
            times = pc.multiply(pa.array([t if f else None for t, f in zip(raw, fits, strict=True)], pa.int64()),
                                self.epoch_unit)
        else:
            text = _checked(raw, "string", pa.string(), keep)
            aware = pc.fill_null(pc.match_substring_regex(text, AWARE), False)
            naive = pc.fill_null(pc.match_substring_regex(text, NAIVE), False) if self.utc else pc.and_(aware, False)
            try:
                times = _iso_times(text, aware, naive)
            except pa.ArrowInvalid:  # a day no calendar has (2023-02-29): those times are left to ``parse``
                real = pa.array([_is_date(t) for t in text.to_pylist()], pa.bool_())
                aware, naive = pc.and_(aware, real), pc.and_(naive, real)
                times = _iso_times(text, aware, naive)
            keep = [k and t for k, t in zip(keep, pc.or_(aware, naive).to_pylist(), strict=True)]
        rows = pc.indices_nonzero(pa.array(keep, pa.bool_())).cast(pa.int64())
        return BatchParse(rows, times.take(rows), {name: column.take(rows) for name, column in columns.items()})


def _iso_times(text: pa.Array, aware: pa.Array, naive: pa.Array) -> pa.Array:
    """Microseconds of the ``aware`` and the ``naive`` (UTC) times of ``text``; null elsewhere."""
    return pc.coalesce(pc.cast(pc.if_else(aware, text, None), TIME_UTC_US).cast(pa.int64()),
                       pc.cast(pc.if_else(naive, text, None), TIME_US).cast(pa.int64()))


def _is_date(text: str | None) -> bool:
    try:
        dt.date.fromisoformat((text or "")[:10])
    except ValueError:
        return False
    return True


def _documents(texts: list[bytes | None]) -> list[Any]:
    """Each value as orjson reads it; None where it refuses one (``parse`` then reads it with ``json``)."""
    loads, out = orjson.loads, []
    try:
        return list(map(loads, texts))  # type: ignore[arg-type]  # a None: TypeError, read one by one below
    except (orjson.JSONDecodeError, TypeError):
        pass
    for text in texts:
        try:
            out.append(loads(text))  # type: ignore[arg-type]  # None: TypeError, left to ``parse``
        except (orjson.JSONDecodeError, TypeError):
            out.append(None)
    return out


def _gather(documents: list[dict[str, Any]], path: list[str]) -> list[Any]:
    """Every document's value at a dot path (None where it is missing, or a value on the way is not an object)."""
    if len(path) == 1:
        return list(map(dict.get, documents, itertools.repeat(path[0])))
    out = []
    for document in documents:
        node: Any = document
        for part in path:
            if type(node) is not dict:
                node = None
                break
            node = node.get(part)
        out.append(node)
    return out


def _checked(values: list[Any], kind: str, arrow_type: pa.DataType, keep: list[bool]) -> pa.Array:
    """``values`` as a column of ``arrow_type``; where one is not a value the column takes as it is, its record is
    left out (``keep`` set false, in place) and the column holds a null."""
    takes = TAKES[kind]
    if takes.issuperset(map(type, values)):
        try:
            return pa.array(values, arrow_type)
        except (pa.ArrowException, OverflowError, UnicodeEncodeError, ValueError):
            pass  # an integer beyond 64 bits, a lone surrogate: found one by one below
    out = []
    for i, value in enumerate(values):
        taken = type(value) in takes and _fits(value, arrow_type)
        keep[i] = keep[i] and taken
        out.append(value if taken else None)
    return pa.array(out, arrow_type)


def _fits(value: Any, arrow_type: pa.DataType) -> bool:
    if value is None:
        return True
    if arrow_type == pa.int64():
        return bool(-2**63 <= value < 2**63)
    if arrow_type == pa.string():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False
    return True
