"""Erasure by a typed column's value (``shale erase --column customer.id --value 42``, DESIGN 19.1): the canonical
form of a value, its SHA-256, and the partition group's rows whose column holds it.

The request keeps the column path and the SHA-256 of the value's canonical form, never the value. The canonical
form is UTF-8 text ``<kind>:<text>``, one per kind of Arrow type, so that one value has one form whichever width or
unit a version of the schema gave it:

- ``number``: integers (any width, signed or not) and decimals (any precision and scale): the exact decimal
  value, plain notation, no exponent, no trailing zeros after the point and no point when it is whole, ``-`` for
  negatives, zero as ``0`` (``42``, ``42.5``, ``-0.25``): ``42`` in an ``int32``, an ``int64`` and a
  ``decimal(12,2)`` column (42.00) is one value. Floating-point columns are refused: equality is not exact there.
- ``string``: the text itself (strings and large strings; an Avro enum is stored as its symbol).
- ``bool``: ``true`` or ``false``.
- ``timestamp``: the instant as whole microseconds since the Unix epoch, UTC (any unit, any time zone: an
  instant is one value); a nanosecond value that is not a whole microsecond keeps its nanoseconds as a fraction
  (``.123``). Given as ISO 8601 text; text without an offset is UTC.
- ``date``: ``YYYY-MM-DD``.

A value that cannot be parsed for the column's type (``abc`` for an integer, ``42.123`` for ``decimal(12,2)``, a
number out of the type's range) is a clear error, before anything is committed. A column whose types in scope
differ in kind (``string`` in old blocks, ``long`` once a JSON rule was given types) is matched in each dataset by
the value's form for that dataset's kind: the request keeps one hash per kind (``request_hash``).
"""

from __future__ import annotations

import datetime as dt
import decimal
import hashlib
from collections.abc import Iterable

import pyarrow as pa
import pyarrow.compute as pc

from shale.errors import ShaleError

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}


class ColumnValueError(ShaleError, ValueError):
    """The value cannot be a value of the column's type, or the column cannot be matched by value."""


def kind_of(type_: pa.DataType) -> str:
    """The canonical kind of an Arrow type (the module's docstring); a clear error for a type not matched by value."""
    if pa.types.is_integer(type_) or pa.types.is_decimal(type_):
        return "number"
    if pa.types.is_string(type_) or pa.types.is_large_string(type_):
        return "string"
    if pa.types.is_boolean(type_):
        return "bool"
    if pa.types.is_timestamp(type_):
        return "timestamp"
    if pa.types.is_date(type_):
        return "date"
    if pa.types.is_dictionary(type_):
        return kind_of(type_.value_type)
    raise ColumnValueError(f"a column of type {type_} cannot be matched by value (integers, decimals, strings, "
                           "booleans, timestamps and dates can)")


def _number(value: decimal.Decimal) -> str:
    if value == 0:
        return "0"
    return format(value.normalize(), "f")


def _micros(seconds_since_epoch_scaled: int, unit: str) -> str:
    """An instant in ``unit`` since the epoch as whole microseconds (a fraction only for sub-microsecond ns)."""
    if unit == "ns":
        whole, rest = divmod(seconds_since_epoch_scaled, 1000)
        return f"{whole}.{rest:03d}".rstrip("0").rstrip(".") if rest else str(whole)
    return str(seconds_since_epoch_scaled * (1_000_000 // _PER_SECOND[unit]))


def parse(text: str, type_: pa.DataType) -> bytes:
    """The canonical form of ``text`` read as a value of ``type_``, or a ``ColumnValueError`` saying why not."""
    kind = kind_of(type_)
    if pa.types.is_dictionary(type_):
        type_ = type_.value_type
    if kind == "number":
        try:
            value = decimal.Decimal(text.strip())
        except decimal.InvalidOperation:
            raise ColumnValueError(f"{text!r} is not a number (the column is {type_})") from None
        if not value.is_finite():
            raise ColumnValueError(f"{text!r} is not a finite number (the column is {type_})")
        try:
            pa.array([int(value) if pa.types.is_integer(type_) else value], type=type_)
            if pa.types.is_integer(type_) and value != int(value):
                raise ValueError("not whole")
            if pa.types.is_decimal(type_) and value != value.quantize(decimal.Decimal(1).scaleb(-type_.scale)):
                raise ValueError("too many digits after the point")
        except (ValueError, OverflowError, pa.ArrowInvalid, decimal.InvalidOperation) as exc:
            raise ColumnValueError(f"{text!r} is not a value of the column's type {type_}: {exc}") from None
        return f"number:{_number(value)}".encode()
    if kind == "string":
        return f"string:{text}".encode()
    if kind == "bool":
        if text.strip().lower() not in ("true", "false"):
            raise ColumnValueError(f"{text!r} is not a boolean (true or false)")
        return f"bool:{text.strip().lower()}".encode()
    if kind == "timestamp":
        try:
            when = dt.datetime.fromisoformat(text.strip())
        except ValueError:
            raise ColumnValueError(f"{text!r} is not an ISO 8601 timestamp (the column is {type_})") from None
        when = when if when.tzinfo is not None else when.replace(tzinfo=dt.UTC)
        delta = when - _EPOCH
        micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
        return f"timestamp:{micros}".encode()
    try:
        day = dt.date.fromisoformat(text.strip())
    except ValueError:
        raise ColumnValueError(f"{text!r} is not an ISO 8601 date (the column is {type_})") from None
    return f"date:{day.isoformat()}".encode()


def canonical_forms(values: pa.Array | pa.ChunkedArray) -> list[bytes | None]:
    """The canonical form of each value of ``values`` (an array of a kind ``kind_of`` accepts); None for a null."""
    type_ = values.type
    if pa.types.is_dictionary(type_):
        values = values.cast(type_.value_type) if isinstance(values, pa.Array) else pc.cast(values, type_.value_type)
        type_ = type_.value_type
    kind = kind_of(type_)
    out: list[bytes | None] = []
    if kind == "timestamp":
        ints = pc.cast(values, pa.int64()).to_pylist()
        return [None if v is None else f"timestamp:{_micros(v, type_.unit)}".encode() for v in ints]
    for v in values.to_pylist():
        if v is None:
            out.append(None)
        elif kind == "number":
            out.append(f"number:{_number(decimal.Decimal(v))}".encode())
        elif kind == "string":
            out.append(f"string:{v}".encode())
        elif kind == "bool":
            out.append(b"bool:true" if v else b"bool:false")
        else:
            out.append(f"date:{v.isoformat()}".encode())
    return out


def value_sha256(canonical: bytes) -> str:
    return hashlib.sha256(canonical).hexdigest()


def column_type(fields: dict[str, pa.DataType], path: str) -> pa.DataType | None:
    """The type at ``path`` (``customer.id``: field ``id`` of the struct column ``customer``) among a dataset's
    parser columns, or None where the dataset has no such column."""
    top, *rest = path.split(".")
    type_ = fields.get(top)
    for name in rest:
        if type_ is None or not pa.types.is_struct(type_) or type_.get_field_index(name) < 0:
            return None
        type_ = type_.field(name).type
    return type_


def column_values(table: pa.Table, path: str) -> pa.ChunkedArray:
    """The values at ``path`` of ``table``'s rows (null where a parent struct is null)."""
    top, *rest = path.split(".")
    values = table.column(top)
    for name in rest:
        values = pc.struct_field(values, name)
    return values


def matching(values: pa.Array | pa.ChunkedArray, sha256: str) -> pa.Array:
    """A mask of the values whose canonical form's SHA-256 is ``sha256`` (one of them, where a request keeps one
    per kind, comma-separated: ``request_hash``). A form names its kind, so a value matches only its own kind's."""
    wanted = set(sha256.split(","))
    return pa.array([f is not None and value_sha256(f) in wanted for f in canonical_forms(values)], pa.bool_())


def request_hash(text: str, types: Iterable[pa.DataType], path: str) -> str:
    """What an erasure of ``path = text`` keeps: ``text`` read as each type the column has in the datasets in scope
    (``types``), the SHA-256 of its canonical form for each kind among them, sorted and comma-separated (one hash
    when the types share one kind). Each dataset is then matched by the form of its own type's kind: a column
    whose types differ in kind (a JSON rule given ``types`` later: old blocks ``string``, new ones ``long``) is
    matched as each. Every type of a kind must read ``text`` (``4.5`` for an integer is an error); a kind none of
    whose types reads it cannot hold it and is left out while another kind reads it (``abc`` erases the
    ``string`` records only). No type that reads it, or no dataset in scope with the column, is an error."""
    by_kind: dict[str, list[pa.DataType]] = {}
    for type_ in types:
        by_kind.setdefault(kind_of(type_), []).append(type_)
    if not by_kind:
        raise ColumnValueError(f"no records dataset of the topics in scope has a column {path}")
    forms: set[bytes] = set()
    refused: list[ColumnValueError] = []
    for _, kind_types in sorted(by_kind.items()):
        read, failed = [], []
        for type_ in kind_types:
            try:
                read.append(parse(text, type_))
            except ColumnValueError as exc:
                failed.append(exc)
        if failed and read:  # a value some types of one kind hold and others cannot
            raise failed[0]
        forms.update(read)
        refused.extend(failed[:1])
    if not forms:
        raise refused[0] if len(refused) == 1 else ColumnValueError(
            f"{text!r} is a value of none of the column {path}'s types in scope: " + "; ".join(map(str, refused)))
    return ",".join(sorted(value_sha256(f) for f in forms))
