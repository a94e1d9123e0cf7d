"""The index record: its bytes, its validation, the live-block rule, and the package's public surface."""

from __future__ import annotations

import gc
import gzip
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.bucketindex.helpers import T0, block

import shale.bucketindex as bucketindex
from shale.block import KafkaRange, bucket_index_key
from shale.bucketindex import BucketIndex, IndexedMark, live_blocks
from shale.bucketindex.model import SUMMARY_EXCLUDE
from shale.errors import CorruptObjectError

KEY = bucket_index_key("acme")


def _index() -> BucketIndex:
    a, b = block("acme", 1), block("acme", 2)  # b's id sorts first: build() orders blocks by id
    return BucketIndex.build("acme", T0, [b, a], [IndexedMark(id=a.id, deletion_time=T0 - 5, reason="retention")],
                             {a.id: T0 - 100, b.id: T0 - 50}, watermark="acme/bucket-index-deltas/x.json")


def test_round_trip_is_gzip_json_with_block_summaries() -> None:
    index = _index()
    data = index.to_bytes()
    assert data[:2] == b"\x1f\x8b"
    raw = json.loads(gzip.decompress(data))
    assert raw["version"] == 2
    assert raw["tenant"] == "acme"
    assert raw["updated_at"] == T0
    assert raw["watermark"] == "acme/bucket-index-deltas/x.json"
    assert raw["blocks"] == [b.model_dump(mode="json", exclude_none=True, exclude=SUMMARY_EXCLUDE)
                             for b in index.blocks]
    assert all("kafka" not in b and all("row_groups" not in d for d in b["datasets"]) for b in raw["blocks"])
    assert [b["id"] for b in raw["blocks"]] == sorted(b["id"] for b in raw["blocks"])
    marked = block("acme", 1).id
    assert raw["deletion_marks"] == [{"id": marked, "deletion_time": T0 - 5, "reason": "retention"}]
    assert raw["uploaded"] == {marked: T0 - 100, block("acme", 2).id: T0 - 50}
    parsed = BucketIndex.parse(data, tenant="acme", key=KEY)
    assert all(b.summary for b in parsed.blocks)
    assert not any(b.summary for b in index.blocks)
    assert [b.model_dump(exclude=SUMMARY_EXCLUDE) for b in parsed.blocks] == \
        [b.model_dump(exclude=SUMMARY_EXCLUDE) for b in index.blocks]
    assert parsed.model_copy(update={"blocks": []}) == index.model_copy(update={"blocks": []})
    assert parsed.to_bytes() == data, "a parsed index writes the same bytes"
    assert _index().to_bytes() == data, "equal contents must give equal bytes"
    empty = BucketIndex.empty("acme", T0)
    assert gzip.decompress(empty.to_bytes()) == empty.model_dump_json(exclude_none=True).encode()


def test_an_index_of_the_previous_release_is_read_with_full_block_metas() -> None:
    index = _index()
    previous = index.model_copy(update={"version": 1})
    data = gzip.compress(previous.model_dump_json(exclude_none=True).encode(), mtime=0)
    parsed = BucketIndex.parse(data, tenant="acme", key=KEY)
    assert parsed == previous
    assert not any(b.summary for b in parsed.blocks)
    assert parsed.blocks[0].kafka
    assert parsed.blocks[0].kafka == index.blocks[0].kafka


@given(st.integers(min_value=1, max_value=3_000))
@settings(max_examples=10, deadline=None)
def test_an_entry_does_not_grow_with_the_partitions_its_block_spans(partitions: int) -> None:
    one = block("acme", 1)
    many = one.model_copy(update={"kafka": [KafkaRange(topic="t", partition=p, start=p * 7, end=p * 7 + 5)
                                            for p in range(partitions)]})
    size = len(BucketIndex.build("acme", T0, [one]).to_bytes())
    assert len(BucketIndex.build("acme", T0, [many]).to_bytes()) == size


@pytest.mark.parametrize(("data", "expected"), [
    (b"not gzip at all", "not gzip data"),
    (gzip.compress(b"{not json", mtime=0), "is invalid"),
    (gzip.compress(b'{"version": 1, "tenant": "acme"}', mtime=0), "updated_at"),
    (gzip.compress(b'{"version": 1, "tenant": "acme", "updated_at": 1, "extra": 1}', mtime=0), "extra"),
    (gzip.compress(b'{"version": 3, "tenant": "acme", "updated_at": 1, "shiny": []}', mtime=0), "version 3"),
    (gzip.compress(b'{"version": 1, "tenant": "other", "updated_at": 1}', mtime=0), "belongs to tenant other"),
])
def test_a_bad_index_is_corrupt_and_names_tenant_and_key(data: bytes, expected: str) -> None:
    with pytest.raises(CorruptObjectError) as info:
        BucketIndex.parse(data, tenant="acme", key=KEY)
    message = str(info.value)
    assert expected in message
    assert "acme" in message
    assert KEY in message
    assert info.value.key == KEY
    assert ("Upgrade Shale" in message) if expected == "version 3" else ("shale bucket index --tenant acme" in message)


def test_an_index_holding_another_tenants_block_or_a_duplicate_is_refused() -> None:
    foreign = block("other", 1)
    with pytest.raises(ValueError, match="other tenants"):
        BucketIndex(tenant="acme", updated_at=T0, blocks=[foreign])
    a = block("acme", 1)
    with pytest.raises(ValueError, match="twice"):
        BucketIndex(tenant="acme", updated_at=T0, blocks=[a, a])
    with pytest.raises(ValueError, match="twice"):
        BucketIndex(tenant="acme", updated_at=T0, deletion_marks=[IndexedMark(id=a.id, deletion_time=1)] * 2)


def test_live_blocks_skip_marked_and_fully_overlapped_blocks() -> None:
    a, b, c = block("acme", 1), block("acme", 2), block("acme", 3)
    ab = block("acme", 10, sources=[a.id, b.id], level=1)  # compacted a and b: both are overlapped
    abc = block("acme", 11, sources=[a.id, b.id, c.id], level=2)  # marked: it hides nothing
    index = BucketIndex.build("acme", T0, [a, b, c, ab, abc], [IndexedMark(id=abc.id, deletion_time=T0)])
    assert [m.id for m in live_blocks(index)] == sorted([c.id, ab.id])

    # The same compaction done twice (equal sources) keeps the greater id only.
    twin = block("acme", 12, sources=[a.id, b.id], level=1)
    index = BucketIndex.build("acme", T0, [a, b, c, ab, twin])
    assert [m.id for m in live_blocks(index)] == sorted([c.id, max(ab.id, twin.id)])

    # Unmarking the larger compaction makes it hide everything.
    index = BucketIndex.build("acme", T0, [a, b, c, ab, abc])
    assert [m.id for m in live_blocks(index)] == [abc.id]


def test_the_public_surface_is_what_all_claims() -> None:
    assert len(set(bucketindex.__all__)) == len(bucketindex.__all__)
    for name in bucketindex.__all__:
        value = getattr(bucketindex, name)
        if callable(value):
            assert value.__doc__, f"{name} has no docstring"
    assert {"BucketIndex", "BucketIndexReader", "BucketIndexWriter", "DeltaWriter", "IndexSource",
            "StaleIndexError", "scan_index", "write_scanned_index"} <= set(bucketindex.__all__)


def test_parsing_pauses_the_collector_and_restores_it_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    data = _index().to_bytes()
    validate = BucketIndex.model_validate_json
    during: list[bool] = []

    def spy(raw: bytes) -> BucketIndex:
        during.append(gc.isenabled())
        return validate(raw)

    monkeypatch.setattr(BucketIndex, "model_validate_json", spy)
    assert gc.isenabled()
    try:
        BucketIndex.parse(data, tenant="acme", key=KEY)
        assert during == [False], "paused while validating"
        assert live_blocks(BucketIndex.parse(data, tenant="acme", key=KEY))
        assert gc.isenabled(), "re-enabled after the parse"
        with pytest.raises(CorruptObjectError):
            BucketIndex.parse(gzip.compress(b"{}"), tenant="acme", key=KEY)
        assert gc.isenabled(), "re-enabled after a failed parse"
        gc.disable()
        BucketIndex.parse(data, tenant="acme", key=KEY)
        assert not gc.isenabled(), "left disabled if the application disabled it"
    finally:
        gc.enable()
