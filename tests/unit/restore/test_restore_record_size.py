"""The size a broker checks against ``max.message.bytes`` for one record sent alone: a v2 record batch's 61-byte
header and the record with its varint lengths (Kafka's DefaultRecord.sizeInBytes). The integration test checks it
against a real broker's limit; here, its arithmetic."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shale.restore.task import RECORD_BATCH_OVERHEAD, _varint_size, record_size


def test_known_sizes() -> None:
    # body: attributes, timestamp delta, offset delta (1 each), key -1 (1), value length 1 + 5, no headers (1) = 11
    assert record_size(None, b"hello", []) == RECORD_BATCH_OVERHEAD + 1 + 11
    assert record_size(b"k", b"", [("h", None)]) == RECORD_BATCH_OVERHEAD + 1 + (3 + 2 + 1 + 1 + 2 + 1)


def test_varint_sizes_match_zigzag_encoding() -> None:
    assert [_varint_size(v) for v in (0, -1, 63, -64, 64, 8191, 8192, 1 << 20)] == [1, 1, 1, 1, 2, 2, 3, 4]


@given(st.binary(max_size=300), st.binary(max_size=300),
       st.lists(st.tuples(st.text(max_size=20), st.none() | st.binary(max_size=50)), max_size=5))
def test_size_grows_with_every_byte(key: bytes, value: bytes, headers: list[tuple[str, bytes | None]]) -> None:
    base = record_size(key, value, headers)
    assert base >= RECORD_BATCH_OVERHEAD + len(key) + len(value)
    assert record_size(key, value + b"x", headers) > base
    assert record_size(key + b"x", value, headers) > base
