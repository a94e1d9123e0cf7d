"""Compaction preserves records (issue 26): for any set of source blocks, the merge's output holds each distinct
Kafka record of its sources exactly once, the copies of one record (overlapping sources of one topic incarnation)
once, and records of different incarnations of one topic-partition apart, whatever their offsets and times.

Rows do not name their incarnation, so each record's value does (``<incarnation>/<partition>/<offset>``): the
multiset of (topic, partition, offset, time, value) read back from the output is then the multiset of
(incarnation, partition, offset, value) of the sources' distinct records.
"""

from __future__ import annotations

import datetime
import uuid
from collections import Counter

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st
from tests.factories import BASE_MS

from shale.block import (
    BlockMeta,
    BlockSpec,
    DatasetInput,
    KafkaRange,
    deterministic_block_id,
    read_dataset,
    write_block,
)
from shale.block.records import INCARNATION_COLUMN
from shale.block.schemas import BACKUP_SCHEMA, partition_schema
from shale.compactor.merge import merge_blocks, merge_ranges
from shale.objstore import Bucket, open_bucket_url

TOPICS = ("app", "web")
Source = tuple[str, str, int, int, int]
"""(incarnation, topic, partition, first offset, offset count) of one level-0 block."""
Row = tuple[str, int, int, int, bytes]
"""(topic, partition, offset, time in ms, value)"""


def _time(incarnation: str, partition: int, offset: int, spread: dict[str, int]) -> int:
    """A record's time: its offset's, shifted per incarnation by ``spread`` (0: both incarnations' records with
    equal offsets have equal times too, as a topic recreated and filled again at once)."""
    return BASE_MS + offset * 1000 + spread.get(incarnation, 0) + partition


def _rows(source: Source, spread: dict[str, int]) -> list[Row]:
    incarnation, topic, partition, first, count = source
    return [(topic, partition, o, _time(incarnation, partition, o, spread),
             f"{incarnation}/{topic}/{partition}/{o}".encode()) for o in range(first, first + count)]


def _write(bucket: Bucket, group: str, source: Source, spread: dict[str, int], n: int) -> BlockMeta:
    incarnation, topic, partition, first, count = source
    rows = _rows(source, spread)
    table = pa.table({
        "topic": [r[0] for r in rows], "partition": pa.array([r[1] for r in rows], pa.int32()),
        "offset": pa.array([r[2] for r in rows], pa.int64()),
        "timestamp": pa.array([r[3] for r in rows], pa.timestamp("ms", tz="UTC")),
        "timestamp_type": pa.array([0] * count, pa.int8()), "key": [None] * count, "value": [r[4] for r in rows],
        "headers": pa.array([[]] * count, BACKUP_SCHEMA.field("headers").type)}, schema=BACKUP_SCHEMA)
    time_column = "timestamp"
    if group == "partition":  # a parsed record: its event time is its Kafka time here
        day = [datetime.datetime.fromtimestamp(r[3] / 1000, datetime.UTC) for r in rows]
        table = pa.table({**{c: table.column(c) for c in BACKUP_SCHEMA.names},
                          "event_time": table.column("timestamp"), "dt": [d.strftime("%Y-%m-%d") for d in day],
                          "hour": pa.array([d.hour for d in day], pa.int8())}).cast(partition_schema([]))
        time_column = "event_time"
    spec = BlockSpec(id=deterministic_block_id(BASE_MS + n, f"{incarnation}/{topic}/{partition}/{first}/{count}/{n}"),
                     tenant="acme", group=group, kafka=[KafkaRange(topic=topic, partition=partition, start=first,
                                                                   end=first + count, incarnation=incarnation)])
    return write_block(bucket, spec, [DatasetInput("records", topic, table, time_column, labels=[{"topic": topic}])])


def check_merge_preserves_records(sources: list[Source], spread: dict[str, int], group: str = "backup") -> None:
    bucket = open_bucket_url(f"memory://merge-{uuid.uuid4().hex[:12]}")
    metas = [_write(bucket, group, s, spread, n) for n, s in enumerate(sources)]
    distinct = {(s[0], *r[:3]): r for s in sources for r in _rows(s, spread)}  # per (incarnation, topic, p, offset)
    result = merge_blocks(bucket, metas, job="j", token=1, level=0)
    out = result.output
    merged = [read_dataset(bucket, out, d) for d in out.datasets]
    table = pa.concat_tables(merged, promote_options="permissive") if merged else pa.table({})
    for dataset in merged:  # a backup dataset of two incarnations names each row's, rightly
        if INCARNATION_COLUMN in dataset.column_names:
            named = set(zip(*(dataset.column(c).to_pylist() for c in (INCARNATION_COLUMN, "topic", "partition",
                                                                        "offset", "value")), strict=True))
            assert named <= {(*key, row[4]) for key, row in distinct.items()}
    got = Counter(zip(table.column("topic").to_pylist(), table.column("partition").to_pylist(),
                      table.column("offset").to_pylist(),
                      [round(t.timestamp() * 1000) for t in table.column("timestamp").to_pylist()],
                      table.column("value").to_pylist(), strict=True)) if table.num_rows else Counter()
    assert got == Counter(distinct.values()), (sorted(set(distinct.values()) - set(got))[:5],
                                                [r for r, n in got.items() if n > 1][:5])
    assert result.rows_out == out.rows == len(distinct)
    assert out.kafka == merge_ranges([r for m in metas for r in m.kafka])
    time_column = "event_time" if group == "partition" else "timestamp"
    for dataset in merged:  # each sorted by (time, topic, partition, offset)
        order = list(zip(*(dataset.column(c).to_pylist() for c in (time_column, "topic", "partition", "offset")),
                         strict=True))
        assert order == sorted(order)


def _sources(shared_offsets: bool) -> st.SearchStrategy[tuple[list[Source], dict[str, int], str]]:
    """1 to 5 sources of one group, of two topics and partitions 0 and 1, in incarnations i1 and i2. Sources of one
    incarnation may overlap (copies of one record). With ``shared_offsets`` both incarnations start at offset 0 (a
    recreated topic); without, i2's offsets start past i1's (their times still interleave)."""
    def source(incarnation: str) -> st.SearchStrategy[Source]:
        low = 0 if shared_offsets or incarnation == "i1" else 40
        return st.tuples(st.just(incarnation), st.sampled_from(TOPICS), st.integers(0, 1),
                         st.integers(low, low + 20), st.integers(0, 12))

    return st.tuples(st.lists(st.one_of(source("i1"), source("i2")), min_size=1, max_size=5),
                     st.fixed_dictionaries({"i2": st.sampled_from([0, 0, 500, -40_000, 3_000_000])}),
                     st.sampled_from(["backup", "partition"]))


@given(_sources(shared_offsets=False))
def test_a_merge_holds_each_distinct_record_of_its_sources_once(case: tuple[list[Source], dict[str, int],
                                                                             str]) -> None:
    check_merge_preserves_records(*case)


@given(_sources(shared_offsets=True))
def test_a_merge_keeps_records_of_every_topic_incarnation(case: tuple[list[Source], dict[str, int], str]) -> None:
    check_merge_preserves_records(*case)


def test_a_merge_keeps_two_incarnations_with_equal_offsets_and_times() -> None:
    """The minimal example (issue 26 case 1): offset 0 of partition 0 in two incarnations, at the same time; one
    row was lost before the merge keyed rows by incarnation."""
    check_merge_preserves_records([("i1", "app", 0, 0, 1), ("i2", "app", 0, 0, 1)], {"i2": 0})
