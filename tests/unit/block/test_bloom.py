"""The key bloom filters: XXH64 against its published vectors, and ``may_hold_key`` against filters pyarrow wrote
(every key written is found; keys not written are ruled out but for the filter's false positives)."""

from __future__ import annotations

import uuid

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.factories import write_backup_block

from shale.block import BlockSpec, DatasetInput, KafkaRange, deterministic_block_id, write_block
from shale.block.bloom import BLOOM_FPP, xxh64
from shale.block.reader import may_hold_key
from shale.block.schemas import BACKUP_SCHEMA
from shale.config import BucketConfig
from shale.objstore import open_bucket


def test_xxh64_gives_the_reference_values() -> None:
    assert xxh64(b"") == 0xEF46DB3751D8E999
    assert xxh64(b"a") == 0xD24EC4F1A98C6E5B
    assert xxh64(b"abc") == 0x44BC2CF5AD770999


@settings(max_examples=20, deadline=None, derandomize=True)
@given(st.lists(st.binary(min_size=0, max_size=90), min_size=1, max_size=300, unique=True))
def test_every_key_written_is_found_whatever_its_length(keys: list[bytes]) -> None:
    """Keys of 0 to 90 bytes cover each XXH64 path (under 4, 8 and 32 bytes, and the 32-byte stripes)."""
    bucket = open_bucket(BucketConfig(url=f"memory://bloom-{uuid.uuid4().hex}"))
    n = len(keys)
    table = pa.table({
        "topic": ["app"] * n, "partition": pa.array([0] * n, pa.int32()), "offset": pa.array(range(n), pa.int64()),
        "timestamp": pa.array([1_795_000_000_000 + i for i in range(n)], pa.timestamp("ms", tz="UTC")),
        "timestamp_type": pa.array([0] * n, pa.int8()), "key": pa.array(keys, pa.binary()),
        "value": pa.array([b"v"] * n, pa.binary()), "headers": pa.array([[]] * n, BACKUP_SCHEMA.field("headers").type),
    }, schema=BACKUP_SCHEMA)
    spec = BlockSpec(id=deterministic_block_id(1_795_000_000_000, uuid.uuid4().hex), tenant="acme", group="backup",
                     kafka=[KafkaRange(topic="app", partition=0, start=0, end=n)])
    meta = write_block(bucket, spec, [DatasetInput("records", "app", table, "timestamp")])
    assert all(may_hold_key(bucket, meta, meta.datasets[0], k) for k in keys)


def test_keys_not_written_are_ruled_out_but_for_false_positives() -> None:
    bucket = open_bucket(BucketConfig(url=f"memory://bloom-{uuid.uuid4().hex}"))
    meta = write_backup_block(bucket, "acme", "app", 0, 0, 2000)  # keys k0 .. k1999
    dataset = meta.datasets[0]
    assert all(may_hold_key(bucket, meta, dataset, f"k{o}".encode()) for o in range(0, 2000, 7))
    wrong = sum(may_hold_key(bucket, meta, dataset, f"other-{o}".encode()) for o in range(3000))
    assert wrong <= 3000 * BLOOM_FPP * 3
