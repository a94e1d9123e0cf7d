"""``BucketFile``: the ranged reads under Parquet give the object's bytes, in a number of requests that follows the
bytes read, not the column chunks asked (issue 55: a query of a level-0 block of 2,048 partitions asked one
request per column chunk, 8,194 of them)."""

from __future__ import annotations

import io
from unittest.mock import patch

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from shale.block.reader import BucketFile


class Bytes:
    """A bucket of one object that counts the ranges asked."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.ranges: list[tuple[int, int]] = []

    def get_range(self, key: str, start: int, end: int) -> bytes:
        self.ranges.append((start, end))
        return self.data[start:end]


@settings(max_examples=200)
@given(size=st.integers(0, 5000), reads=st.lists(st.tuples(st.integers(0, 5200), st.integers(0, 1500)), max_size=40),
       block=st.sampled_from([1, 7, 64, 1000]))
def test_every_read_gives_the_objects_bytes(size: int, reads: list[tuple[int, int]], block: int) -> None:
    data = bytes(range(256)) * (size // 256) + bytes(range(size % 256))
    bucket = Bytes(data)
    file = BucketFile(bucket, "key", size)  # type: ignore[arg-type]
    with patch("shale.block.reader.READ_BLOCK", block):
        for position, length in reads:
            file.seek(position)
            got = file.read(length)
            assert got == data[position:position + length]
            assert file.tell() == position + len(got)
    assert all(0 <= s < e <= size for s, e in bucket.ranges)
    assert file.requests == len(bucket.ranges)
    assert file.bytes_read == sum(e - s for s, e in bucket.ranges)


def test_a_query_of_a_block_of_2048_partitions_takes_requests_by_its_bytes_not_its_column_chunks() -> None:
    partitions, rows = 2048, 200
    table = pa.table({"partition": np.repeat(np.arange(partitions), rows),
                      "offset": np.tile(np.arange(rows), partitions),
                      "event_time": np.arange(partitions * rows),
                      "level": pa.array(["probe" if i % rows == 0 else "INFO" for i in range(partitions * rows)]),
                      "msg": pa.array([f"event {i:>60}" for i in range(partitions * rows)])})
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=rows, write_page_checksum=True)  # a row group per partition
    data = sink.getvalue()
    bucket = Bytes(data)
    file = BucketFile(bucket, "key", len(data))  # type: ignore[arg-type]
    read = pq.read_table(file, columns=["partition", "offset", "event_time"], filters=pc.field("level") == "probe",
                         page_checksum_verification=True, pre_buffer=False)
    assert read.num_rows == partitions
    assert read.column("offset").to_pylist() == [0] * partitions
    blocks = -(-len(data) // (1 << 20))
    assert file.requests <= blocks + 2  # was 8,194: a request per column chunk, four columns of 2,048 row groups
    assert file.bytes_read <= len(data)  # each block fetched once
