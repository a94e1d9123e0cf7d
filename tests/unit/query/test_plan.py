"""The query planner's pure functions, table by table: where a generation is active, which blocks may hold the
same record, and which parts a query reads."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.factories import BASE_MS

from shale.block import BlockMeta, Compaction, Dataset, KafkaRange, deterministic_block_id
from shale.block.records import may_share_records, shared_scopes
from shale.block.schemas import BACKUP_SCHEMA, QUARANTINE_SCHEMA
from shale.query.plan import active_intervals, plan_query

Range = tuple[str, int, int, int]  # topic, partition, start offset, end offset (exclusive)


def block(key: str, *, group: str = "partition", generation: int = 1, level: int = 0,
          ranges: tuple[Range, ...] = (("app", 0, 0, 100),), dt: str = "2026-11-18", min_time: int = BASE_MS,
          kinds: tuple[str, ...] = ("records",), columns: tuple[str, ...] = ("level",),
          incarnation: str = "") -> BlockMeta:
    """A block's metadata (no data behind it: the planner reads metadata only)."""
    block_id = deterministic_block_id(BASE_MS, key)
    topic = ranges[0][0]
    return BlockMeta(
        id=block_id, tenant="acme", level=level, group=group, generation=generation,
        min_time=min_time, max_time=min_time + 1000,
        kafka=[KafkaRange(topic=t, partition=p, start=s, end=e, incarnation=incarnation) for t, p, s, e in ranges],
        partition_values={"dt": dt} if group == "partition" else {},
        datasets=[Dataset(name=f"{kind}/{topic}", kind=kind, topic=topic, file=f"{kind}-0.parquet", rows=1, bytes=1,
                          min_time=min_time, max_time=min_time + 1000,
                          columns=list(columns) if group == "partition" and kind == "records" else [])
                  for kind in kinds],
        compaction=Compaction(sources=[block_id]),
    )


# -- active_intervals ----------------------------------------------------------------------------------------------

# Rules are (topic, start, end, generation), oldest first; the query range is [0, 99] and the default generation 1.
ACTIVE = [
    ("no switch: the default generation everywhere", [], 1, [(0, 99)]),
    ("no switch: any other generation nowhere", [], 2, []),
    ("a switch in the middle, for the switched generation", [("app", 10, 19, 2)], 2, [(10, 19)]),
    ("a switch in the middle, for the default around it", [("app", 10, 19, 2)], 1, [(0, 9), (20, 99)]),
    ("a switch of another topic is ignored", [("web", 10, 19, 2)], 1, [(0, 99)]),
    ("a switch wider than the query is clipped to it", [("app", -500, 500, 2)], 2, [(0, 99)]),
    ("a switch outside the query changes nothing", [("app", 200, 300, 2)], 1, [(0, 99)]),
    ("a switch touching the query's end", [("app", 99, 300, 2)], 2, [(99, 99)]),
    ("a later switch overrides an earlier one", [("app", 0, 49, 2), ("app", 20, 29, 1)], 2, [(0, 19), (30, 49)]),
    ("... and the earlier one's generation regains its span", [("app", 0, 49, 2), ("app", 20, 29, 1)], 1,
     [(20, 29), (50, 99)]),
    ("adjacent switches to one generation join", [("app", 0, 9, 2), ("app", 10, 19, 2)], 2, [(0, 19)]),
    ("switching back covers the earlier switch", [("app", 0, 99, 2), ("app", 0, 99, 1)], 2, []),
    ("switching back, for the default", [("app", 0, 99, 2), ("app", 0, 99, 1)], 1, [(0, 99)]),
    ("a third generation over a second", [("app", 0, 59, 2), ("app", 40, 99, 3)], 3, [(40, 99)]),
]


@pytest.mark.parametrize(("rules", "generation", "expected"), [case[1:] for case in ACTIVE],
                         ids=[case[0] for case in ACTIVE])
def test_active_intervals(rules: list[tuple[str, int, int, int]], generation: int,
                          expected: list[tuple[int, int]]) -> None:
    assert active_intervals(rules, "app", generation, 1, 0, 99) == expected


def test_active_intervals_of_a_one_millisecond_query() -> None:
    assert active_intervals([("app", 5, 5, 2)], "app", 2, 1, 5, 5) == [(5, 5)]
    assert active_intervals([("app", 5, 5, 2)], "app", 1, 1, 5, 5) == []


def test_active_intervals_partition_the_query_range() -> None:
    rules = [("app", 0, 49, 2), ("app", 20, 29, 1), ("app", 40, 79, 3), ("web", 0, 99, 4)]
    spans = sorted(s for g in range(5) for s in active_intervals(rules, "app", g, 1, 0, 99))
    covered = [t for low, high in spans for t in range(low, high + 1)]
    assert covered == list(range(100))  # every time belongs to exactly one generation


# -- the shared-records check --------------------------------------------------------------------------------------

INC_A, INC_B = "AAAAAAAAAAAAAAAAAAAAAA", "BBBBBBBBBBBBBBBBBBBBBB"  # two incarnations of a recreated topic

SHARED = [
    ("overlapping offsets of one partition", block("a"), block("b", ranges=(("app", 0, 50, 150),)),
     {("app", 0, "")}),
    ("adjacent offsets share nothing", block("a"), block("b", ranges=(("app", 0, 100, 200),)), set()),
    ("other partitions share nothing", block("a"), block("b", ranges=(("app", 1, 0, 100),)), set()),
    ("other topics share nothing", block("a"), block("b", ranges=(("web", 0, 0, 100),)), set()),
    ("other incarnations of a recreated topic never share", block("a", incarnation=INC_A),
     block("b", incarnation=INC_B), set()),
    ("one incarnation shares", block("a", incarnation=INC_A), block("b", incarnation=INC_A), {("app", 0, INC_A)}),
    ("other generations of the partition group are never read at one time", block("a"), block("b", generation=2),
     set()),
    ("backup generations store the same records", block("a", group="backup"),
     block("b", group="backup", generation=2), {("app", 0, "")}),
    ("other groups never share", block("a", group="backup"), block("b"), set()),
    ("level-0 partition blocks of other days never share", block("a", dt="2026-11-18"),
     block("b", dt="2026-11-19"), set()),
    ("level-0 partition blocks of one day may share", block("a"), block("b"), {("app", 0, "")}),
    ("a compacted partition block may share with a level-0 one of another day", block("a", level=1),
     block("b", dt="2026-11-19"), {("app", 0, "")}),
    ("backup blocks of one partition may share", block("a", group="backup"), block("b", group="backup"),
     {("app", 0, "")}),
    ("only the overlapping ranges of many are named",
     block("a", ranges=(("app", 0, 0, 100), ("app", 1, 0, 100), ("web", 0, 0, 10))),
     block("b", ranges=(("app", 1, 99, 200), ("web", 0, 10, 20))), {("app", 1, "")}),
]


@pytest.mark.parametrize(("a", "b", "expected"), [case[1:] for case in SHARED], ids=[case[0] for case in SHARED])
def test_may_share_records(a: BlockMeta, b: BlockMeta, expected: set[tuple[str, int, str]]) -> None:
    assert may_share_records(a, b) == expected
    assert may_share_records(b, a) == expected  # symmetric


_RANGE = st.tuples(st.sampled_from(["app", "web"]), st.integers(0, 1), st.integers(0, 30), st.integers(0, 10)).map(
    lambda r: (r[0], r[1], r[2], r[2] + r[3]))  # empty ranges too
_BLOCK = st.builds(lambda key, group, generation, level, ranges, dt, incarnation: block(
    key, group=group, generation=generation, level=level, ranges=tuple(ranges), dt=dt, incarnation=incarnation),
    st.uuids().map(str), st.sampled_from(["partition", "backup"]), st.integers(1, 2), st.integers(0, 1),
    st.lists(_RANGE, min_size=1, max_size=6), st.sampled_from(["2026-11-18", "2026-11-19"]),
    st.sampled_from(["", "i2"]))


@given(st.lists(_BLOCK, max_size=6))
def test_shared_scopes_is_the_union_of_every_pair_s_shared_records(blocks: list[BlockMeta]) -> None:
    pairs: set[tuple[str, int, str]] = set()
    for i, a in enumerate(blocks):
        for b in blocks[i + 1:]:
            pairs |= may_share_records(a, b)
    assert shared_scopes(blocks) == pairs


# -- plan_query ----------------------------------------------------------------------------------------------------

def test_plan_reads_the_blocks_of_the_group_and_kind_in_time_order() -> None:
    late = block("late", min_time=BASE_MS + 5000, kinds=("records", "quarantine"))
    early = block("early", ranges=(("app", 0, 100, 200),))
    backup = block("backup", group="backup")
    plan = plan_query([late, backup, early], "partition", "records")
    assert [(p.block.id, p.dataset.kind, p.intervals) for p in plan.parts] == [
        (early.id, "records", None), (late.id, "records", None)]
    assert plan.dedup_partitions == set()  # adjacent offsets
    assert plan.time_column == "event_time"
    assert plan.schema.names[-1] == "level"  # the parser's column follows the base columns
    assert "level" not in plan.base_columns
    assert plan.objects == 2

    quarantine = plan_query([late, backup, early], "partition", "quarantine")
    assert [p.block.id for p in quarantine.parts] == [late.id]
    assert quarantine.schema == QUARANTINE_SCHEMA
    assert quarantine.time_column == "timestamp"

    backups = plan_query([late, backup, early], "backup", "records")
    assert [p.block.id for p in backups.parts] == [backup.id]
    assert backups.schema == BACKUP_SCHEMA
    assert backups.base_columns == BACKUP_SCHEMA.names


def test_plan_reads_each_generation_only_where_it_is_active() -> None:
    first = block("first", generation=1)
    second = block("second", generation=2)
    third = block("third", generation=3)
    rules = [("app", 10, 19, 2), ("app", 0, 99, 3), ("app", 50, 99, 1)]  # generation 3 retired again in [50, 99]
    plan = plan_query([first, second, third], "partition", "records", rules=rules, start=0, end=99)
    assert {p.block.id: p.intervals for p in plan.parts} == {first.id: ((50, 99),), third.id: ((0, 49),)}

    untouched = plan_query([first, second], "partition", "records", rules=[("web", 0, 99, 2)], start=0, end=99)
    assert {p.block.id: p.intervals for p in untouched.parts} == {first.id: None}  # None: the whole range


def test_plan_deduplicates_only_where_read_blocks_may_share_records() -> None:
    a = block("a")
    overlapping = block("overlap", ranges=(("app", 0, 50, 150),))
    other_day = block("other-day", dt="2026-11-19", ranges=(("app", 1, 0, 100),))
    # Two blocks of a generation nobody reads overlap each other; they are not read, so they add no duplicates.
    inactive = [block("inactive-1", generation=2, ranges=(("app", 1, 0, 100),)),
                block("inactive-2", generation=2, ranges=(("app", 1, 50, 150),))]
    plan = plan_query([a, overlapping, other_day, *inactive], "partition", "records")
    assert plan.dedup_partitions == {("app", 0, "")}
    assert {p.block.id for p in plan.parts} == {a.id, overlapping.id, other_day.id}
    active = plan_query([a, overlapping, other_day, *inactive], "partition", "records", rules=[("app", 0, 2**62, 2)])
    assert active.dedup_partitions == {("app", 1, "")}


def test_plan_selects_columns_and_refuses_unknown_ones() -> None:
    plan = plan_query([block("a")], "partition", "records", ["offset", "level"])
    assert plan.schema.names == ["offset", "level"]
    with pytest.raises(ValueError, match=r"unknown columns \['severity'\]"):
        plan_query([block("a")], "partition", "records", ["offset", "severity"])


def test_an_empty_plan_has_the_base_schema() -> None:
    plan = plan_query([], "partition", "records")
    assert plan.parts == []
    assert plan.schema.names == plan.base_columns


def test_the_row_filter_of_an_unbounded_query_keeps_every_row() -> None:
    import pyarrow as pa
    import pyarrow.dataset as ds

    from shale.block.schemas import TIMESTAMP
    from shale.query.plan import row_filter

    plan = plan_query([block("a")], "partition", "records")
    times = pa.array([BASE_MS * 1000, (BASE_MS + 5) * 1000], TIMESTAMP)
    table = pa.table({"event_time": times, "topic": ["app", "app"], "dt": ["2026-11-18"] * 2})
    unbounded = row_filter(plan, plan.parts[0], 0, 2**62, [])
    assert ds.dataset(table).to_table(filter=unbounded).num_rows == 2  # 2**62 ms overflows microseconds: clamped
    bounded = row_filter(plan, plan.parts[0], BASE_MS + 1, BASE_MS + 10, [])
    assert ds.dataset(table).to_table(filter=bounded).column("event_time").to_pylist() == [times[1].as_py()]
