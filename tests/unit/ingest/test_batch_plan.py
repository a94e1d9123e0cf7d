"""Planning a batch's exact offsets: a table of the rules (continuity, incarnations, starting offsets, losses,
truncation, record and byte limits, --available-now targets)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shale.ingest.plan import PROBE_RECORDS, Ahead, Limits, Loss, PartitionRange, plan_batch, recreated

A, B = "AAAAAAAAAAAAAAAAAAAAAA", "BBBBBBBBBBBBBBBBBBBBBB"
SIZED = {("t", 0): 100.0, ("t", 1): 100.0}
ROOMY = Limits(max_records=10_000_000, max_bytes=10**12, record_bytes=SIZED)


@pytest.mark.parametrize(("committed", "starts", "bounds", "expected"), [
    # continue at the committed end, up to Kafka's (last stable) end
    ({("t", 0): (500, A)}, {}, {("t", 0): (0, 900)}, [PartitionRange("t", 0, A, 500, 900)]),
    # an unrecorded incarnation matches the current one
    ({("t", 0): (500, "")}, {}, {("t", 0): (0, 900)}, [PartitionRange("t", 0, A, 500, 900)]),
    # caught up: nothing to read
    ({("t", 0): (900, A)}, {}, {("t", 0): (0, 900)}, []),
    # never committed: from the start the caller resolved (earliest, or a pinned "latest")
    ({}, {}, {("t", 0): (40, 900)}, [PartitionRange("t", 0, A, 40, 900)]),
    ({}, {("t", 0): 700}, {("t", 0): (40, 900)}, [PartitionRange("t", 0, A, 700, 900)]),
    # a recreated topic (another incarnation committed): the caller starts it at its earliest offset
    ({("t", 0): (5_000, B)}, {("t", 0): 0}, {("t", 0): (0, 300)}, [PartitionRange("t", 0, A, 0, 300)]),
])
def test_where_each_partition_reads(committed: dict[tuple[str, int], tuple[int, str]],
                                    starts: dict[tuple[str, int], int],
                                    bounds: dict[tuple[str, int], tuple[int, int]],
                                    expected: list[PartitionRange]) -> None:
    plan = plan_batch({"t": A}, bounds, committed, starts, ROOMY, 1)
    assert plan.ranges == expected
    assert not plan.losses
    assert not plan.ahead


def test_offsets_deleted_before_they_were_read_pause_only_their_partition() -> None:
    plan = plan_batch({"t": A}, {("t", 0): (700, 900), ("t", 1): (0, 50)}, {("t", 0): (500, A), ("t", 1): (10, A)},
                      {}, ROOMY, 1)
    assert plan.losses == [Loss("t", 0, A, 500, 700)]
    assert plan.ranges == [PartitionRange("t", 1, A, 10, 50)]


def test_a_committed_end_beyond_kafka_is_reported_not_skipped() -> None:
    plan = plan_batch({"t": A}, {("t", 0): (0, 100)}, {("t", 0): (500, A)}, {}, ROOMY, 1)
    assert plan.ahead == [Ahead("t", 0, A, 500, 100)]
    assert plan.ranges == []


def test_records_are_shared_by_lag_and_unknown_sizes_are_probed() -> None:
    limits = Limits(max_records=1_000, max_bytes=10**12, record_bytes=SIZED)
    plan = plan_batch({"t": A}, {("t", 0): (0, 3_000), ("t", 1): (0, 1_000), ("t", 2): (0, 50_000)},
                      {}, {}, limits, 1)
    counts = {r.partition: r.end - r.start for r in plan.ranges}
    assert counts == {0: 55, 1: 18, 2: 925}  # 1,000 shared by lag ...
    probe = plan_batch({"t": A}, {("t", 2): (0, 50_000)}, {}, {}, ROOMY, 1)
    assert probe.ranges[0].end == PROBE_RECORDS  # ... and a size never seen is probed first


def test_bytes_bound_a_batch_of_large_records() -> None:
    limits = Limits(max_records=2_000_000, max_bytes=64 * 2**20, record_bytes={("t", 0): 5 * 2**20})
    plan = plan_batch({"t": A}, {("t", 0): (0, 100)}, {}, {}, limits, 1)
    assert plan.ranges == [PartitionRange("t", 0, A, 0, 12)]


def test_available_now_stops_at_the_targets_and_deleted_topics_are_left_alone() -> None:
    plan = plan_batch({"t": A}, {("t", 0): (0, 900), ("gone", 0): (0, 10)}, {("t", 0): (100, A)}, {}, ROOMY, 1,
                      targets={("t", 0): 400})
    assert plan.ranges == [PartitionRange("t", 0, A, 100, 400)]
    assert plan.lag == {("t", 0): 800}


def test_a_topic_recreated_while_its_batch_read_it_is_not_committed() -> None:
    """Issue 26 case 11: a batch reads by topic name; a topic recreated between planning and reading would have
    its new records stored under the old incarnation. After the read the driver compares the incarnations."""
    old, new = "AAAAAAAAAAAAAAAAAAAAAA", "BBBBBBBBBBBBBBBBBBBBBB"
    ranges = [PartitionRange("app", 0, old, 0, 10), PartitionRange("app", 1, old, 5, 10),
              PartitionRange("web", 0, old, 0, 3), PartitionRange("legacy", 0, "", 0, 3)]
    assert recreated(ranges, {"app": new, "web": old, "legacy": new}) == ["app"]
    assert recreated(ranges, {"app": old, "web": old}) == []  # gone after the read: what it read was the old topic


def test_partitions_that_never_held_a_record_are_committed_once_as_empty_ranges(tmp_path) -> None:
    """Issue 54, point 14: a partition with nothing to read that was never committed is carried by the plan as an
    empty range, committed with the batch's ranges: the metastore then knows every partition of the topic, and a
    restore counts the source's partitions from it when the source topic is gone (none of them held a record)."""
    from shale.ingest.committer import batch_commit
    from shale.metastore import MetastoreService, SingleNodeLog, StateMachine
    from shale.restore.plan import recorded_partitions

    bounds = {("t", 0): (0, 10), ("t", 1): (0, 0), ("t", 2): (5, 5), ("t", 3): (0, 7)}
    plan = plan_batch({"t": A}, bounds, {("t", 3): (7, A)}, {}, ROOMY, 1)
    assert plan.ranges == [PartitionRange("t", 0, A, 0, 10)]
    assert plan.quiet == [PartitionRange("t", 1, A, 0, 0), PartitionRange("t", 2, A, 5, 5)]  # not 3: committed
    assert plan.offsets == 10
    command = batch_commit([], [], group="backup", generation=1, writer="ingest", batch="b", quiet=plan.quiet)
    assert [(r.partition, r.start, r.end, r.stored) for r in command.ranges] == [(1, 0, 0, 0), (2, 5, 5, 0)]
    state = StateMachine(tmp_path / "state.db")
    service = MetastoreService(state, SingleNodeLog(state))
    assert service.submit(command).ok
    rows = service.offsets("backup", 1)
    assert sorted((r.partition, r.committed_end) for r in rows) == [(1, 0), (2, 5)]
    assert recorded_partitions(rows, "t", A) == {1, 2}
    # Committed: the next plans carry them no more, and a record arriving later is read from where they stood.
    committed = {("t", r.partition): (r.committed_end, r.incarnation) for r in rows}
    later = plan_batch({"t": A}, {**bounds, ("t", 2): (5, 8)}, committed, {}, ROOMY, 1)
    assert later.quiet == []
    assert PartitionRange("t", 2, A, 5, 8) in later.ranges


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.integers(0, 7), st.tuples(st.integers(0, 50), st.integers(0, 50)), min_size=1),
       st.dictionaries(st.integers(0, 7), st.tuples(st.integers(0, 60), st.sampled_from([A, B, ""]))),
       st.dictionaries(st.integers(0, 7), st.integers(0, 60)))
def test_a_partition_is_quiet_exactly_when_never_committed_here_and_nothing_is_to_read(
        spans: dict[int, tuple[int, int]], done: dict[int, tuple[int, str]], pinned: dict[int, int]) -> None:
    """Quiet: no committed end in the topic's current incarnation and its start (the caller's, within Kafka's
    bounds) at Kafka's end; a quiet partition is never also read, lost or ahead, and starts where it would."""
    bounds = {("t", p): (min(a, b), max(a, b)) for p, (a, b) in spans.items()}
    committed = {("t", p): c for p, c in done.items()}
    starts = {("t", p): s for p, s in pinned.items()}
    plan = plan_batch({"t": A}, bounds, committed, starts, ROOMY, 1)
    quiet = {r.partition: r for r in plan.quiet}
    for (_, p), (earliest, end) in bounds.items():
        here = committed.get(("t", p))
        fresh = here is None or (here[1] != "" and here[1] != A)
        start = max(earliest, min(end, starts.get(("t", p), earliest)))
        assert (p in quiet) == (fresh and start == end), (p, here, start, end)
        if p in quiet:
            assert (quiet[p].start, quiet[p].end, quiet[p].incarnation) == (start, start, A)
    busy = {r.partition for r in plan.ranges} | {x.partition for x in plan.losses} | {x.partition for x in plan.ahead}
    assert not busy & set(quiet)
