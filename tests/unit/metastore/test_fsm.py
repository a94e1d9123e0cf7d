"""Every command handler: its rules, idempotence (applied twice = applied once) and determinism."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.factories import BASE_MS
from tests.unit.metastore.helpers import meta

from shale.block import BlockMeta, Compaction, FileInfo
from shale.bucketindex import state_digest
from shale.metastore.rules.commands import (
    AddBlocks,
    CommitIngestBatch,
    DeleteTombstones,
    Noop,
    OffsetRange,
    PartitionKey,
    QuarantineBlocks,
    ReplaceBlocks,
    Result,
    SetActiveGeneration,
    SetCompactionFailureLimit,
    TruncateIndex,
    decode,
    encode,
)
from shale.metastore.rules.fsm import Entry, StateMachine


class Harness:
    """A state machine with a log of its own: apply(cmd) appends the next entry."""

    def __init__(self, path: Path, term: int = 1) -> None:
        self.sm = StateMachine(path)
        self.term = term
        self.log: list[tuple[Entry, bytes]] = []

    def apply(self, command: object, time_ms: int = BASE_MS) -> Result:
        index = len(self.log) + 1
        entry = Entry(index, self.term, time_ms + index)
        data = encode(command)  # type: ignore[arg-type]
        self.log.append((entry, data))
        return self.sm.apply(entry, data)

    def reapply_as_new_entry(self, command: object) -> Result:
        return self.apply(command)


@pytest.fixture
def h(tmp_path: Path) -> Harness:
    return Harness(tmp_path / "state.db")


def _twice(h: Harness, command: object) -> tuple[Result, Result, str, str]:
    first = h.apply(command)
    hash1 = h.sm.state_hash()
    second = h.apply(command)
    hash2 = h.sm.state_hash()
    return first, second, hash1, hash2


def _without_index(h: Harness) -> Callable[[], str]:
    return h.sm.state_hash


def test_add_blocks_is_idempotent_and_rejects_tombstoned(h: Harness) -> None:
    a, b = meta(start=0), meta(start=100, end=200)
    first = h.apply(AddBlocks(blocks=[a, b]))
    # The tenant's link (previous version, version, log time, digest of its blocks and switches, switches if
    # changed): what its bucket index delta carries.
    assert first.data == {"added": [a.id, b.id], "existing": [], "rejected": [],
                          "links": {"acme": [0, 1, BASE_MS + 1, state_digest([a.id, b.id], []), None]}}
    rows_before = h.sm.reader.count_blocks()
    second = h.apply(AddBlocks(blocks=[a, b]))
    assert second.data == {"added": [], "existing": [a.id, b.id], "rejected": [], "links": {}}
    assert h.sm.reader.count_blocks() == rows_before == 2
    # After a compaction replaces a, a late AddBlocks of a (a writer that never saw its answer) is rejected.
    merged = meta(start=0, end=200, level=1, sources=[a.id, b.id], key="merged")
    assert h.apply(ReplaceBlocks(tenant="acme", sources=[a.id, b.id], blocks=[merged])).ok
    late = h.apply(AddBlocks(blocks=[a]))
    assert late.data["rejected"] == [a.id]
    assert h.sm.reader.get_block(a.id) is None


def _batch(start: int, end: int, partition: int = 0, key: str = "") -> CommitIngestBatch:
    block = meta(partition=partition, start=start, end=end, key=key or None)
    return CommitIngestBatch(group="backup", generation=1, batch="b",
                             ranges=[OffsetRange(topic="app", partition=partition, start=start, end=end)],
                             blocks=[block])


def test_commit_ingest_batch_advances_offsets_and_exact_replay_is_a_no_op(h: Harness) -> None:
    first = h.apply(_batch(0, 100))
    assert first.ok
    assert first.data["replay"] is False
    state = h.sm.state_hash()
    replay = h.apply(_batch(0, 100))
    assert replay.ok
    assert replay.data["replay"] is True
    assert h.sm.reader.offsets()[0].committed_end == 100
    assert h.sm.state_hash() != state  # only the applied index moved ...
    assert [r.committed_end for r in h.sm.reader.offsets()] == [100]  # ... offsets and blocks did not
    assert h.sm.reader.count_blocks() == 1
    assert h.apply(_batch(100, 250)).ok
    assert h.sm.reader.offsets()[0].committed_end == 250


def test_a_gap_is_rejected_with_a_clear_error(h: Harness) -> None:
    assert h.apply(_batch(0, 100)).ok
    result = h.apply(_batch(150, 200))
    assert not result.ok
    assert result.reason == "offset-gap"
    assert "offsets [100,150) would never be stored" in result.message
    assert h.sm.reader.offsets()[0].committed_end == 100
    assert h.sm.reader.count_blocks() == 1  # nothing of the rejected batch was applied


def test_an_overlap_is_rejected_with_a_clear_error(h: Harness) -> None:
    assert h.apply(_batch(0, 100)).ok
    result = h.apply(_batch(50, 150, key="other"))
    assert not result.ok
    assert result.reason == "offset-overlap"
    assert "offsets up to 100 are committed already" in result.message
    assert h.sm.reader.count_blocks() == 1


def test_a_batch_is_atomic_across_partitions(h: Harness) -> None:
    assert h.apply(_batch(0, 100, partition=0)).ok
    both = CommitIngestBatch(group="backup", ranges=[OffsetRange(topic="app", partition=0, start=100, end=200),
                                                     OffsetRange(topic="app", partition=1, start=5, end=50)],
                             blocks=[meta(partition=0, start=100, end=200), meta(partition=1, start=5, end=50)])
    assert h.apply(both).ok  # partition 1's first commit may start anywhere
    bad = CommitIngestBatch(group="backup", ranges=[OffsetRange(topic="app", partition=0, start=200, end=300),
                                                    OffsetRange(topic="app", partition=1, start=60, end=70)],
                            blocks=[meta(partition=0, start=200, end=300), meta(partition=1, start=60, end=70)])
    result = h.apply(bad)
    assert result.reason == "offset-gap"
    assert {(r.partition, r.committed_end) for r in h.sm.reader.offsets()} == {(0, 200), (1, 50)}
    assert h.sm.reader.count_blocks() == 3


def test_blocks_must_lie_inside_the_batch_ranges(h: Harness) -> None:
    cmd = CommitIngestBatch(group="backup", ranges=[OffsetRange(topic="app", partition=0, start=0, end=10)],
                            blocks=[meta(start=0, end=20)])
    result = h.apply(cmd)
    assert result.reason == "malformed"
    assert "outside the batch's ranges" in result.message


def test_replace_blocks_swaps_atomically_and_never_resurrects(h: Harness) -> None:
    a, b, c = meta(start=0), meta(start=100, end=200), meta(start=200, end=300)
    h.apply(AddBlocks(blocks=[a, b, c]))
    merged = meta(start=0, end=200, level=1, sources=[a.id, b.id], key="ab")
    first, second, _, _ = _twice(h, ReplaceBlocks(tenant="acme", sources=[a.id, b.id], blocks=[merged]))
    assert first.ok
    assert second.ok
    assert second.data["replay"] is True
    assert {m.id for m in h.sm.reader.tenant_blocks("acme")} == {merged.id, c.id}
    assert {t.block_id for t in h.sm.reader.tombstones()} == {a.id, b.id}
    # Retention removed c; a compaction of c finishing later must not bring c's records back.
    h.apply(TruncateIndex(prepared_term=1, cutoffs={"acme": 2**53}, partitions=[
        PartitionKey(tenant="acme", shard=0, window_start=_window(c.time_ms))]))
    late = h.apply(ReplaceBlocks(tenant="acme", sources=[c.id], blocks=[meta(start=200, end=300, level=1,
                                                                             sources=[c.id], key="c2")]))
    assert not late.ok
    assert late.reason == "sources-missing"


def test_replace_blocks_never_touches_another_tenants_sources(h: Harness) -> None:
    theirs, ours = meta(tenant="beta", start=0), meta(start=0)
    h.apply(AddBlocks(blocks=[theirs, ours]))
    # Outputs of the caller's own tenant, sources naming the other tenant's block: refused, nothing changes.
    result = h.apply(ReplaceBlocks(tenant="acme", sources=[ours.id, theirs.id], blocks=[]))
    assert not result.ok
    assert result.reason == "malformed"
    assert f"block {theirs.id} belongs to tenant beta, not acme" in result.message
    assert {m.id for m in h.sm.reader.tenant_blocks("beta")} == {theirs.id}
    assert {m.id for m in h.sm.reader.tenant_blocks("acme")} == {ours.id}
    assert h.sm.reader.tombstones() == []


def test_the_content_hash_leaves_out_a_no_op_but_not_a_setting(h: Harness) -> None:
    """The refused-call tests compare the content hash: a leader's no-op (an election) must not move it, and a
    command that changes anything must."""
    h.apply(AddBlocks(blocks=[meta(start=0)]))
    content, full = h.sm.state_hash(with_applied=False), h.sm.state_hash()
    h.apply(Noop())
    assert h.sm.state_hash(with_applied=False) == content
    assert h.sm.state_hash() != full
    h.apply(SetCompactionFailureLimit(limit=99))
    assert h.sm.state_hash(with_applied=False) != content


def test_quarantine_blocks_removes_them_from_the_index_without_tombstones(h: Harness) -> None:
    a, b = meta(start=0), meta(start=100, end=200)
    h.apply(AddBlocks(blocks=[a, b]))
    first = h.apply(QuarantineBlocks(tenant="acme", block_ids=[a.id], reason="corrupt"))
    state = h.sm.reader.state_hash(with_applied=False)
    second = h.apply(QuarantineBlocks(tenant="acme", block_ids=[a.id], reason="corrupt"))
    assert first.data == {"removed": [a.id]}
    assert second.data == {"removed": []}
    assert h.sm.reader.state_hash(with_applied=False) == state  # applied twice = applied once
    assert h.sm.reader.get_block(a.id) is None
    assert h.sm.reader.get_block(b.id) is not None
    assert h.sm.reader.tombstones() == []  # nothing will ever delete its objects
    other = h.apply(QuarantineBlocks(tenant="other", block_ids=[b.id]))
    assert not other.ok
    assert other.reason == "malformed"
    assert h.sm.reader.get_block(b.id) is not None


def test_a_backup_copies_the_state_without_waiting_for_the_state_lock(h: Harness, tmp_path: Path) -> None:
    import threading

    h.apply(AddBlocks(blocks=[meta(start=0)]))
    copy = tmp_path / "copy.db"
    with h.sm.lock:  # a long command holding the lock must not stall a snapshot
        worker = threading.Thread(target=h.sm.backup_to, args=(copy,))
        worker.start()
        worker.join(timeout=30)
        assert not worker.is_alive()
    assert StateMachine(copy).reader.count_blocks() == 1


def _window(ms: int) -> int:
    return ms - ms % (6 * 3600 * 1000)


def test_truncate_index_tombstones_whole_partitions_and_checks_the_term(h: Harness) -> None:
    old = meta(start=0, time_ms=BASE_MS)
    new = meta(start=100, end=200, time_ms=BASE_MS + 7 * 3600 * 1000)
    h.apply(AddBlocks(blocks=[old, new]))
    key = PartitionKey(tenant="acme", shard=0, window_start=_window(old.time_ms))
    stale = h.apply(TruncateIndex(prepared_term=0, cutoffs={"acme": 2**53}, partitions=[key]))
    assert stale.reason == "stale-term"
    first, second, _, _ = _twice(h, TruncateIndex(prepared_term=1, cutoffs={"acme": 2**53}, partitions=[key]))
    assert first.data == {"removed": 1, "tombstoned": {"acme": [old.id]},
                          "links": {"acme": [1, 3, BASE_MS + 3, state_digest([new.id], []), None]}}
    assert second.data == {"removed": 0, "tombstoned": {}, "links": {}}
    assert [m.id for m in h.sm.reader.tenant_blocks("acme")] == [new.id]
    assert [t.block_id for t in h.sm.reader.tombstones()] == [old.id]
    assert [p.window_start for p in h.sm.reader.partitions("acme")] == [_window(new.time_ms)]


def test_truncate_index_removes_only_the_blocks_its_cutoff_expires(h: Harness) -> None:
    # Two blocks in one creation window: one whose data is old, and a compaction output whose data is fresh.
    cutoff = BASE_MS + 30 * 86_400_000
    old = meta(start=0, time_ms=BASE_MS)
    merged = meta(start=0, end=200, level=1, key="merged", time_ms=BASE_MS, max_time=cutoff + 1)
    h.apply(AddBlocks(blocks=[old, merged]))
    key = PartitionKey(tenant="acme", shard=0, window_start=_window(BASE_MS))
    first, second, _, _ = _twice(h, TruncateIndex(prepared_term=1, cutoffs={"acme": cutoff}, partitions=[key]))
    assert (first.data, second.data) == ({"removed": 1, "tombstoned": {"acme": [old.id]}, "links": {
        "acme": [1, 2, BASE_MS + 2, state_digest([merged.id], []), None]}}, {"removed": 0, "tombstoned": {},
                                                                              "links": {}})
    assert [m.id for m in h.sm.reader.tenant_blocks("acme")] == [merged.id]
    # A creation window that ends after the cutoff is kept whole, whatever the partition list says.
    early = h.apply(TruncateIndex(prepared_term=1, cutoffs={"acme": _window(BASE_MS) + 1}, partitions=[key]))
    assert early.data == {"removed": 0, "tombstoned": {}, "links": {}}
    missing = h.apply(TruncateIndex(prepared_term=1, cutoffs={}, partitions=[key]))
    assert (missing.ok, missing.reason) == (False, "malformed")


def test_delete_tombstones_and_noop_are_idempotent(h: Harness) -> None:
    a = meta()
    h.apply(AddBlocks(blocks=[a]))
    h.apply(ReplaceBlocks(tenant="acme", sources=[a.id], blocks=[], reason="deleted"))
    first, second, _, _ = _twice(h, DeleteTombstones(block_ids=[a.id]))
    assert first.data == {"deleted": 1, "links": {"acme": [2, 3, BASE_MS + 3, state_digest([], []), None]}}
    assert second.data == {"deleted": 0, "links": {}}
    assert h.sm.reader.tombstones() == []
    assert h.apply(Noop()).ok


def test_every_command_twice_in_one_entry_slot_is_skipped(h: Harness) -> None:
    # The log replays an entry it already applied (restart after a crash): skipped by the applied index.
    h.apply(AddBlocks(blocks=[meta()]))
    entry, data = h.log[-1]
    before = h.sm.state_hash()
    result = h.sm.apply(entry, data)
    assert result.reason == "already-applied"
    assert h.sm.state_hash() == before


def test_two_replicas_fed_the_same_log_have_the_same_state_hash(tmp_path: Path) -> None:
    leader = Harness(tmp_path / "a.db")
    commands: list[object] = [
        _batch(0, 100), _batch(100, 200), _batch(150, 300, key="x"), AddBlocks(blocks=[meta(tenant="beta")]),
        ReplaceBlocks(tenant="acme", sources=[meta(start=0).id], blocks=[meta(start=0, level=1, key="m",
                                                                              sources=[meta(start=0).id])]),
        TruncateIndex(prepared_term=1, cutoffs={"beta": 2**53},
                      partitions=[PartitionKey(tenant="beta", shard=0, window_start=_window(BASE_MS))]),
        Noop(),
    ]
    for command in commands:
        leader.apply(command)
    follower = StateMachine(tmp_path / "b.db")
    for entry, data in leader.log:
        follower.apply(entry, data)
    assert follower.state_hash() == leader.sm.state_hash()
    assert follower.reader.offsets() == leader.sm.reader.offsets()


def test_commands_round_trip_through_json_and_msgpack() -> None:
    cmd = _batch(0, 10)
    assert decode(encode(cmd)) == cmd
    assert decode(encode(cmd, "msgpack")) == cmd


@pytest.mark.parametrize(("data", "reason"), [
    (b'{"kind": "DropEverything"}', "unknown-command"),
    (b'{"kind": "Noop", "version": 9}', "unknown-version"),
    (b'{"kind": "AddBlocks", "blocks": [{"id": "x"}]}', "malformed"),
    (b"\xc1garbage", "malformed"),
])
def test_bad_commands_are_rejected_deterministically(h: Harness, data: bytes, reason: str) -> None:
    result = h.sm.apply(Entry(1, 1, BASE_MS), data)
    assert not result.ok
    assert result.reason == reason
    assert h.sm.applied() == (1, 1)  # the rejection is the entry's outcome: the index still advances


def _once_and_twice(tmp_path: Path, setup: list[object], command: object) -> tuple[Harness, Harness, Result, Result]:
    """The same log prefix on two state machines, then ``command`` once (and a Noop, so both logs have the same
    length) on one, and twice on the other."""
    once, twice = Harness(tmp_path / "once.db"), Harness(tmp_path / "twice.db")
    for c in setup:
        once.apply(c)
        twice.apply(c)
    once.apply(command)
    once.apply(Noop())
    first = twice.apply(command)
    second = twice.apply(command)
    return once, twice, first, second


def test_set_active_generation_applied_twice_is_applied_once(tmp_path: Path) -> None:
    switch = SetActiveGeneration(tenant="acme", topic="app", generation=2, start=BASE_MS, end=BASE_MS + 3_600_000)
    once, twice, first, second = _once_and_twice(tmp_path, [], switch)
    assert first.data == {"switched": True, "retired": []}
    assert second.data == {"switched": False, "retired": []}
    assert twice.sm.state_hash() == once.sm.state_hash()
    assert twice.sm.reader.generation_rules("acme") == [("app", BASE_MS, BASE_MS + 3_600_000, 2)]
    # Switching back is a new switch (the latest one wins), and so is switching forward again after it.
    back = SetActiveGeneration(tenant="acme", topic="app", generation=1, start=BASE_MS, end=BASE_MS + 3_600_000)
    assert twice.apply(back).data == {"switched": True, "retired": []}
    assert twice.apply(switch).data == {"switched": True, "retired": []}
    assert [g for _, _, _, g in twice.sm.reader.generation_rules("acme")] == [2, 1, 2]


def test_set_active_generation_retires_the_replaced_blocks_once(tmp_path: Path) -> None:
    hour = 3_600_000
    old = meta(group="partition", generation=1, start=0, min_time=BASE_MS, max_time=BASE_MS + hour)
    new = meta(group="partition", generation=2, start=0, min_time=BASE_MS, max_time=BASE_MS + hour)
    outside = meta(group="partition", generation=1, start=100, end=200, min_time=BASE_MS, max_time=BASE_MS + 3 * hour)
    other_topic = meta(group="partition", generation=1, topic="web", min_time=BASE_MS, max_time=BASE_MS + hour)
    backup = meta(group="backup", generation=1, min_time=BASE_MS, max_time=BASE_MS + hour)
    retire = SetActiveGeneration(tenant="acme", topic="app", generation=2, start=BASE_MS, end=BASE_MS + 2 * hour,
                                 retire=True)
    once, twice, first, second = _once_and_twice(
        tmp_path, [AddBlocks(blocks=[old, new, outside, other_topic, backup])], retire)
    assert first.data == {"switched": True, "retired": [old.id]}  # only generation 1 of app wholly in the range
    assert second.data == {"switched": False, "retired": []}
    assert twice.sm.state_hash() == once.sm.state_hash()
    assert {m.id for m in twice.sm.reader.tenant_blocks("acme")} == {new.id, outside.id, other_topic.id, backup.id}
    (tombstone,) = twice.sm.reader.tombstones()
    assert tombstone.block_id == old.id


def test_set_active_generation_refuses_a_reversed_range(h: Harness) -> None:
    result = h.apply(SetActiveGeneration(tenant="acme", topic="app", generation=2, start=10, end=5))
    assert result.reason == "malformed"
    assert h.sm.reader.generation_rules("acme") == []


@pytest.mark.parametrize(("new_ranges", "gap"), [
    ([], "[0, 100)"),  # the new generation holds nothing yet
    ([(0, 60)], "[60, 100)"),  # a reprocess stopped half way
    ([(10, 100)], "[0, 10)"),
    ([(0, 40), (50, 100)], "[40, 50)"),
])
def test_retire_refuses_while_the_new_generation_lacks_offsets(tmp_path: Path, new_ranges: list[tuple[int, int]],
                                                               gap: str) -> None:
    """Issue 26 case 5: ``generation switch --retire`` to a generation with no, or partial, data tombstoned the
    live generation's blocks in the range. Now it is refused as a whole, naming the offsets that would be lost."""
    hour = 3_600_000
    old = meta(group="partition", generation=1, start=0, end=100, min_time=BASE_MS, max_time=BASE_MS + hour)
    new = [meta(group="partition", generation=2, start=s, end=e, min_time=BASE_MS, max_time=BASE_MS + hour)
           for s, e in new_ranges]
    h = Harness(tmp_path / "state.db")
    h.apply(AddBlocks(blocks=[old, *new]))
    result = h.apply(SetActiveGeneration(tenant="acme", topic="app", generation=2, start=BASE_MS,
                                         end=BASE_MS + 2 * hour, retire=True))
    assert result.reason == "not-covered"
    assert f"does not hold offsets {gap} of app[0]" in result.message
    assert old.id in {m.id for m in h.sm.reader.tenant_blocks("acme")}
    assert h.sm.reader.tombstones() == []
    assert h.sm.reader.generation_rules("acme") == []  # nothing applied: the switch is refused with its retire


@given(spans=st.lists(st.tuples(st.integers(0, 60), st.integers(0, 20)), max_size=6),
       start=st.integers(0, 70), length=st.integers(0, 30))
def test_first_gap_is_the_first_offset_no_span_covers(spans: list[tuple[int, int]], start: int, length: int) -> None:
    from shale.metastore.rules.generations import first_gap as _first_gap

    ranges = sorted((low, low + size) for low, size in spans)
    covered = {o for low, high in ranges for o in range(low, high)}
    missing = [o for o in range(start, start + length) if o not in covered]
    gap = _first_gap(ranges, start, start + length)
    if not missing:
        assert gap is None
    else:
        assert gap is not None
        assert gap[0] == missing[0]
        assert all(o not in covered for o in range(*gap))
        assert gap[1] == start + length or gap[1] in covered


def _forged(update: dict[str, object], file: str | None = None) -> CommitIngestBatch:
    block = meta(start=0, end=10)
    if file is not None:
        update = {**update, "files": [FileInfo(name=file, size=1, crc32="00000000")],
                  "datasets": [block.datasets[0].model_copy(update={"file": file})]}
    return CommitIngestBatch(group="backup", ranges=[OffsetRange(topic="app", partition=0, start=0, end=10)],
                             blocks=[block.model_copy(update=update)])


@pytest.mark.parametrize(("command", "says"), [
    (_forged({"level": 1}), "level 1"),
    (_forged({"compaction": Compaction(sources=[meta(start=500, end=600).id])}), "only source is the block itself"),
    (_forged({"compaction": Compaction(sources=[meta(start=0, end=10).id], parents=[meta(start=500, end=600).id])}),
     "parents"),
    (_forged({}, file="../other/records-0.parquet"), "one path segment"),
    (_forged({}, file="meta.json"), "one path segment"),
    (_forged({}, file=".."), "one path segment"),
])
def test_an_ingest_batch_cannot_plant_lineage_or_unsafe_file_names(h: Harness, command: CommitIngestBatch,
                                                                  says: str) -> None:
    """Issue 27, case 6: an ingest token commits level-0 blocks whose only source is themselves, no parents, and
    file names that are one path segment (forged lineage made repair drop other blocks; a name with '/' made the
    tombstone's deletion fail on every pass)."""
    result = h.apply(command)
    assert not result.ok
    assert result.reason == "malformed"
    assert says in result.message
    assert h.sm.reader.count_blocks() == 0
    assert h.sm.reader.offsets() == []
    assert h.apply(_forged({})).ok  # the same batch, honest, applies


def test_admin_commands_refuse_unsafe_file_names_too(h: Harness) -> None:
    bad = _forged({}, file="a/b.parquet").blocks[0]
    assert h.apply(AddBlocks(blocks=[bad])).reason == "malformed"
    assert h.apply(ReplaceBlocks(tenant="acme", sources=[], blocks=[bad])).reason == "malformed"
    assert h.sm.reader.count_blocks() == 0


def _two_topics(generation: int, a_end: int) -> BlockMeta:
    """A partition-group block holding a[0] [0, a_end) and b[0] [0, 3): what a repair merge (or a compaction) of
    one-topic blocks of one generation writes."""
    hour = 3_600_000
    a = meta(group="partition", generation=generation, topic="a", start=0, end=a_end, min_time=BASE_MS,
             max_time=BASE_MS + hour, key=f"two/{generation}")
    b = meta(group="partition", generation=generation, topic="b", start=0, end=3, min_time=BASE_MS,
             max_time=BASE_MS + hour)
    b_set = b.datasets[0].model_copy(update={"file": "records-1.parquet"})
    return a.model_copy(update={"kafka": [*a.kafka, *b.kafka], "datasets": [a.datasets[0], b_set],
                                "files": [*a.files, FileInfo(name="records-1.parquet", size=30, crc32="00000000")]})


def test_retire_counts_the_offsets_a_block_of_two_topics_holds(h: Harness) -> None:
    """Found by the model (test_fsm_model; its shrunk example, built directly): generation 2 held a[0] [0, 2) in a
    block that a repair merge had joined with a block of topic b. The retiring switch of a counted only one-topic
    blocks of the new generation as holding offsets, so it refused with ``not-covered`` a switch that loses
    nothing. What generation 2 holds of a is now taken from every block of it (only its ranges of a)."""
    hour = 3_600_000
    merged = _two_topics(2, a_end=2)
    old = meta(group="partition", generation=1, topic="a", start=0, end=1, min_time=BASE_MS, max_time=BASE_MS + hour)
    assert h.apply(AddBlocks(blocks=[merged, old])).ok
    result = h.apply(SetActiveGeneration(tenant="acme", topic="a", generation=2, start=0, end=2**62, retire=True))
    assert result.ok, result
    assert result.data["retired"] == [old.id]
    assert {m.id for m in h.sm.reader.tenant_blocks("acme")} == {merged.id}


def test_retire_does_not_count_another_topics_offsets_as_held(h: Harness) -> None:
    """The other side of the fix above: in a block of two topics only the switched topic's ranges count. Generation
    2 holds b[0] [0, 3) but a[0] only [0, 1): retiring generation 1's a[0] [0, 2) would lose offset 1."""
    hour = 3_600_000
    merged = _two_topics(2, a_end=1)
    old = meta(group="partition", generation=1, topic="a", start=0, end=2, min_time=BASE_MS, max_time=BASE_MS + hour)
    assert h.apply(AddBlocks(blocks=[merged, old])).ok
    result = h.apply(SetActiveGeneration(tenant="acme", topic="a", generation=2, start=0, end=2**62, retire=True))
    assert result.reason == "not-covered"
    assert "does not hold offsets [1, 2) of a[0]" in result.message
    assert {m.id for m in h.sm.reader.tenant_blocks("acme")} == {merged.id, old.id}
