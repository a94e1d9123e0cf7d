"""Which records blocks hold, from metadata: scopes, holders (lineage and offsets) and overlaps."""

from __future__ import annotations

from tests.unit.repair.helpers import JSON, blk

from shale.block.overlap import Holders, overlaps, scopes

P1 = {"dt": "2026-11-18"}


def test_overlaps_are_records_stored_twice_not_ranges_shared() -> None:
    metas = [
        blk("a", 0, 100),
        blk("b", 0, 100, kind="quarantine"),  # the same chunk's rejected records
        blk("c", 0, 100, incarnation="new"),  # the topic's next incarnation: other records
        blk("d", 40, 60, kind=None),  # offsets that held no record
        blk("e", 0, 100, group="partition", pv=P1, parser=JSON),  # another group
        blk("f", 200, 300, level=1, sources=["x", "y"]),
        blk("g", 250, 350, level=1, sources=["y", "z"], incarnation="other"),  # shares y's records with f
        blk("h", 90, 120),  # stores [90, 100) a second time
    ]
    found = overlaps(metas)
    assert [(o.first, o.second) for o in found] == [(metas[5].id, metas[6].id), (metas[0].id, metas[7].id)]
    assert "compaction lineage" in found[0].detail
    assert "offsets [90,100) are in both" in found[1].detail


def test_a_scope_needs_one_kind_and_the_partitions_widest_partition_values() -> None:
    day = blk("a", 0, 100, group="partition", pv=P1)
    hour = blk("b", 0, 100, group="partition", pv={**P1, "hour": "03"})
    mixed = blk("c", 0, 100, kinds=("records", "quarantine"))
    empty = blk("d", 0, 100, kind=None)
    scope = scopes([day, hour, mixed, empty])
    assert scope[day.id] is None  # fewer values than the hour blocks: a compaction across hours
    assert scope[hour.id] is not None
    assert scope[mixed.id] is None
    assert scope[empty.id] is None


def test_holders_by_lineage_and_by_offsets() -> None:
    a, b = blk("a", 0, 50), blk("b", 50, 100)
    asked = [blk("c", 10, 20), blk("d", 40, 60), blk("e", 40, 110), blk("f", 0, 500, level=1, sources=["a", "b"]),
             blk("g", 10, 20, kind="quarantine"), blk("h", 10, 20, kind=None)]
    holders = Holders(scopes([a, b, *asked]))  # the scopes of every block of the tenant
    holders.add(a)
    holders.add(b)
    assert [holders.held(m) for m in asked] == [
        [a.id],
        [a.id, b.id],
        [],  # [100, 110) is in neither
        [a.id, b.id],  # by lineage
        [],  # another scope
        [a.id],  # holds no records: any range holding its offsets will do
    ]
