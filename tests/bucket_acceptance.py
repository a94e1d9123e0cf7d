"""The acceptance suite every bucket implementation passes (the Thanos objstore habit: one suite, every backend).

Each test takes a ``bucket`` fixture; tests/unit/objstore/test_acceptance.py provides it for the memory and local
filesystem buckets, tests/integration/test_objstore_acceptance.py for a real MinIO server, so `make unit` builds no
service."""

from __future__ import annotations

import threading

import pytest

from shale.errors import ConflictError, InvalidNameError, NotFoundError
from shale.objstore import ObstoreBucket

__all__ = [
    "test_concurrent_put_if_match_has_exactly_one_winner",
    "test_delete_is_idempotent",
    "test_deletion_marks_compaction_and_cleaning",
    "test_every_call_is_counted",
    "test_list_dirs_returns_one_level_of_common_prefixes",
    "test_list_is_ordered_prefixed_and_resumable",
    "test_missing_objects_raise_not_found",
    "test_put_get_head_and_ranges",
    "test_put_if_absent_never_overwrites",
    "test_put_if_match_is_compare_and_swap",
    "test_unclean_keys_are_rejected",
]


def test_put_get_head_and_ranges(bucket: ObstoreBucket) -> None:
    result = bucket.put("t/blocks/A/data.parquet", b"0123456789")
    assert result.etag
    assert bucket.get("t/blocks/A/data.parquet") == b"0123456789"
    assert bucket.get_range("t/blocks/A/data.parquet", 2, 5) == b"234"
    assert bucket.get_range("t/blocks/A/data.parquet", 5, 5) == b""
    info = bucket.head("t/blocks/A/data.parquet")
    assert info.size == 10
    assert info.etag == result.etag
    assert info.last_modified > 1_600_000_000


def test_missing_objects_raise_not_found(bucket: ObstoreBucket) -> None:
    for call in (lambda: bucket.get("nope/x"), lambda: bucket.head("nope/x"),
                 lambda: bucket.get_range("nope/x", 0, 3)):
        with pytest.raises(NotFoundError, match="nope/x"):
            call()


def test_put_if_absent_never_overwrites(bucket: ObstoreBucket) -> None:
    bucket.put_if_absent("t/meta.json", b"first")
    with pytest.raises(ConflictError):
        bucket.put_if_absent("t/meta.json", b"second")
    assert bucket.get("t/meta.json") == b"first"


def test_put_if_match_is_compare_and_swap(bucket: ObstoreBucket) -> None:
    first = bucket.put_if_absent("t/bucket-index.json.gz", b"v1")
    assert first.etag is not None
    second = bucket.put_if_match("t/bucket-index.json.gz", b"v2", first.etag)
    assert second.etag is not None
    assert second.etag != first.etag
    with pytest.raises(ConflictError):
        bucket.put_if_match("t/bucket-index.json.gz", b"v3", first.etag)  # stale etag
    assert bucket.get("t/bucket-index.json.gz") == b"v2"
    with pytest.raises(ConflictError):
        bucket.put_if_match("t/missing.json", b"x", first.etag)


def test_concurrent_put_if_match_has_exactly_one_winner(bucket: ObstoreBucket) -> None:
    etag = bucket.put_if_absent("t/cas", b"base").etag
    assert etag is not None
    wins: list[bytes] = []
    losses: list[bytes] = []
    barrier = threading.Barrier(6)

    def contend(i: int) -> None:
        data = f"writer-{i}".encode()
        barrier.wait()
        try:
            bucket.put_if_match("t/cas", data, etag)
            wins.append(data)
        except ConflictError:
            losses.append(data)

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1
    assert len(losses) == 5
    assert bucket.get("t/cas") == wins[0]


def test_list_is_ordered_prefixed_and_resumable(bucket: ObstoreBucket) -> None:
    keys = [f"t/deltas/{i:04d}.json" for i in range(12)] + ["t/other", "u/x"]
    for key in reversed(keys):
        bucket.put(key, b"x")
    listed = [i.key for i in bucket.list("t/deltas/")]
    assert listed == keys[:12]
    after = [i.key for i in bucket.list("t/deltas/", start_after="t/deltas/0007.json")]
    assert after == keys[8:12]
    assert [i.key for i in bucket.list("t/")] == [*keys[:12], "t/other"]
    assert all(i.size == 1 for i in bucket.list("t/"))


def test_delete_is_idempotent(bucket: ObstoreBucket) -> None:
    bucket.put("t/x", b"x")
    bucket.delete("t/x")
    bucket.delete("t/x")
    with pytest.raises(NotFoundError):
        bucket.get("t/x")
    assert list(bucket.list("t/")) == []


@pytest.mark.parametrize("key", ["", "/abs", "a//b", "a/../b", "a/./b"])
def test_unclean_keys_are_rejected(bucket: ObstoreBucket, key: str) -> None:
    with pytest.raises(InvalidNameError):
        bucket.put(key, b"x")


def test_every_call_is_counted(bucket: ObstoreBucket) -> None:
    bucket.calls.reset()
    bucket.put("t/a", b"1")
    bucket.get("t/a")
    bucket.head("t/a")
    list(bucket.list("t/"))
    with pytest.raises(NotFoundError):
        bucket.get("t/missing")
    counts = bucket.calls.snapshot()
    assert counts == {"get": 2, "get_range": 0, "head": 1, "list": 1, "put": 1, "delete": 0}


def test_list_dirs_returns_one_level_of_common_prefixes(bucket: ObstoreBucket) -> None:
    for key in ("acme/blocks/A/meta.json", "acme/markers/A-deletion-mark.json", "beta/blocks/B/x", "_shale/dlq/g/1"):
        bucket.put(key, b"x")
    assert bucket.list_dirs("") == ["_shale/", "acme/", "beta/"]
    assert bucket.list_dirs("acme/") == ["acme/blocks/", "acme/markers/"]
    assert bucket.list_dirs("nobody/") == []


def test_deletion_marks_compaction_and_cleaning(bucket: ObstoreBucket) -> None:
    """What compaction and the cleaner do to a bucket (and so what ``make demo`` needs of its filesystem bucket):
    a block's objects written create-only, a deletion mark written once (a second writer keeps the first mark),
    the marks listed, then the block and its mark deleted, after which neither listing shows them."""
    from shale.block.ids import new_block_id
    from shale.block.layout import (
        Place,
        block_file_key,
        block_prefix,
        deletion_mark_key,
        markers_prefix,
        meta_key,
        parse_mark_key,
        tenant_group_prefix,
    )
    from shale.block.marks import write_deletion_mark

    old, new = new_block_id(), new_block_id()
    for block in (old, new):
        bucket.put_if_absent(block_file_key(Place("acme", block), "records.parquet"), b"rows")
        bucket.put_if_absent(meta_key(Place("acme", block)), b"{}")
    first = write_deletion_mark(bucket, "acme", old, 1000.0, "compacted")
    again = write_deletion_mark(bucket, "acme", old, 2000.0, "compacted")
    assert again == first  # the delete delay counts from the first mark
    marked = [parse_mark_key(i.key) for i in bucket.list(markers_prefix("acme"))]
    assert marked == [("acme", old)]
    for info in list(bucket.list(block_prefix(Place("acme", old)))):
        bucket.delete(info.key)
    bucket.delete(deletion_mark_key("acme", old))
    assert [i.key for i in bucket.list("group=backup/")] == sorted(
        [block_file_key(Place("acme", new), "records.parquet"), meta_key(Place("acme", new))])
    assert [parse_mark_key(i.key) for i in bucket.list(markers_prefix("acme"))] == []
    assert bucket.list_dirs(tenant_group_prefix("acme", "backup")) == [block_prefix(Place("acme", new))]
