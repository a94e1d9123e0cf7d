"""A history as the view's columns: per stored version its topic, key, scope, offset, times, kind and row, as numpy
arrays. An upsert topic keyed by its record key is read by Arrow kernels alone (a dictionary encoding of the keys,
a null test of the values), and so are a key column of integers, strings or bytes and the ``op`` and ``source``
columns a registry parser keeps of a Debezium envelope; the JSON converter's envelopes (the op inside the value),
quarantined Debezium records and key columns of other types are read record by record (the slow path: JSON
documents, nested values and floats)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from shale.changes.envelope import Kind, Meaning, of_debezium_value, of_op
from shale.errors import ShaleError

TableMode = Literal["append", "upsert", "debezium"]
INCARNATION = "_incarnation"
"""The column of both history tables holding each row's incarnation (an ``IncarnationCodes`` code; a negative code
is a row whose block cannot tell its incarnation)."""
KINDS: tuple[Kind, ...] = ("row", "delete", "truncate", "skip", "withheld")
ROW, DELETE, TRUNCATE, SKIP, WITHHELD = range(len(KINDS))


@dataclass(frozen=True)
class TableRule:
    """A topic's change-table rule: its mode and its key ('' = the Kafka record key, or a column path)."""

    mode: TableMode
    key: str = ""


@dataclass
class History:
    """The versions of ``rows`` (indices below ``len(rows)``) then of the quarantined records."""

    topics: list[str]
    topic: np.ndarray
    key: np.ndarray
    """A key's id per version (-1: no key)."""
    partition: np.ndarray
    incarnation: np.ndarray
    offset: np.ndarray
    kafka_ms: np.ndarray
    change_ms: np.ndarray
    kind: np.ndarray
    rows: int = 0
    quarantine_reasons: pa.ChunkedArray | None = None
    reasons: dict[int, str] = field(default_factory=dict)
    """Why a version is withheld, by its index, where its envelope says (else its quarantine reason)."""

    def where(self, i: int) -> str:
        return f"topic {self.topics[self.topic[i]]} partition {self.partition[i]} offset {self.offset[i]}"

    def reason(self, i: int) -> str:
        if i in self.reasons:
            return self.reasons[i]
        if i >= self.rows and self.quarantine_reasons is not None:
            return f"quarantined: {self.quarantine_reasons[i - self.rows].as_py()}"
        return "withheld"


def _hashable(value: Any) -> Any:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS) if isinstance(value, dict | list) else value


def key_column(rows: pa.Table, path: str) -> list[Any]:
    """The values of a key column path: the column of that name with dots as underscores (the json parser's name
    for a dot path), or a struct column's field (``after.id``)."""
    flat = path.replace(".", "_")
    if flat in rows.column_names:
        return [_hashable(v) for v in rows.column(flat).to_pylist()]
    head, *rest = path.split(".")
    if head not in rows.column_names:
        raise ShaleError(f"the change table's key {path!r} names no column of its rows ({', '.join(rows.column_names)})"
                         ": fix key in the topic's ingest.parsers rule")
    values = []
    for top in rows.column(head).to_pylist():
        value = top
        for part in rest:
            value = value.get(part) if isinstance(value, dict) else None
        values.append(_hashable(value))
    return values


def both(rows: pa.Table, quarantined: pa.Table, name: str) -> pa.Array:
    return pa.chunked_array(rows.column(name).chunks + quarantined.column(name).chunks,
                            rows.schema.field(name).type).combine_chunks()


def _ints(array: pa.Array) -> np.ndarray:
    return np.asarray(array.cast(pa.int64()).to_numpy(zero_copy_only=False), dtype=np.int64)


OPS = pa.array(["c", "u", "r", "d", "t", "m"])
OP_KINDS = np.array([ROW, ROW, ROW, DELETE, TRUNCATE, SKIP])
"""``envelope.of_op``'s kinds of the known ops, for the rows whose parser kept an ``op`` column."""


def _debezium_columns(history: History, rows: pa.Table, at: np.ndarray) -> np.ndarray:
    """The meaning of the rows among ``at`` whose ``op`` column holds a known op, by Arrow kernels (their source
    time from a ``source`` struct's integer ``ts_ms``, as ``of_op`` reads it); the indices left for ``_debezium``."""
    n = rows.num_rows
    if "op" not in rows.column_names or not pa.types.is_string(rows.schema.field("op").type):
        return at
    code = _ints(pc.fill_null(pc.index_in(rows.column("op"), value_set=OPS), -1))
    in_rows = at[at < n]
    known = in_rows[code[in_rows] >= 0]
    history.kind[known] = OP_KINDS[code[known]]
    source = rows.schema.field("source").type if "source" in rows.column_names else None
    if isinstance(source, pa.StructType) and source.get_field_index("ts_ms") >= 0 \
            and pa.types.is_integer(source.field("ts_ms").type):
        ts = pc.struct_field(rows.column("source"), "ts_ms")
        ms = _ints(pc.fill_null(ts, 0))
        said = np.asarray(ts.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        with_time = known[said[known]]
        history.change_ms[with_time] = ms[with_time]
    return np.setdiff1d(at, known, assume_unique=True)


def _debezium(history: History, rows: pa.Table, quarantined: pa.Table, values: pa.Array, at: np.ndarray) -> None:
    """Each Debezium version's meaning (``at``: their indices): from the ``op`` and ``source`` columns when the
    parser kept them, else from the value's JSON; a quarantined record that would be a row is withheld."""
    n = rows.num_rows
    ops = rows.column("op").to_pylist() if "op" in rows.column_names else None
    sources = rows.column("source").to_pylist() if "source" in rows.column_names else None
    for i, value in zip(at.tolist(), values.take(pa.array(at, pa.int64())).to_pylist(), strict=True):
        meaning: Meaning
        if i < n and ops is not None and ops[i] is not None:
            source = sources[i] if sources is not None else None
            meaning = of_op(ops[i], source if isinstance(source, dict) else None)
        else:
            meaning = of_debezium_value(value)
        kind = meaning.kind
        if i >= n and kind in ("row", "withheld"):
            kind, meaning = "withheld", Meaning("withheld", meaning.source_ms)  # its quarantine reason says why
        history.kind[i] = KINDS.index(kind)
        if meaning.source_ms is not None:
            history.change_ms[i] = meaning.source_ms
        if meaning.reason:
            history.reasons[i] = meaning.reason


def _column_key_array(rows: pa.Table, path: str) -> pa.ChunkedArray | None:
    """A key column path's values as Arrow values, for the kernels: the column of that name with dots as
    underscores, or a field of nested struct columns (a null struct gives a null key, as ``key_column`` reads it);
    None where ``key_column`` must read it record by record (another shape, or a type whose Python values compare
    otherwise than Arrow's: floats' NaN and -0.0, nested values as JSON)."""
    flat = path.replace(".", "_")
    if flat in rows.column_names:
        column = rows.column(flat)
    else:
        head, *rest = path.split(".")
        if head not in rows.column_names:
            return None
        column = rows.column(head)
        for part in rest:
            if not isinstance(column.type, pa.StructType) or column.type.get_field_index(part) < 0:
                return None
            column = pc.struct_field(column, part)
    plain = (pa.types.is_integer, pa.types.is_string, pa.types.is_large_string, pa.types.is_binary,
             pa.types.is_large_binary)
    return column if any(kind(column.type) for kind in plain) else None


def _column_keys(history: History, rows: pa.Table, record_key: np.ndarray, at: np.ndarray, path: str,
                 next_id: int) -> int:
    """Keys of a column-keyed topic's versions (``at``, ascending); a quarantined record (a tombstone has no
    columns) takes the column key of the last row its record key (``record_key``: a record key's id, -1 for none)
    named. The key ids from ``next_id`` on; returns the next free one."""
    n = rows.num_rows
    in_rows = at[at < n]
    array = _column_key_array(rows, path)
    if array is None:
        return _column_keys_by_record(history, rows, record_key, at, path, next_id)
    encoded = array.take(pa.array(in_rows, pa.int64())).combine_chunks().dictionary_encode()
    row_code = _ints(pc.fill_null(encoded.indices, -1))
    last = np.full(int(record_key.max(initial=-1)) + 2, -1, dtype=np.int64)  # per record key (+1): its last row
    np.maximum.at(last, record_key[in_rows] + 1, np.arange(len(in_rows)))
    named = last[record_key[at[len(in_rows):]] + 1]  # -1 (none): the -1 appended below
    code = np.concatenate([row_code, np.append(row_code, -1)[named]])
    history.key[at] = np.where(code < 0, -1, next_id + code)
    return next_id + len(encoded.dictionary)


def _column_keys_by_record(history: History, rows: pa.Table, record_key: np.ndarray, at: np.ndarray, path: str,
                           next_id: int) -> int:
    """``_column_keys`` record by record, for the key columns the kernels do not read."""
    n = rows.num_rows
    values = key_column(rows, path)
    named: dict[int, Any] = {}
    indices = at.tolist()
    for i in indices:
        if i < n:
            named[int(record_key[i])] = values[i]
    ids: dict[Any, int] = {}
    for i in indices:
        value = values[i] if i < n else named.get(int(record_key[i]))
        history.key[i] = -1 if value is None else ids.setdefault(value, next_id + len(ids))
    return next_id + len(ids)


def history_columns(rows: pa.Table, quarantined: pa.Table, rule_for: Callable[[str], TableRule]) -> History:
    """The versions of ``rows`` (parsed records) and ``quarantined`` (the quarantine dataset's), both with
    ``INCARNATION``, as columns."""
    n = rows.num_rows
    topics_encoded = both(rows, quarantined, "topic").dictionary_encode()
    topics: list[str] = topics_encoded.dictionary.to_pylist()
    topic = _ints(topics_encoded.indices)
    keys_encoded = both(rows, quarantined, "key").dictionary_encode()
    key_index = _ints(pc.fill_null(keys_encoded.indices, -1))
    key = np.where(key_index < 0, -1, topic * (len(keys_encoded.dictionary) + 1) + key_index)
    values = pa.chunked_array(rows.column("value").chunks + quarantined.column("value").chunks,
                              rows.schema.field("value").type)  # not combined: only Debezium envelopes read it
    null_value = np.asarray(values.is_null().to_numpy(), dtype=bool)
    quarantine = np.arange(len(topic)) >= n
    kafka_ms = _ints(both(rows, quarantined, "timestamp")) // 1000
    history = History(
        topics, topic, key, _ints(both(rows, quarantined, "partition")),
        _ints(both(rows, quarantined, INCARNATION)), _ints(both(rows, quarantined, "offset")), kafka_ms,
        kafka_ms.copy(), np.where(null_value, DELETE, np.where(quarantine, WITHHELD, ROW)), n,
        quarantined.column("reason"))
    next_id = int(key.max(initial=-1)) + 1  # column keys' ids follow the record keys'
    combined: pa.Array | None = None
    for code, name in enumerate(topics):
        rule = rule_for(name)
        at = np.flatnonzero(topic == code)
        if rule.mode == "debezium":
            at = _debezium_columns(history, rows, at)
            if len(at):
                combined = values.combine_chunks() if combined is None else combined
                _debezium(history, rows, quarantined, combined, at)
        elif rule.mode == "upsert" and rule.key:
            next_id = _column_keys(history, rows, key_index, at, rule.key, next_id)
    return history
