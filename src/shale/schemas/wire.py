"""The Confluent wire format: a zero magic byte, the writer schema's registry id (4 bytes, big-endian), then the
payload (Avro binary without a container header; JSON text; for Protobuf, first the message-index array, see
``message_indexes``, then the message)."""

from __future__ import annotations

from collections import Counter

MAGIC = 0
HEADER_BYTES = 5


class FramingError(ValueError):
    """The bytes are not in the Confluent wire format; ``str(exc)`` says why (kept with the quarantined record)."""


def schema_id(value: bytes | None) -> int:
    """The registry id of the schema ``value`` was written with; ``FramingError`` when there is none."""
    if value is None:
        raise FramingError("the record has no value")
    if len(value) < HEADER_BYTES:
        raise FramingError(f"the record is {len(value)} bytes, shorter than the 5-byte Schema Registry header")
    if value[0] != MAGIC:
        raise FramingError(f"the record does not start with the Schema Registry magic byte 0 (it starts with "
                           f"{value[0]})")
    return int.from_bytes(value[1:HEADER_BYTES], "big")


def id_counts(values: list[bytes | None]) -> Counter[int]:
    """How many of ``values`` carry each schema id (values without a header are left out)."""
    counts: Counter[int] = Counter()
    for value in values:
        if value is not None and len(value) >= HEADER_BYTES and value[0] == MAGIC:
            counts[int.from_bytes(value[1:HEADER_BYTES], "big")] += 1
    return counts


MAX_INDEX_DEPTH = 64
"""Deeper message-index arrays are refused (a message nested 64 levels deep is not a real schema)."""


def _zigzag(value: bytes, pos: int) -> tuple[int, int]:
    """One zigzag varint at ``pos``: its value and the position after it."""
    result = shift = 0
    while True:
        if pos >= len(value):
            raise FramingError("the Protobuf message-index array ends before its last varint")
        byte = value[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift >= 64:
            raise FramingError("a varint of the Protobuf message-index array is longer than 10 bytes")


def message_indexes(value: bytes) -> tuple[list[int], int]:
    """The Protobuf message-index array after the 5-byte header (the path of the record's message type in its
    schema file: [2, 0] is the first message nested in the file's third) and where the message starts. The
    serializers write a zigzag-varint count and the indexes; a single 0 byte stands for [0]."""
    count, pos = _zigzag(value, HEADER_BYTES)
    if count == 0:
        return [0], pos
    if not 0 < count <= MAX_INDEX_DEPTH:
        raise FramingError(f"the Protobuf message-index array claims {count} indexes")
    indexes = []
    for _ in range(count):
        index, pos = _zigzag(value, pos)
        if index < 0:
            raise FramingError(f"the Protobuf message-index array holds a negative index {index}")
        indexes.append(index)
    return indexes, pos


def payload(value: bytes) -> memoryview:
    """The bytes after the header (no copy)."""
    return memoryview(value)[HEADER_BYTES:]


def frame(schema: int, body: bytes) -> bytes:
    """A framed record (tests and benchmarks; producers use the standard serializers)."""
    return bytes([MAGIC]) + schema.to_bytes(4, "big") + body
