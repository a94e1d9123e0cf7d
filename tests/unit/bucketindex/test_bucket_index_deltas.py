"""Delta objects: their keys, their application to an index, and the watermark rule writers fold them by."""

from __future__ import annotations

import re
import uuid

import pytest
from tests.unit.bucketindex.helpers import T0, Clock, block

from shale.block import DeletionMark
from shale.block.layout import bucket_index_deltas_prefix
from shale.bucketindex import BucketIndex, DeltaWriter, IndexDelta, IndexedMark, apply_delta
from shale.bucketindex.deltas import ListedDelta, delta_time, fold_watermark, list_deltas, read_delta
from shale.errors import CorruptObjectError
from shale.objstore import ObstoreBucket, open_bucket_url


@pytest.fixture
def bucket() -> ObstoreBucket:
    return open_bucket_url(f"memory://deltas-{uuid.uuid4().hex}")


def test_keys_sort_in_write_order_within_and_across_milliseconds(bucket: ObstoreBucket) -> None:
    clock = Clock()
    writer = DeltaWriter(bucket, clock)
    keys = [writer.write("acme") for _ in range(3)]
    clock.advance(0.002)
    keys.append(writer.write("acme"))
    clock.advance(-10)  # a clock stepping back never makes a key sort before an earlier one
    keys.append(writer.write("acme"))
    assert keys == sorted(keys)
    assert len(set(keys)) == 5
    pattern = re.compile(r"^acme/bucket-index-deltas/(\d{13})-(\d{6})-[0-9a-f]+\.json$")
    parts = [pattern.match(k) for k in keys]
    assert all(parts)
    assert [int(p.group(2)) for p in parts if p] == [0, 1, 2, 0, 1]
    assert delta_time(keys[0]) == int(T0 * 1000) / 1000
    assert [i.key for i in list_deltas(bucket, "acme")] == keys
    assert [i.key for i in list_deltas(bucket, "acme", after=keys[2])] == keys[3:]


def test_a_delta_holds_blocks_marks_of_every_form_and_removals(bucket: ObstoreBucket) -> None:
    a, b, c, d = (block("acme", n) for n in range(4))
    key = DeltaWriter(bucket, Clock()).write(
        "acme", added=[a], removed=[d.id],
        marks=[DeletionMark(id=b.id, tenant="acme", deletion_time=T0 - 1, reason="partial"),
               (c.id, T0 - 2, "retention"), IndexedMark(id=d.id, deletion_time=T0, reason="x")])
    delta = read_delta(bucket, "acme", key)
    assert delta.added == [a]
    assert delta.removed == [d.id]
    assert [(m.id, m.deletion_time, m.reason) for m in delta.marks] == [
        (b.id, T0 - 1, "partial"), (c.id, T0 - 2, "retention"), (d.id, T0, "x")]
    assert delta.time == int(T0 * 1000) / 1000


def test_bad_deltas_are_refused(bucket: ObstoreBucket) -> None:
    with pytest.raises(ValueError, match="other tenants"):
        DeltaWriter(bucket, Clock()).write("acme", added=[block("other", 1)])
    key = bucket_index_deltas_prefix("acme") + "0000000000001-000000-ab.json"
    bucket.put(key, b"{broken")
    with pytest.raises(CorruptObjectError, match="delta of tenant acme is invalid") as info:
        read_delta(bucket, "acme", key)
    assert info.value.key == key
    bucket.put(key, IndexDelta(tenant="other", time=1).model_dump_json().encode())
    with pytest.raises(CorruptObjectError, match="says tenant other"):
        read_delta(bucket, "acme", key)


def test_apply_adds_marks_then_removes_and_is_idempotent() -> None:
    a, b, c = block("acme", 1), block("acme", 2), block("acme", 3)
    index = BucketIndex.build("acme", T0, [a, b], [IndexedMark(id=b.id, deletion_time=T0 - 10)], {a.id: 1.0})
    delta = IndexDelta(tenant="acme", time=T0 + 5, added=[c, a], removed=[a.id],
                       marks=[IndexedMark(id=b.id, deletion_time=T0 - 20, reason="earlier"),
                              IndexedMark(id=c.id, deletion_time=T0 + 5)])
    once = apply_delta(index, delta, "acme/bucket-index-deltas/k1")
    assert once.block_ids() == {b.id, c.id}
    assert {m.id: m.deletion_time for m in once.deletion_marks} == {b.id: T0 - 20, c.id: T0 + 5}
    assert once.uploaded == {c.id: T0 + 5}
    assert once.watermark == "acme/bucket-index-deltas/k1"
    assert once.updated_at == T0, "a delta does not make the index itself newer"
    assert apply_delta(once, delta, "acme/bucket-index-deltas/k1") == once


def _listed(*items: tuple[float, IndexDelta | None]) -> list[ListedDelta]:
    return [ListedDelta(f"acme/bucket-index-deltas/{int(t * 1000):013d}-000000-ab.json", d) for t, d in items]


def test_watermark_stops_at_the_margin_at_an_unreflected_delta_and_gives_up_after_the_limit() -> None:
    new, known = block("acme", 1), block("acme", 2)

    def reflected(delta: IndexDelta) -> bool:
        return all(b.id != new.id for b in delta.added)

    holds = IndexDelta(tenant="acme", time=0, added=[known])
    waits = IndexDelta(tenant="acme", time=0, added=[new])
    listed = _listed((T0 - 300, holds), (T0 - 200, None), (T0 - 100, waits), (T0 - 90, holds), (T0 - 10, holds))
    keys = [d.key for d in listed]
    # Unreadable deltas are folded; the unreflected one stops the run; so would the margin.
    assert fold_watermark(listed, reflected, T0, margin=60, give_up_after=600) == keys[1]
    assert fold_watermark(listed, lambda d: True, T0, margin=60) == keys[3]
    assert fold_watermark(listed, lambda d: True, T0, margin=5) == keys[4]
    assert fold_watermark(listed, reflected, T0, margin=60, give_up_after=100) == keys[3]
    assert fold_watermark(listed, lambda d: True, T0, after=keys[3], margin=60) == keys[3]
    assert fold_watermark([], lambda d: True, T0, after=keys[0]) == keys[0]
