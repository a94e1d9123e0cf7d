"""Block ids are ULIDs: 48 bits of milliseconds, then 80 bits that make the id unique.

Writers that may repeat themselves (an ingest batch replayed after a crash, a compaction job retried by another
worker) derive the id deterministically from a time and a key, so the repeat writes the same keys and its
put-if-absent is a no-op instead of a duplicate block.
"""

from __future__ import annotations

import hashlib
import re
import time

from ulid import ULID

from shale.errors import InvalidNameError

_ULID_RE = re.compile(r"^[0-7][0-9A-HJKMNP-TV-Z]{25}$")
MAX_ULID_MS = 2**48 - 1


def new_block_id(time_ms: int | None = None) -> str:
    """A fresh random ULID at ``time_ms`` (default: now)."""
    ms = int(time.time() * 1000) if time_ms is None else time_ms
    return str(ULID.from_timestamp(ms / 1000))


def deterministic_block_id(time_ms: int, key: str) -> str:
    """The same ``(time_ms, key)`` always gives the same ULID; different keys give different ids."""
    if not 0 <= time_ms <= MAX_ULID_MS:
        raise ValueError(f"time {time_ms} ms is outside the ULID range")
    entropy = hashlib.sha256(key.encode()).digest()[:10]
    return str(ULID.from_bytes(time_ms.to_bytes(6, "big") + entropy))


def check_block_id(value: str) -> str:
    if not _ULID_RE.match(value):
        raise InvalidNameError(f"{value!r} is not a block id (a 26-character ULID like 01JD0Z8Q2Y3N4M5P6Q7R8S9T0V)")
    return value


_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_CROCKFORD = {c: i for i, c in enumerate(_ALPHABET)}


def ulid_time_prefix(time_ms: int) -> str:
    """The first ten characters of every block id made at ``time_ms``: a LIST that starts after this prefix (in
    a folder of block ids) finds the blocks made at ``time_ms`` or later, as ids sort by time."""
    if not 0 <= time_ms <= MAX_ULID_MS:
        raise ValueError(f"time {time_ms} ms is outside the ULID range")
    return "".join(_ALPHABET[(time_ms >> shift) & 31] for shift in range(45, -5, -5))


def ulid_time_ms(block_id: str) -> int:
    """The millisecond timestamp inside a block id (its creation time, by the seeds' convention): the first
    ten Crockford base32 characters, 5 bits each."""
    check_block_id(block_id)
    value = 0
    for char in block_id[:10]:
        value = (value << 5) | _CROCKFORD[char]
    return value
