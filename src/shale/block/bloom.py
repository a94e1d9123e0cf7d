"""Parquet bloom filters on the record key column: an erasure (``shale erase``) opens only the data objects that
may hold the key.

Writers ask pyarrow for a split-block bloom filter on ``key`` (``key_bloom_options``). pyarrow writes the filters
but has no reader for them, so ``shale.block.reader.may_hold_key`` reads each row group's filter itself, with the
Parquet format's rules: the filter is a Thrift ``BloomFilterHeader`` followed by its bitset (``numBytes`` bytes,
32-byte blocks of eight 32-bit words); a value's hash is XXH64 (seed 0) of its plain encoding (a BYTE_ARRAY's
bytes, without their length); the block is ``((hash >> 32) * blocks) >> 32`` and word ``i`` must have bit
``((low 32 bits of hash) * SALT[i] mod 2**32) >> 27`` set. Checked against filters pyarrow wrote.
"""

from __future__ import annotations

import struct

KEY_COLUMN = "key"
BLOOM_FPP = 0.01
"""False positives: one object in a hundred that does not hold the key is opened anyway."""
_SALT = (0x47B6137B, 0x44974D91, 0x8824AD5B, 0xA2B7289D, 0x705495C7, 0x2DF1424B, 0x9EFC4947, 0x5C6BFB31)
_M64 = (1 << 64) - 1
_P1, _P2, _P3, _P4, _P5 = (11400714785074694791, 14029467366897019727, 1609587929392839161, 9650029242287828579,
                           2870177450012600261)


def key_bloom_options(rows: int) -> dict[str, object]:
    """The writer option for a dataset of about ``rows`` rows per row group (the filter's size is fixed by its
    expected distinct values: a filter sized for a row group's worth of distinct keys, at ``BLOOM_FPP``)."""
    return {KEY_COLUMN: {"ndv": max(64, rows), "fpp": BLOOM_FPP}}


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M64


def _round(acc: int, lane: int) -> int:
    return (_rotl((acc + lane * _P2) & _M64, 31) * _P1) & _M64


def xxh64(data: bytes, seed: int = 0) -> int:
    """XXH64 of ``data`` (the Parquet bloom filter's hash)."""
    n, i = len(data), 0
    if n >= 32:
        v = [(seed + _P1 + _P2) & _M64, (seed + _P2) & _M64, seed & _M64, (seed - _P1) & _M64]
        while i + 32 <= n:
            lanes = struct.unpack_from("<4Q", data, i)
            v = [_round(a, b) for a, b in zip(v, lanes, strict=True)]
            i += 32
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & _M64
        for lane in v:
            h = ((h ^ _round(0, lane)) * _P1 + _P4) & _M64
    else:
        h = (seed + _P5) & _M64
    h = (h + n) & _M64
    while i + 8 <= n:
        h ^= _round(0, struct.unpack_from("<Q", data, i)[0])
        h = (_rotl(h, 27) * _P1 + _P4) & _M64
        i += 8
    if i + 4 <= n:
        h ^= (struct.unpack_from("<I", data, i)[0] * _P1) & _M64
        h = (_rotl(h, 23) * _P2 + _P3) & _M64
        i += 4
    while i < n:
        h ^= (data[i] * _P5) & _M64
        h = (_rotl(h, 11) * _P1) & _M64
        i += 1
    h ^= h >> 33
    h = (h * _P2) & _M64
    h ^= h >> 29
    h = (h * _P3) & _M64
    return h ^ (h >> 32)


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at += 1
        if not byte & 0x80:
            return value, at
        shift += 7


def bitset_of(filter_bytes: bytes) -> bytes | None:
    """The bitset of a serialized bloom filter (header, then bitset), or None if the header is not the one
    field layout the format defines first (``numBytes``, field 1, i32)."""
    if not filter_bytes or filter_bytes[0] != 0x15:
        return None
    raw, _ = _varint(filter_bytes, 1)
    size = (raw >> 1) ^ -(raw & 1)
    if size <= 0 or size % 32 or size > len(filter_bytes):
        return None
    return filter_bytes[len(filter_bytes) - size:]


def bitset_holds(bitset: bytes, value: bytes) -> bool:
    h = xxh64(value)
    block = ((h >> 32) * (len(bitset) // 32)) >> 32
    key = h & 0xFFFFFFFF
    words = struct.unpack_from("<8I", bitset, block * 32)
    return all(words[i] & (1 << (((key * _SALT[i]) & 0xFFFFFFFF) >> 27)) for i in range(8))
