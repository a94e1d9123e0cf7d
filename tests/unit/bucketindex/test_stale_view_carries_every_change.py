"""A stale-tolerant view is fresh only if its deltas carry every change the metastore made (issue 39 case 10).

The metastore stamps each delta link with a digest of the tenant as the change's entry left it (its blocks and
generation switches); a reader counts its view fresh as of a change only if the view digests the same. The
producers are the real ones where they run without Spark (retention and the tombstone collector of
``Maintenance``); ingest and compaction write their deltas here exactly as ``IngestJob`` and the compaction worker
do (the added blocks, the sources marked, the command result's link).
"""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import event, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from tests.unit.bucketindex.helpers import Clock, config
from tests.unit.metastore.helpers import meta, output_of

from shale.block import BlockMeta, DeletionMark
from shale.bucketindex import (
    BucketIndex,
    BucketIndexReader,
    BucketIndexWriter,
    DeltaLink,
    DeltaWriter,
    StaleIndexError,
    live_blocks,
    state_digest,
)
from shale.config import RetentionConfig
from shale.metastore import MetastoreService, SingleNodeLog, StateMachine
from shale.metastore.api.maintenance import Maintenance
from shale.metastore.rules.commands import Command, CommitIngestBatch, OffsetRange, ReplaceBlocks, Result
from shale.objstore import Bucket, open_bucket_url

DAY_MS = 86_400_000
STALE = 3600.0
RETENTION_DAYS = 30
DAYS_AGO = st.sampled_from([0, 5, 31, 35])
"""A block's data time, in days before now: few values, so that blocks share partitions (retention removes whole
partitions), half of them past retention."""
TENANT = "acme"


class _Maintenance(Maintenance):
    """The real maintenance, with a hook that runs between reading the state for retention and submitting the
    truncation: what an ingest commit racing with retention does."""

    between: list[object] = []

    def prepare_retention(self) -> tuple[object, dict[str, list[DeletionMark]]] | None:  # type: ignore[override]
        prepared = super().prepare_retention()
        hooks, self.between = self.between, []
        for hook in hooks:
            hook()  # type: ignore[operator]
        return prepared


class _World:
    """A real metastore (single node), a memory bucket, the metastore leader's index writer, and producers that
    write their deltas after each durable change, as the real ones do."""

    def __init__(self, path: Path, clock: Clock) -> None:
        self.clock = clock
        state = StateMachine(path)
        self.service = MetastoreService(state, SingleNodeLog(state, clock=clock), clock=clock)
        self.bucket: Bucket = open_bucket_url(f"memory://stale-view-{uuid.uuid4().hex}")
        self.deltas = DeltaWriter(self.bucket, clock)
        self.maintenance = _Maintenance(self.service, self.bucket, RetentionConfig(default=RETENTION_DAYS * 86_400),
                                        delete_delay=600, is_leader=lambda: True, term=lambda: 1, clock=clock,
                                        sync_delay=0, write_deltas=True)
        self.writer = BucketIndexWriter(self.bucket, state.reader, config(debounce=0), clock, delta_margin=0)
        self.offsets: dict[int, int] = {}

    def submit(self, command: Command) -> Result:
        self.clock.advance(1)
        result = self.service.submit(command)
        assert result.ok, result
        return result

    def ingest(self, generation: int, time_ms: int, *, delta: bool = True) -> BlockMeta:
        """One ingest batch of the partition group; its delta as ``IngestJob`` writes it (unless the producer
        died between its commit and its delta)."""
        start = self.offsets.get(generation, 0)
        block = meta(tenant=TENANT, group="partition", generation=generation, start=start, end=start + 10,
                     time_ms=time_ms, key=f"{generation}/{start}")
        self.offsets[generation] = start + 10
        result = self.submit(CommitIngestBatch(group="partition", generation=generation, blocks=[block],
                                               ranges=[OffsetRange(topic="app", partition=0, start=start,
                                                                   end=start + 10)]))
        if delta:
            self.deltas.write(TENANT, added=[block], link=DeltaLink.of(result.data["links"].get(TENANT)))
        return block

    def compact(self, sources: list[BlockMeta]) -> BlockMeta:
        """A compaction's replacement; its delta as the compaction worker writes it."""
        output = output_of(sources, key=f"out/{'/'.join(s.id for s in sources)}")
        result = self.submit(ReplaceBlocks(tenant=TENANT, sources=[s.id for s in sources], blocks=[output],
                                           reason="compacted"))
        self.deltas.write(TENANT, added=[output], marks=[(s.id, self.clock.now, "compacted") for s in sources],
                          link=DeltaLink.of(result.data["links"].get(TENANT)))
        return output

    def live(self) -> set[str]:
        """What a query may read now, from the metastore's own state."""
        blocks = self.service.state.reader.tenant_blocks(TENANT)
        return {b.id for b in live_blocks(BucketIndex.build(TENANT, 0, blocks))}

    def rules(self) -> list[tuple[str, int, int, int]]:
        return sorted(self.service.state.reader.generation_rules(TENANT))


def _answer(reader: BucketIndexReader) -> tuple[set[str], list[tuple[str, int, int, int]]] | None:
    try:
        blocks = {b.id for b in reader.blocks(TENANT)}
    except StaleIndexError:
        return None
    return blocks, sorted(reader.generations(TENANT) or [])


def test_case10_a_stale_view_holds_a_generation_switch_its_ingest_delta_made(tmp_path: Path) -> None:
    """An upgrade's ingest commit switches the active generation; its delta only adds a block. A view older than
    max_stale_period that follows the deltas without a hole must hold the switch too (or refuse): missing it,
    every row of the new generation is silently missing from bucket-index queries."""
    clock = Clock()
    world = _World(tmp_path / "state.db", clock)
    now_ms = int(clock.now * 1000)
    world.ingest(1, now_ms - 60_000)
    world.writer.run_once()  # the leader writes the index, then stops writing
    before = world.rules()
    world.ingest(2, now_ms)  # ingest.generation raised: this commit switches the topic to generation 2
    assert world.rules() != before, "the commit switched no generation: this test no longer covers a switch"
    clock.advance(STALE)  # the index is older than max_stale_period, the newest change is not
    reader = BucketIndexReader(world.bucket, config(max_stale_period=STALE), clock)
    assert _answer(reader) == (world.live(), world.rules())


def test_case10_a_stale_view_marks_every_block_the_same_truncation_removed(tmp_path: Path) -> None:
    """Retention marks the expired blocks it read, then truncates; a block committed in between that the same
    cutoff expires is removed too. The retention delta must mark it, or a stale-tolerant view lists it as live."""
    clock = Clock((0 + 40 * DAY_MS) / 1000)  # forty days after the epoch-based data times below
    world = _World(tmp_path / "state.db", clock)
    old_ms = int(clock.now * 1000) - 35 * DAY_MS
    world.ingest(1, old_ms)
    world.ingest(1, int(clock.now * 1000))
    world.writer.run_once()
    world.maintenance.between = [lambda: world.ingest(1, old_ms + 60_000)]  # an expired block, read late
    assert world.maintenance.apply_retention() == 2
    clock.advance(STALE)  # the index is older than max_stale_period, the newest change is not
    reader = BucketIndexReader(world.bucket, config(max_stale_period=STALE), clock)
    assert _answer(reader) == (world.live(), world.rules())


@settings(stateful_step_count=25)  # examples: the profile's (tests/conftest.py; HYPOTHESIS_PROFILE=nightly)
class StaleViewModel(RuleBasedStateMachine):
    """Ingest commits (in generations that switch), compaction replacements, retention truncations (racing with
    ingest), tombstone collection, producers that die between commit and delta, index writes, and readers at
    any staleness. Invariant: a reader that answers returns the tenant's live blocks and generation switches
    exactly as the metastore held them at a moment no older than max_stale_period; otherwise it refuses.

    Against the code before the digest it found both named cases: an upgrade's ingest commit followed by a wait
    (``test_case10_a_stale_view_holds_a_generation_switch_its_ingest_delta_made``), and two retentions that each
    raced an expired ingest, then a wait (``test_case10_a_stale_view_marks_every_block_the_same_truncation_...``).
    """

    def __init__(self) -> None:
        super().__init__()
        self.world: _World
        self.history: list[tuple[float, tuple[set[str], list[tuple[str, int, int, int]]]]] = []
        self.generation = 1
        self.blocks: list[BlockMeta] = []

    @initialize(data=st.data())
    def start(self, data: st.DataObject) -> None:
        path = Path(tempfile.mkdtemp(prefix="shale-stale-view-")) / "state.db"
        self.clock = Clock((0 + 40 * DAY_MS) / 1000)
        self.world = _World(path, self.clock)
        self._ingest(data.draw(DAYS_AGO), True)
        self.world.writer.run_once()

    def _record(self) -> None:
        self.history.append((self.clock.now, (self.world.live(), self.world.rules())))

    def _ingest(self, days_ago: int, delta: bool) -> None:
        block = self.world.ingest(self.generation, int(self.clock.now * 1000) - days_ago * DAY_MS, delta=delta)
        self.blocks.append(block)
        self._record()

    @rule(days_ago=DAYS_AGO, delta=st.sampled_from([True, True, True, False]))
    def ingest(self, days_ago: int, delta: bool) -> None:
        """An ingest commit; without its delta when its producer died right after the commit."""
        self._ingest(days_ago, delta)

    @rule(days_ago=DAYS_AGO)
    def upgrade(self, days_ago: int) -> None:
        """``ingest.generation`` raised: the new generation's commits."""
        self.generation += 1
        self._ingest(days_ago, True)

    @precondition(lambda self: len(self.world.live()) >= 2)
    @rule(data=st.data())
    def compact(self, data: st.DataObject) -> None:
        live = sorted(self.world.live())
        by_id = {b.id: b for b in self.world.service.state.reader.tenant_blocks(TENANT)}
        chosen = data.draw(st.lists(st.sampled_from(live), min_size=2, max_size=3, unique=True))
        sources = [by_id[i] for i in sorted(chosen)]
        if len({s.generation for s in sources}) > 1:
            return
        self.world.compact(sources)
        self._record()

    @rule(race=DAYS_AGO | st.none())
    def retention(self, race: int | None) -> None:
        if race is not None:
            self.world.maintenance.between = [lambda: self._ingest(race, True)]
        self.clock.advance(1)
        self.world.maintenance.apply_retention()
        self.world.maintenance.between = []
        self._record()

    @rule()
    def collect(self) -> None:
        self.clock.advance(601)
        self.world.maintenance.collect_tombstones()
        self._record()

    @rule()
    def write_index(self) -> None:
        self.clock.advance(1)
        self.world.writer.write_tenant(TENANT)

    @rule(seconds=st.sampled_from([10.0, STALE / 2, STALE - 1, STALE + 1, 2 * STALE, 5 * STALE]))
    def wait(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @invariant()
    def a_reader_answers_exactly_or_refuses(self) -> None:
        if not hasattr(self, "world"):
            return
        reader = BucketIndexReader(self.world.bucket, config(max_stale_period=STALE), self.clock)
        answer = _answer(reader)
        index_age = self.clock.now - reader.index(TENANT).updated_at if answer is not None else None
        event("read: " + ("refused" if index_age is None else "deltas" if index_age > STALE else "index"))
        if answer is None:
            return
        oldest = self.clock.now - STALE
        held = [state for i, (at, state) in enumerate(self.history)
                if i + 1 == len(self.history) or self.history[i + 1][0] > oldest]
        assert answer in held, (answer, held[-1])


test_stale_view_model = StaleViewModel.TestCase


@pytest.mark.parametrize("digest", [None, "0" * 32])
def test_a_link_whose_digest_the_view_does_not_match_vouches_for_nothing(tmp_path: Path,
                                                                        digest: str | None) -> None:
    """A delta whose content misses part of its change (or a metastore that predates digests): stale."""
    clock = Clock()
    world = _World(tmp_path / "state.db", clock)
    world.ingest(1, int(clock.now * 1000))
    world.writer.run_once()
    block = world.ingest(1, int(clock.now * 1000), delta=False)
    result_link = DeltaLink(previous=world.service.state.reader.tenant_versions()[TENANT] - 1,
                            version=world.service.state.reader.tenant_versions()[TENANT], time=clock.now,
                            digest=digest)
    world.deltas.write(TENANT, added=[block], link=result_link)
    clock.advance(STALE)
    with pytest.raises(StaleIndexError, match="do not carry every change"):
        BucketIndexReader(world.bucket, config(max_stale_period=STALE), clock).blocks(TENANT)


def test_an_index_holding_more_than_its_version_is_verified_where_the_chain_catches_up(tmp_path: Path) -> None:
    """The index writer reads the tenant's version before its blocks, so an index may hold a change its version
    does not claim: the view mismatches that change's predecessor, and matches once the chain reaches it."""
    clock = Clock()
    a, b, c = (meta(start=n * 10, end=n * 10 + 10, key=f"held/{n}") for n in range(3))
    bucket = open_bucket_url(f"memory://held-{uuid.uuid4().hex}")
    index = BucketIndex.build(TENANT, clock.now, [a, b], tenant_version=1)  # holds version 2's block b
    bucket.put_if_absent(f"{TENANT}/bucket-index.json.gz", index.to_bytes())
    deltas = DeltaWriter(bucket, clock)
    clock.advance(STALE)
    deltas.write(TENANT, added=[b], link=DeltaLink(previous=1, version=2, time=clock.now - 1,
                                                   digest=state_digest([a.id, b.id], None)))
    deltas.write(TENANT, added=[c], link=DeltaLink(previous=2, version=3, time=clock.now,
                                                   digest=state_digest([a.id, b.id, c.id], None)))
    clock.advance(1)
    reader = BucketIndexReader(bucket, config(max_stale_period=STALE), clock)
    assert {x.id for x in reader.blocks(TENANT)} == {a.id, b.id, c.id}


def test_an_entry_that_changes_a_tenant_without_touching_it_still_gives_it_a_new_version(tmp_path: Path) -> None:
    """A handler that forgets ``touch`` must not let an older link vouch over its change: the entry still gives
    the tenant a new version, so the next link starts after a version no delta announced (a hole)."""
    state = StateMachine(tmp_path / "state.db")
    w = state.writer
    w.conn.execute("BEGIN IMMEDIATE")
    w.add_blocks([meta(key="untouched")], 1)
    w.set_applied(1, 1)
    w.conn.execute("COMMIT")
    assert state.reader.tenant_versions() == {TENANT: 1}


def test_a_delta_the_index_already_holds_is_not_applied_again() -> None:
    """An ingest delta left unfolded (its block was deleted since, so the writer never saw it reflected) must
    not bring the deleted block back into a stale view: the index's version already holds that change."""
    clock = Clock()
    a, gone, b = (meta(start=n * 10, end=n * 10 + 10, key=f"again/{n}") for n in range(3))
    bucket = open_bucket_url(f"memory://again-{uuid.uuid4().hex}")
    deltas = DeltaWriter(bucket, clock)
    deltas.write(TENANT, added=[gone], link=DeltaLink(previous=2, version=3, time=clock.now,
                                                      digest=state_digest([a.id, gone.id], None)))
    index = BucketIndex.build(TENANT, clock.now + 10, [a], tenant_version=5)  # gone was deleted at version 5
    bucket.put_if_absent(f"{TENANT}/bucket-index.json.gz", index.to_bytes())
    clock.advance(STALE + 10)
    deltas.write(TENANT, added=[b], link=DeltaLink(previous=5, version=6, time=clock.now,
                                                   digest=state_digest([a.id, b.id], None)))
    clock.advance(1)
    reader = BucketIndexReader(bucket, config(max_stale_period=STALE), clock)
    assert {x.id for x in reader.blocks(TENANT)} == {a.id, b.id}
