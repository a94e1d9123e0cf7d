"""Writing and reading blocks: meta.json last, checksums, footers, idempotent rewrites."""

from __future__ import annotations

import uuid

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.factories import BASE_MS, backup_table, write_backup_block

from shale.block import (
    BlockSpec,
    DatasetInput,
    DatasetStream,
    KafkaRange,
    block_file_key,
    deterministic_block_id,
    meta_key,
    read_dataset,
    read_footer_meta,
    read_meta,
    write_block,
    write_block_streamed,
)
from shale.block.reader import arrow_owned
from shale.errors import ConflictError, CorruptObjectError
from shale.objstore import ObstoreBucket, open_bucket_url
from shale.objstore.testing import Fault, FaultyBucket


@pytest.fixture
def bucket() -> ObstoreBucket:
    return open_bucket_url(f"memory://block-{uuid.uuid4().hex}")


class RecordingBucket(FaultyBucket):
    """Records the order of writes."""

    def __init__(self, inner: ObstoreBucket) -> None:
        super().__init__(inner)
        self.writes: list[str] = []

    def put(self, key: str, data: bytes):  # type: ignore[no-untyped-def]
        self.writes.append(key)
        return super().put(key, data)

    def put_if_absent(self, key: str, data: bytes):  # type: ignore[no-untyped-def]
        self.writes.append(key)
        return super().put_if_absent(key, data)


def test_meta_json_is_written_last_and_everything_reads_back(bucket: ObstoreBucket) -> None:
    recording = RecordingBucket(bucket)
    meta = write_backup_block(recording, "acme", "app", 0, 100, 250)  # type: ignore[arg-type]
    assert recording.writes[-1] == meta_key(meta)
    assert recording.writes[:-1] == [block_file_key(meta, "records-0.parquet")]
    assert meta.rows == 250
    assert meta.kafka == [KafkaRange(topic="app", partition=0, start=100, end=350)]
    assert meta.min_time == BASE_MS
    assert meta.max_time == BASE_MS + 249_000
    assert meta.compaction.sources == [meta.id]
    assert read_meta(bucket, meta) == meta
    table = read_dataset(bucket, meta, "records/app")
    assert table.equals(backup_table("app", 0, 100, 250))
    ranged = read_dataset(bucket, meta, "records/app", columns=["offset"], whole_object=False,
                          filters=[("offset", ">=", 300)])
    assert ranged.column("offset").to_pylist() == list(range(300, 350))
    info = meta.file("records-0.parquet")
    footer = read_footer_meta(bucket, block_file_key(meta, info.name), info.size)
    assert footer == meta.model_copy(update={"files": []})


def test_small_objects_are_read_whole_and_large_ones_by_range(bucket: ObstoreBucket,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    meta = write_backup_block(bucket, "acme", "app", 0, 0, 500)
    bucket.calls.reset()
    table = read_dataset(bucket, meta, "records/app", columns=["offset", "value"], whole_object=None)
    assert table.num_rows == 500
    assert bucket.calls.snapshot()["get"] == 1
    assert bucket.calls.snapshot()["get_range"] == 0
    monkeypatch.setattr("shale.block.reader.SMALL_OBJECT_BYTES", meta.size - 1)
    bucket.calls.reset()
    assert read_dataset(bucket, meta, "records/app", columns=["offset", "value"], whole_object=None).equals(table)
    assert bucket.calls.snapshot()["get"] == 0
    assert bucket.calls.snapshot()["get_range"] >= 1  # by range (Parquet's footer read spans this small object)


def test_row_group_table_of_contents(bucket: ObstoreBucket) -> None:
    table = backup_table("app", 0, 0, 1000)
    spec = BlockSpec(id=deterministic_block_id(BASE_MS, "toc"), tenant="acme", group="backup")
    meta = write_block(bucket, spec, [DatasetInput("records", "app", table, "timestamp")], row_group_rows=300)
    assert meta.datasets[0].row_groups == [
        (300, BASE_MS, BASE_MS + 299_000), (300, BASE_MS + 300_000, BASE_MS + 599_000),
        (300, BASE_MS + 600_000, BASE_MS + 899_000), (100, BASE_MS + 900_000, BASE_MS + 999_000)]


def test_rewriting_the_same_block_is_a_no_op(bucket: ObstoreBucket) -> None:
    first = write_backup_block(bucket, "acme", "app", 0, 0, 10)
    bucket.calls.reset()
    again = write_backup_block(bucket, "acme", "app", 0, 0, 10)
    assert again == first
    assert bucket.calls.snapshot()["put"] == 0  # found complete: nothing uploaded again


def test_a_different_block_under_the_same_id_is_a_conflict(bucket: ObstoreBucket) -> None:
    first = write_backup_block(bucket, "acme", "app", 0, 0, 10)
    spec = BlockSpec(id=first.id, tenant="acme", group="backup",
                     kafka=[KafkaRange(topic="app", partition=0, start=0, end=11)])
    with pytest.raises(ConflictError, match="already exists with different contents"):
        write_block(bucket, spec, [DatasetInput("records", "app", backup_table("app", 0, 0, 11), "timestamp")])


def test_a_lost_meta_json_answer_is_recovered_by_reading_it_back(bucket: ObstoreBucket) -> None:
    faulty = FaultyBucket(bucket, [Fault("put", key=r"meta\.json$", after=True)])
    table = backup_table("app", 0, 0, 5)
    spec = BlockSpec(id=deterministic_block_id(BASE_MS, "lost"), tenant="acme", group="backup")
    with pytest.raises(Exception, match="injected"):
        write_block(faulty, spec, [DatasetInput("records", "app", table, "timestamp")])  # type: ignore[arg-type]
    again = write_block(faulty, spec, [DatasetInput("records", "app", table, "timestamp")])  # type: ignore[arg-type]
    assert again.rows == 5


def test_corrupt_data_is_detected_naming_the_block_and_file(bucket: ObstoreBucket) -> None:
    meta = write_backup_block(bucket, "acme", "app", 0, 0, 20)
    key = block_file_key(meta, "records-0.parquet")
    data = bytearray(bucket.get(key))
    data[len(data) // 2] ^= 0xFF
    bucket.put(key, bytes(data))
    with pytest.raises(CorruptObjectError, match=f"block acme/{meta.id} file records-0.parquet is corrupt"):
        read_dataset(bucket, meta, "records/app")


def test_truncated_data_fails_ranged_reads_too(bucket: ObstoreBucket) -> None:
    meta = write_backup_block(bucket, "acme", "app", 0, 0, 20)
    key = block_file_key(meta, "records-0.parquet")
    bucket.put(key, b"PAR1" + b"\x00" * (meta.file("records-0.parquet").size - 4))
    with pytest.raises(CorruptObjectError, match="cannot be read"):
        read_dataset(bucket, meta, "records/app", whole_object=False)


def test_multiple_datasets_and_empty_tables(bucket: ObstoreBucket) -> None:
    spec = BlockSpec(id=deterministic_block_id(BASE_MS, "multi"), tenant="acme", group="backup")
    empty = backup_table("b", 0, 0, 0)
    meta = write_block(bucket, spec, [DatasetInput("records", "a", backup_table("a", 0, 0, 3), "timestamp"),
                                      DatasetInput("records", "b", empty, "timestamp")])
    assert [d.name for d in meta.datasets] == ["records/a", "records/b"]
    assert [f.name for f in meta.files] == ["records-0.parquet", "records-1.parquet"]
    assert read_dataset(bucket, meta, "records/b").num_rows == 0
    assert (meta.min_time, meta.max_time) == (BASE_MS, BASE_MS + 2000)
    assert isinstance(read_dataset(bucket, meta, "records/a"), pa.Table)


def test_a_streamed_block_equals_the_block_written_whole(bucket: ObstoreBucket) -> None:
    """``write_block_streamed`` (row groups encoded one at a time, as compaction writes) gives the same metadata
    (rows, row-group table of contents, time bounds, labels) and the same rows as ``write_block``, its footer
    included, and still writes meta.json last."""
    table = backup_table("app", 0, 0, 250)
    spec = BlockSpec(id=deterministic_block_id(BASE_MS, "whole"), tenant="acme", group="backup",
                     kafka=[KafkaRange(topic="app", partition=0, start=0, end=250)])
    whole = write_block(bucket, spec, [DatasetInput("records", "app", table, "timestamp", [{"topic": "app"}])],
                        row_group_rows=100)
    recording = RecordingBucket(bucket)
    streamed_spec = BlockSpec(**{**vars(spec), "id": deterministic_block_id(BASE_MS, "streamed")})
    groups = (table.slice(start, 100) for start in range(0, 250, 100))
    streamed = write_block_streamed(recording, streamed_spec,  # type: ignore[arg-type]
                                    [DatasetStream("records", "app", table.schema, groups, "timestamp",
                                                   [{"topic": "app"}])], row_group_rows=100)
    assert recording.writes[-1] == meta_key(streamed)
    assert streamed.datasets == whole.datasets
    assert (streamed.rows, streamed.min_time, streamed.max_time) == (whole.rows, whole.min_time, whole.max_time)
    assert read_dataset(bucket, streamed, "records/app").equals(read_dataset(bucket, whole, "records/app"))
    key = block_file_key(streamed, "records-0.parquet")
    assert read_footer_meta(bucket, key, streamed.files[0].size) == streamed.model_copy(update={"files": []})
    with pytest.raises(ValueError, match="at most 100"):
        write_block_streamed(bucket, BlockSpec(**{**vars(spec), "id": deterministic_block_id(BASE_MS, "big")}),
                             [DatasetStream("records", "app", table.schema, [table], "timestamp")],
                             row_group_rows=100)


def _spec(key: str = "race") -> BlockSpec:
    return BlockSpec(id=deterministic_block_id(BASE_MS, key), tenant="acme", group="backup",
                     kafka=[KafkaRange(topic="app", partition=0, start=0, end=300)])


def _dataset() -> list[DatasetInput]:
    return [DatasetInput("records", "app", backup_table("app", 0, 0, 300), "timestamp", labels=[{"topic": "app"}])]


def test_a_second_writer_never_replaces_data_objects(bucket: ObstoreBucket) -> None:
    """Issue 26 case 16: two writers of one deterministic id whose encodings differ (here: row groups of another
    size). The second's data put used to overwrite the first's bytes, so a meta.json could name a CRC its object
    no longer had. Data puts are put-if-absent now: the later writer adopts the bytes already there."""
    first = write_block(bucket, _spec(), _dataset(), row_group_rows=50)
    bucket.delete(meta_key(first))  # as if the first writer died before meta.json
    key = block_file_key(first, first.files[0].name)
    before = bucket.get(key)
    second = write_block(bucket, _spec(), _dataset(), row_group_rows=1000)  # other bytes, same contents
    assert bucket.get(key) == before
    assert second.files == first.files  # meta.json names the bytes in the bucket
    assert read_dataset(bucket, read_meta(bucket, first), "records/app").num_rows == 300


def test_a_foreign_object_under_a_blocks_key_is_not_overwritten(bucket: ObstoreBucket) -> None:
    spec = _spec("foreign")
    key = block_file_key(spec, "records-0.parquet")
    bucket.put(key, b"something else")
    with pytest.raises(ConflictError, match="not a Shale data object"):
        write_block(bucket, spec, _dataset())
    assert bucket.get(key) == b"something else"
    other = [DatasetInput("records", "app", backup_table("app", 0, 0, 10), "timestamp", labels=[{"topic": "app"}])]
    write_block(bucket, _spec("other"), other)  # a data object of other contents under this id's key: refused
    bucket.delete(meta_key(_spec("other")))
    with pytest.raises(ConflictError, match="different contents"):
        write_block(bucket, _spec("other"), _dataset())


@given(st.binary(max_size=4096))
def test_a_filtered_read_gets_its_own_copy_of_the_object_in_arrow_memory(data: bytes) -> None:
    """The datasets layer may release its source on an Arrow thread at interpreter exit; a buffer over the Python
    bytes would need the GIL there (an abort after a complete answer). The copy is equal and shares nothing."""
    copy = arrow_owned(data)
    assert copy.to_pybytes() == data
    if data:
        assert copy.address != pa.py_buffer(data).address


def test_the_parquet_encoder_slices_a_contiguous_table(bucket: ObstoreBucket, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch's table comes in one chunk per partition; slicing it walks the chunks, once per row group: writing a
    block of 10,000 partitions took 27 s against 0.5 s for 1,000. The writer combines the chunks first."""
    from shale.block import writer
    from shale.config import BucketConfig, IngestConfig
    from shale.encoder.chunks import Chunk, GroupSpec, write_chunks

    chunks_seen: list[int] = []
    encode = writer.encode_parquet

    def counting(table: pa.Table, *args: object, **kwargs: object) -> bytes:
        chunks_seen.append(max(c.num_chunks for c in table.columns))
        return encode(table, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(writer, "encode_parquet", counting)
    table = pa.concat_tables([backup_table("orders", p, 0, 2) for p in range(80)])
    spec = GroupSpec("backup", 1, BucketConfig(url="memory://contiguous"), IngestConfig(default_tenant="acme"))
    (written, *_) = write_chunks(spec, bucket, table, [Chunk("orders", p, "", 0, 2, BASE_MS) for p in range(80)])
    assert chunks_seen == [1]
    (block,) = written.blocks
    assert block.datasets[0].row_group_partitions == list(range(80))
