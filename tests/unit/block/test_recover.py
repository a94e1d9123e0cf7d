"""A block whose meta.json was lost is recovered from its objects' footers, which carry its metadata and the
CRC32 of those bytes (seed 004; issue 26 case 15): by a rebuild of the index from the bucket, and by the cleaner
for a block the index holds. A footer that fails its CRC, or a missing object, recovers nothing."""

from __future__ import annotations

import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tests.factories import BASE_MS, backup_table, write_backup_block

from shale.block import BlockFetcher, Cleaner, MetastoreView, block_file_key, block_prefix, meta_key, read_meta
from shale.block.reader import footer_bytes
from shale.block.recover import recover_meta
from shale.block.writer import FOOTER_CRC_KEY, FOOTER_META_KEY
from shale.errors import CorruptObjectError
from shale.metastore import CommitIngestBatch, MetastoreService, OffsetRange, SingleNodeLog, StateMachine
from shale.metastore.raft.rebuild import rebuild_from_bucket
from shale.objstore import ObstoreBucket, open_bucket_url


@pytest.fixture
def bucket() -> ObstoreBucket:
    return open_bucket_url(f"memory://recover-{uuid.uuid4().hex}")


def test_a_rebuild_recovers_a_committed_block_that_lost_its_meta_json(tmp_path: Path, bucket: ObstoreBucket) -> None:
    state = StateMachine(tmp_path / "state.db")
    service = MetastoreService(state, SingleNodeLog(state))
    blocks = [write_backup_block(bucket, "acme", "app", 0, start, 10) for start in (0, 10, 20)]
    for block in blocks:
        (r,) = block.kafka
        assert service.submit(CommitIngestBatch(group="backup", blocks=[block], ranges=[
            OffsetRange(topic="app", partition=0, start=r.start, end=r.end)])).ok
    bucket.delete(meta_key(blocks[1]))  # lost (an operator's mistake, a bucket policy)
    report = rebuild_from_bucket(bucket, tmp_path / "rebuilt.db")
    assert report.recovered == [blocks[1].id]
    rebuilt = StateMachine(tmp_path / "rebuilt.db")
    assert sorted(m.id for m in rebuilt.reader.query_blocks(["acme"], 0, 2**62)) == sorted(b.id for b in blocks)
    assert [o.committed_end for o in rebuilt.reader.offsets()] == [30]  # not cut at the lost block
    recovered = rebuilt.reader.get_block(blocks[1].id)
    assert recovered is not None
    assert recovered.logical_key() == blocks[1].logical_key()
    assert recovered.files == blocks[1].files


def test_the_cleaner_writes_back_the_meta_json_of_an_indexed_block(bucket: ObstoreBucket) -> None:
    block = write_backup_block(bucket, "acme", "app", 0, 0, 10)
    bucket.delete(meta_key(block))
    cleaner = Cleaner(bucket, BlockFetcher(bucket, sync_delay=0), delete_delay=0)
    report = cleaner.run("acme", metastore=lambda: MetastoreView(indexed=frozenset({block.id})))
    assert [a.kind for a in report.actions] == ["recover"]
    assert read_meta(bucket, block) == block
    unindexed = write_backup_block(bucket, "acme", "app", 0, 10, 10)  # an upload that never committed
    bucket.delete(meta_key(unindexed))
    report = cleaner.run("acme", metastore=lambda: MetastoreView(indexed=frozenset({block.id})))
    assert [(a.kind, a.block_id) for a in report.actions] == [("mark", unindexed.id)]


def test_a_footer_that_fails_its_crc_recovers_nothing(bucket: ObstoreBucket) -> None:
    block = write_backup_block(bucket, "acme", "app", 0, 0, 10)
    key = block_file_key(block, block.files[0].name)
    footer = (pq.read_metadata(pa.BufferReader(bucket.get(key))).metadata or {})[FOOTER_META_KEY]
    tampered = backup_table("app", 0, 0, 10, BASE_MS).replace_schema_metadata(
        {FOOTER_META_KEY: footer.replace(b'"rows":10', b'"rows":11'), FOOTER_CRC_KEY: b"00000000"})
    sink = pa.BufferOutputStream()
    pq.write_table(tampered, sink)
    bucket.delete(meta_key(block))
    bucket.delete(key)
    bucket.put(key, sink.getvalue().to_pybytes())
    with pytest.raises(CorruptObjectError, match="fails its CRC32"):
        footer_bytes(bucket, key, bucket.head(key).size)
    meta, why = recover_meta(bucket, "acme", block.id, list(bucket.list(block_prefix(block))))
    assert meta is None
    assert "CRC32" in why
