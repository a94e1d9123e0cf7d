"""The packed form of what grows with the partitions a block spans: its Kafka ranges, its datasets' row groups
(table of contents) and their partitions, and a commit's offset ranges (``shale.metastore.OffsetRange``).

The list form (one JSON object or array per range or row group) costs about 110 bytes per partition in meta.json
and 210 in a commit's Raft entry. The packed form is one JSON string: ``PACKED_TAG`` then base64 of the
zlib-compressed columns, each delta-coded where neighbours are alike (partitions, starts, times) and stored at the
smallest integer width that holds it, byte-shuffled. Strings (topic, incarnation) are stored once per run of equal
ones, so any order of ranges round-trips exactly.

Readers read both forms (``unpack_*`` where a field's JSON value is a string); writers write the packed form from
``PACK_FROM`` items on, and the list form below it (small blocks stay readable by eye). Decoding refuses
anything malformed with a ``ValueError`` that says what (pydantic turns it into the record's validation error),
and never inflates more than ``MAX_UNPACKED`` bytes (a command comes from clients).
"""

from __future__ import annotations

import base64
import binascii
import json
import struct
import zlib
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

import numpy as np

PACKED_TAG = "z1:"
"""The packed form's prefix: its format (version 1: zlib, base64, columns as below)."""
PACK_FROM = 8
"""Lists of this many items or more are written packed."""
MAX_UNPACKED = 64 * 1024 * 1024
"""The most bytes a packed value may inflate to (about 2 million ranges)."""
_WIDTHS = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}


class Ranged(Protocol):
    """A Kafka range as the packers read it (``KafkaRange`` and ``OffsetRange`` both fit)."""

    @property
    def topic(self) -> str: ...
    @property
    def incarnation(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def start(self) -> int: ...
    @property
    def end(self) -> int: ...


class Counted(Ranged, Protocol):
    @property
    def stored(self) -> int | None: ...
    @property
    def bytes(self) -> int | None: ...


def _column(values: np.ndarray) -> bytes:
    """One int64 column at the smallest width that holds it: a width byte, then the little-endian values' bytes
    shuffled (every value's first byte, then every second byte...): the high bytes of values of one magnitude are
    alike, and runs of alike bytes are what zlib compresses."""
    low, high = (int(values.min()), int(values.max())) if len(values) else (0, 0)
    width = next(w for w in (1, 2, 4, 8) if -(1 << (8 * w - 1)) <= low and high < (1 << (8 * w - 1)))
    plain = values.astype(_WIDTHS[width]).astype(f"<i{width}").view(np.uint8).reshape(len(values), width)
    return bytes([width]) + plain.T.tobytes()


class _Reader:
    """Reads a payload front to back; any shortfall is a ``ValueError``."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, size: int) -> bytes:
        if size < 0 or self.at + size > len(self.data):
            raise ValueError("packed value is truncated")
        out = self.data[self.at:self.at + size]
        self.at += size
        return out

    def column(self, count: int) -> np.ndarray:
        (width,) = self.take(1)
        if width not in _WIDTHS:
            raise ValueError(f"packed column has width {width}, not 1, 2, 4 or 8")
        shuffled = np.frombuffer(self.take(width * count), dtype=np.uint8).reshape(width, count)
        return np.ascontiguousarray(shuffled.T).view(f"<i{width}").reshape(count).astype(np.int64)

    def done(self) -> None:
        if self.at != len(self.data):
            raise ValueError("packed value has bytes after its columns")


def _wrap(header: object, columns: Sequence[np.ndarray]) -> str:
    head = json.dumps(header, separators=(",", ":")).encode()
    payload = struct.pack("<I", len(head)) + head + b"".join(_column(c) for c in columns)
    return PACKED_TAG + base64.b64encode(zlib.compress(payload, 6)).decode("ascii")


def _unwrap(value: str) -> tuple[object, _Reader]:
    if not value.startswith(PACKED_TAG):
        raise ValueError(f"a packed value starts with {PACKED_TAG!r}; this one does not (a newer Shale's form? "
                         "upgrade this reader)")
    try:
        compressed = base64.b64decode(value[len(PACKED_TAG):], validate=True)
        inflater = zlib.decompressobj()
        payload = inflater.decompress(compressed, MAX_UNPACKED + 1)
    except (binascii.Error, zlib.error) as exc:
        raise ValueError(f"packed value is not base64 of zlib data ({exc})") from None
    if len(payload) > MAX_UNPACKED or not inflater.eof:
        raise ValueError(f"packed value is cut short or inflates past {MAX_UNPACKED} bytes")
    reader = _Reader(payload)
    (size,) = struct.unpack("<I", reader.take(4))
    try:
        header = json.loads(reader.take(size))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"packed value's header is not JSON ({exc})") from None
    return header, reader


def _delta(values: Sequence[int]) -> np.ndarray:
    return np.diff(np.asarray(values, dtype=np.int64), prepend=np.int64(0))


def _runs(ranges: Sequence[Ranged]) -> list[list[object]]:
    """``[topic, incarnation, count]`` per run of ranges of the same topic incarnation, in order."""
    runs: list[list[object]] = []
    for r in ranges:
        if runs and runs[-1][0] == r.topic and runs[-1][1] == r.incarnation:
            runs[-1][2] = int(str(runs[-1][2])) + 1
        else:
            runs.append([r.topic, r.incarnation, 1])
    return runs


def _range_columns(ranges: Sequence[Ranged]) -> list[np.ndarray]:
    starts = np.asarray([r.start for r in ranges], dtype=np.int64)
    ends = np.asarray([r.end for r in ranges], dtype=np.int64)
    return [_delta([r.partition for r in ranges]), np.diff(starts, prepend=np.int64(0)), ends - starts]


_R = TypeVar("_R")


def _read_ranges(value: str, counted: bool, make: Callable[..., _R]) -> list[_R]:
    header, reader = _unwrap(value)
    if not isinstance(header, list) or not all(
            isinstance(run, list) and len(run) == 3 and isinstance(run[0], str) and isinstance(run[1], str)
            and isinstance(run[2], int) and run[2] > 0 for run in header):
        raise ValueError("packed ranges' header is not a list of [topic, incarnation, count]")
    count = sum(run[2] for run in header)
    columns = [reader.column(count) for _ in range(5 if counted else 3)]
    reader.done()
    partitions, starts = np.cumsum(columns[0]), np.cumsum(columns[1])
    ends = starts + columns[2]
    if count and (partitions.min() < 0 or starts.min() < 0 or columns[2].min() < 0):
        raise ValueError("packed ranges hold a negative partition or offset, or an end before its start")
    names = [(run[0], run[1]) for run in header for _ in range(run[2])]
    fields = [partitions.tolist(), starts.tolist(), ends.tolist()]
    if not counted:
        return [make(topic=t, incarnation=i, partition=p, start=s, end=e)
                for (t, i), p, s, e in zip(names, *fields, strict=True)]
    stored = columns[2] - columns[3]  # length - stored; -1 (length + 1 stored back) is None
    sizes = columns[4]
    if count and (stored.min() < -1 or sizes.min() < -1):
        raise ValueError("packed ranges hold a negative count of records or bytes")
    return [make(topic=t, incarnation=i, partition=p, start=s, end=e, stored=None if n < 0 else n,
                 bytes=None if b < 0 else b)
            for (t, i), p, s, e, n, b in zip(names, *fields, stored.tolist(), sizes.tolist(), strict=True)]


def pack_ranges(ranges: Sequence[Ranged]) -> str:
    """Kafka ranges (topic, incarnation, partition, start, end), packed."""
    return _wrap(_runs(ranges), _range_columns(ranges))


def unpack_ranges(value: str, make: Callable[..., _R]) -> list[_R]:
    """The ranges in a packed value, each made by ``make(topic=, incarnation=, partition=, start=, end=)``, which
    checks topic and incarnation (the decoder checks the numbers)."""
    return _read_ranges(value, False, make)


def pack_counted_ranges(ranges: Sequence[Counted]) -> str:
    """Offset ranges with the records stored from each and their bytes (either None: not counted), packed."""
    columns = _range_columns(ranges)
    stored = np.asarray([-1 if r.stored is None else r.stored for r in ranges], dtype=np.int64)
    sizes = np.asarray([-1 if r.bytes is None else r.bytes for r in ranges], dtype=np.int64)
    return _wrap(_runs(ranges), [*columns, columns[2] - stored, sizes])


def unpack_counted_ranges(value: str, make: Callable[..., _R]) -> list[_R]:
    """``unpack_ranges`` with ``stored=`` and ``bytes=`` too."""
    return _read_ranges(value, True, make)


def pack_row_groups(groups: Sequence[tuple[int, int, int]]) -> str:
    """A table of contents, (rows, min_time, max_time) per row group, packed."""
    mins = np.asarray([g[1] for g in groups], dtype=np.int64)
    return _wrap(len(groups), [np.asarray([g[0] for g in groups], dtype=np.int64), np.diff(mins, prepend=np.int64(0)),
                               np.asarray([g[2] for g in groups], dtype=np.int64) - mins])


def unpack_row_groups(value: str) -> list[tuple[int, int, int]]:
    header, reader = _unwrap(value)
    if not isinstance(header, int) or header < 0:
        raise ValueError("packed row groups' header is not a count")
    rows, mins, spans = (reader.column(header) for _ in range(3))
    reader.done()
    if header and rows.min() < 0:
        raise ValueError("packed row groups hold a negative row count")
    mins = np.cumsum(mins)
    return list(zip(rows.tolist(), mins.tolist(), (mins + spans).tolist(), strict=True))


def pack_ints(values: Sequence[int]) -> str:
    """Integers (a table of contents' partitions), delta-coded and packed."""
    return _wrap(len(values), [_delta(values)])


def unpack_ints(value: str) -> list[int]:
    header, reader = _unwrap(value)
    if not isinstance(header, int) or header < 0:
        raise ValueError("packed integers' header is not a count")
    out = np.cumsum(reader.column(header))
    reader.done()
    return [int(v) for v in out.tolist()]
