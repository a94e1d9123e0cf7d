"""The index record: its bytes, its validation, the live-block rule, and the package's public surface."""

from __future__ import annotations

import gc
import gzip
import json

import pytest
from tests.unit.bucketindex.helpers import T0, block

import shale.bucketindex as bucketindex
from shale.block import bucket_index_key
from shale.bucketindex import BucketIndex, IndexedMark, live_blocks
from shale.errors import CorruptObjectError

KEY = bucket_index_key("acme")


def _index() -> BucketIndex:
    a, b = block("acme", 1), block("acme", 2)  # b's id sorts first: build() orders blocks by id
    return BucketIndex.build("acme", T0, [b, a], [IndexedMark(id=a.id, deletion_time=T0 - 5, reason="retention")],
                             {a.id: T0 - 100, b.id: T0 - 50}, watermark="acme/bucket-index-deltas/x.json")


def test_round_trip_is_gzip_json_with_full_block_metas() -> None:
    index = _index()
    data = index.to_bytes()
    assert data[:2] == b"\x1f\x8b"
    raw = json.loads(gzip.decompress(data))
    assert raw["version"] == 1
    assert raw["tenant"] == "acme"
    assert raw["updated_at"] == T0
    assert raw["watermark"] == "acme/bucket-index-deltas/x.json"
    assert raw["blocks"] == [b.model_dump(mode="json", exclude_none=True) for b in index.blocks]
    assert [b["id"] for b in raw["blocks"]] == sorted(b["id"] for b in raw["blocks"])
    marked = block("acme", 1).id
    assert raw["deletion_marks"] == [{"id": marked, "deletion_time": T0 - 5, "reason": "retention"}]
    assert raw["uploaded"] == {marked: T0 - 100, block("acme", 2).id: T0 - 50}
    assert BucketIndex.parse(data, tenant="acme", key=KEY) == index
    assert _index().to_bytes() == data, "equal contents must give equal bytes"
    # Serialized a block at a time (the GIL is released between them), the bytes are those of one call.
    whole = gzip.compress(index.model_dump_json(exclude_none=True).encode(), compresslevel=6, mtime=0)
    assert data == whole
    empty = BucketIndex.empty("acme", T0)
    assert gzip.decompress(empty.to_bytes()) == empty.model_dump_json(exclude_none=True).encode()


@pytest.mark.parametrize(("data", "expected"), [
    (b"not gzip at all", "not gzip data"),
    (gzip.compress(b"{not json"), "is invalid"),
    (gzip.compress(b'{"version": 1, "tenant": "acme"}'), "updated_at"),
    (gzip.compress(b'{"version": 1, "tenant": "acme", "updated_at": 1, "extra": 1}'), "extra"),
    (gzip.compress(b'{"version": 2, "tenant": "acme", "updated_at": 1, "shiny": []}'), "version 2"),
    (gzip.compress(b'{"version": 1, "tenant": "other", "updated_at": 1}'), "belongs to tenant other"),
])
def test_a_bad_index_is_corrupt_and_names_tenant_and_key(data: bytes, expected: str) -> None:
    with pytest.raises(CorruptObjectError) as info:
        BucketIndex.parse(data, tenant="acme", key=KEY)
    message = str(info.value)
    assert expected in message
    assert "acme" in message
    assert KEY in message
    assert info.value.key == KEY
    assert ("Upgrade Shale" in message) if expected == "version 2" else ("shale bucket index --tenant acme" in message)


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
