"""The merge's row order and copies: sorted by time, one row per (topic, partition, offset), the same rows as
Arrow's own take, whether the sources are sorted (spans of record batches) or shuffled (rows taken one by one)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from tests.factories import BASE_MS, write_backup_block

from shale.block import block_file_key, read_dataset
from shale.compactor.merge import _sorted_row_groups, fetch_sources, merge_blocks, merge_order
from shale.errors import CorruptObjectError
from shale.objstore import open_bucket_url


def _records(rows: int, batch_rows: int, seed: int, shuffled: bool) -> pa.Table:
    rng = np.random.default_rng(seed)
    offsets = np.arange(rows)
    times = rng.integers(0, rows // 3 + 1, rows)  # many equal times: ties break by (topic, partition, offset)
    if not shuffled:
        times = np.sort(times)
    table = pa.table({"timestamp": pa.array(times * 1000, pa.timestamp("ms", tz="UTC")),
                      "topic": pa.array(rng.choice(["a", "b"], rows)), "partition": pa.array(offsets % 3, pa.int32()),
                      "offset": pa.array(offsets, pa.int64()),
                      "value": pa.array([f"v{i}".encode() * (i % 7) for i in range(rows)])})
    return pa.Table.from_batches(table.to_batches(max_chunksize=batch_rows))


@pytest.mark.parametrize("shuffled", [False, True])
@pytest.mark.parametrize(("rows", "batch_rows", "group_rows"), [(5000, 700, 1000), (3000, 3000, 64), (999, 10, 7)])
def test_row_groups_hold_the_rows_of_arrows_take_in_order(shuffled: bool, rows: int, batch_rows: int,
                                                         group_rows: int) -> None:
    table = _records(rows, batch_rows, seed=rows + batch_rows, shuffled=shuffled)
    order = merge_order(table)
    groups = list(_sorted_row_groups(table, order, group_rows))
    assert all(g.num_rows == group_rows for g in groups[:-1])
    assert 0 < groups[-1].num_rows <= group_rows
    assert pa.concat_tables(groups).equals(table.combine_chunks().take(order))


def test_a_merge_drops_copies_and_sorts_by_time() -> None:
    """Overlapping sources (the same offsets stored twice) and partitions whose times interleave: the output holds
    each record once, sorted by (time, topic, partition, offset), and reads back with its checksum."""
    bucket = open_bucket_url("memory://test-merge-sorts")
    sources = [write_backup_block(bucket, "acme", "app", p, start, 300, base_ms=BASE_MS + start * 1000)
               for p in (0, 1) for start in (0, 200, 500)]  # a record's time is its offset's, in every copy
    result = merge_blocks(bucket, sources, job="j", token=1, level=0)
    table = read_dataset(bucket, result.output, result.output.datasets[0])
    assert result.rows_in == 6 * 300
    assert table.num_rows == result.rows_out == 2 * 800
    keys = sorted(zip(table.column("partition").to_pylist(), table.column("offset").to_pylist(), strict=True))
    assert keys == [(p, o) for p in (0, 1) for o in range(800)]
    time_order = pc.sort_indices(table, sort_keys=[("timestamp", "ascending"), ("topic", "ascending"),
                                                   ("partition", "ascending"), ("offset", "ascending")])
    assert time_order.to_pylist() == list(range(table.num_rows))


def test_input_fetched_ahead_is_checked_like_input_read_by_the_merge() -> None:
    """A task fetches the next merge's objects early (``fetch_sources``): bytes that differ from meta.json's CRC32
    fail the merge before they are decoded, as bytes the merge fetched itself would."""
    bucket = open_bucket_url("memory://test-merge-fetched")
    sources = [write_backup_block(bucket, "acme", "app", 0, start, 100) for start in (0, 100)]
    with ThreadPoolExecutor(2) as pool:
        fetched = fetch_sources(bucket, sources, pool)
        assert merge_blocks(bucket, sources, job="j", token=1, level=0, fetched=fetched).rows_out == 200
        assert fetched == {}  # each object's bytes were taken once read
        fetched = fetch_sources(bucket, sources, pool)
        key = block_file_key(sources[1], sources[1].files[0].name)
        good = fetched[key].result()
        fetched[key] = pool.submit(lambda: good[:-9] + bytes([good[-9] ^ 1]) + good[-8:])
        with pytest.raises(CorruptObjectError, match=r"meta\.json says"):
            merge_blocks(bucket, sources, job="j", token=2, level=0, fetched=fetched)


def test_a_merge_keeps_records_of_two_topic_incarnations() -> None:
    """Issue 26 case 1: a topic deleted and recreated starts again at offset 0. A merge of one block of each
    incarnation, with equal offsets and times, holds all their records: they are other records, not copies."""
    bucket = open_bucket_url("memory://test-merge-incarnations")
    old, new = "AAAAAAAAAAAAAAAAAAAAAA", "BBBBBBBBBBBBBBBBBBBBBB"
    sources = [write_backup_block(bucket, "acme", "app", 0, 0, 3, incarnation=inc) for inc in (old, new)]
    result = merge_blocks(bucket, sources, job="j", token=1, level=0)
    assert result.rows_in == result.rows_out == 6
    assert sorted((r.incarnation, r.start, r.end) for r in result.output.kafka) == [(old, 0, 3), (new, 0, 3)]
    # A later merge of that output with a copy of one incarnation's block: the output cannot tell which of its
    # rows at offsets 0-2 is of which incarnation, so nothing of it is taken for a copy (a row is dropped only on
    # proof); the plain copy's rows are kept too, and the metastore accepts rows out == rows in.
    again = merge_blocks(bucket, [result.output, write_backup_block(bucket, "acme", "app", 0, 0, 3, incarnation=new,
                                                                   block_time_ms=BASE_MS + 1)],
                         job="j2", token=1, level=1)
    assert (again.rows_in, again.rows_out) == (9, 9)
    # Two copies of one incarnation's block: the copy's rows are dropped.
    copies = [write_backup_block(bucket, "acme", "app", 0, 0, 3, incarnation=new, block_time_ms=BASE_MS + t)
              for t in (2, 3)]
    assert merge_blocks(bucket, copies, job="j3", token=1, level=0).rows_out == 3
