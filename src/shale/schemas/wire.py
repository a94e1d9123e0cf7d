"""The Confluent wire format: a zero magic byte, the writer schema's registry id (4 bytes, big-endian), then the
payload (Avro binary without a container header)."""

from __future__ import annotations

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


def payload(value: bytes) -> memoryview:
    """The bytes after the header (no copy)."""
    return memoryview(value)[HEADER_BYTES:]


def frame(schema: int, body: bytes) -> bytes:
    """A framed record (tests and benchmarks; producers use the standard serializers)."""
    return bytes([MAGIC]) + schema.to_bytes(4, "big") + body
