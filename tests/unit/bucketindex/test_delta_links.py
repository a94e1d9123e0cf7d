"""Deltas name their change's place in the tenant's history (issue 26 case 13): a producer that stopped between
its commit and its delta leaves a hole, and no later delta may make a stale view that lacks its block look fresh."""

from __future__ import annotations

import itertools
import uuid
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.unit.bucketindex.helpers import T0, Clock, block, config

from shale.block import BlockMeta
from shale.bucketindex import (
    BucketIndex,
    BucketIndexReader,
    BucketIndexWriter,
    DeltaLink,
    DeltaWriter,
    StaleIndexError,
    publish,
    read_index,
    state_digest,
)
from shale.bucketindex.deltas import IndexDelta, follow_chain
from shale.metastore.rules.commands import AddBlocks, DeleteTombstones, ReplaceBlocks, Result, encode
from shale.metastore.rules.fsm import Entry, StateMachine
from shale.objstore import ObstoreBucket, open_bucket_url

STALE = 3600.0


class _Metastore:
    """A real state machine whose log entries take the test clock's time."""

    def __init__(self, path: Path, clock: Clock) -> None:
        self.sm = StateMachine(path)
        self.clock = clock
        self.index = 0

    def apply(self, command: object) -> Result:
        self.index += 1
        return self.sm.apply(Entry(self.index, 1, int(self.clock.now * 1000)), encode(command))  # type: ignore[arg-type]


@pytest.fixture
def bucket() -> ObstoreBucket:
    return open_bucket_url(f"memory://links-{uuid.uuid4().hex}")


def _commit(metastore: _Metastore, deltas: DeltaWriter | None, tenant: str, added: BlockMeta) -> None:
    """Commit one block; write its delta unless ``deltas`` is None (the producer died right after the commit)."""
    result = metastore.apply(AddBlocks(blocks=[added]))
    assert result.ok
    if deltas is not None:
        deltas.write(tenant, added=[added], link=DeltaLink.of(result.data["links"][tenant]))


@pytest.mark.parametrize("producer_died", [True, False])
def test_a_commit_without_its_delta_keeps_a_stale_view_stale(bucket: ObstoreBucket, tmp_path: Path,
                                                              producer_died: bool) -> None:
    tenant, clock = "acme", Clock()
    metastore = _Metastore(tmp_path / "state.db", clock)
    first, lost, later = block(tenant, 1), block(tenant, 2), block(tenant, 3)
    deltas = DeltaWriter(bucket, clock)
    _commit(metastore, deltas, tenant, first)
    writer = BucketIndexWriter(bucket, metastore.sm.reader, config(debounce=0), clock)
    assert writer.run_once() == [tenant]  # the metastore's writer, then it stops
    clock.advance(100)
    _commit(metastore, None if producer_died else deltas, tenant, lost)
    clock.advance(100)
    _commit(metastore, deltas, tenant, later)
    clock.advance(STALE)  # the index is an hour and 200 s old; the newest delta 3600 s
    reader = BucketIndexReader(bucket, config(max_stale_period=STALE), clock)
    if producer_died:
        with pytest.raises(StaleIndexError, match="announced no delta"):
            reader.blocks(tenant)
        writer.run_once()  # the writer comes back and folds the commit in from its state
    assert sorted(b.id for b in reader.blocks(tenant)) == sorted([first.id, lost.id, later.id])


def test_links_apply_in_version_order_whatever_order_their_keys_have(bucket: ObstoreBucket) -> None:
    """Two producers whose clocks disagree: the later change's delta sorts first."""
    tenant, clock = "acme", Clock()
    a, b, c = block(tenant, 1), block(tenant, 2), block(tenant, 3)
    publish(bucket, BucketIndex.build(tenant, T0, [a], tenant_version=5), read_index(bucket, tenant))
    DeltaWriter(bucket, Clock(T0 + 10)).write(tenant, added=[c], link=DeltaLink(
        previous=7, version=9, time=T0 + 12, digest=state_digest([a.id, b.id, c.id], None)))
    DeltaWriter(bucket, Clock(T0 + 20)).write(tenant, added=[b], link=DeltaLink(
        previous=5, version=7, time=T0 + 11, digest=state_digest([a.id, b.id], None)))
    clock.advance(STALE + 5)
    reader = BucketIndexReader(bucket, config(max_stale_period=STALE), clock)
    assert sorted(x.id for x in reader.blocks(tenant)) == sorted([a.id, b.id, c.id])


def test_an_index_built_from_a_scan_is_not_vouched_for_by_linked_deltas(bucket: ObstoreBucket) -> None:
    """A scan cannot say which changes it holds (it misses blocks younger than the sync delay)."""
    tenant, clock = "acme", Clock()
    publish(bucket, BucketIndex.build(tenant, T0, [block(tenant, 1)]), read_index(bucket, tenant))
    clock.advance(STALE + 10)
    DeltaWriter(bucket, clock).write(tenant, added=[block(tenant, 2)],
                                     link=DeltaLink(previous=3, version=4, time=clock.now))
    with pytest.raises(StaleIndexError):
        BucketIndexReader(bucket, config(max_stale_period=STALE), clock).blocks(tenant)


@given(st.integers(0, 50), st.lists(st.integers(1, 20), min_size=1, max_size=12), st.data())
def test_follow_chain_reaches_the_newest_change_unless_a_link_is_missing_or_a_delta_carries_less(
        start: int, steps: list[int], data: st.DataObject) -> None:
    """Each change adds one block; its link's digest is the tenant after it. All deltas, in any key order: the
    newest change. One delta missing: a hole just before it. One delta that carries less than its change (its
    block left out): verified only up to the change before it, since no later digest can match."""
    versions = [start]
    for step in steps:
        versions.append(versions[-1] + step)
    base = block("acme", 0)
    added = [block("acme", n + 1) for n in range(len(steps))]
    index = BucketIndex.build("acme", T0, [base], tenant_version=start)
    deltas = {}
    for n, (previous, version) in enumerate(itertools.pairwise(versions)):
        link = DeltaLink(previous=previous, version=version, time=float(version),
                         digest=state_digest([base.id] + [b.id for b in added[:n + 1]], None))
        deltas[f"k{data.draw(st.integers(0, 10**6)):07d}-{n:03d}"] = IndexDelta(tenant="acme", time=0.0,
                                                                              added=[added[n]], link=link)
    chain = follow_chain(index, deltas)
    assert (chain.version, chain.time, chain.hole, chain.unverified) == (versions[-1], float(versions[-1]), None,
                                                                         None)
    assert {b.id for b in chain.view.blocks} == {base.id, *(b.id for b in added)}
    n = data.draw(st.integers(0, len(steps) - 1))
    key = sorted(deltas, key=lambda k: k[-3:])[n]
    missing = follow_chain(index, {k: d for k, d in deltas.items() if k != key})
    if n == len(steps) - 1:  # the newest change's delta is not there yet: fresh as of the one before
        assert (missing.version, missing.hole) == ((versions[-2] if n else None), None)
    else:
        assert missing.hole == versions[n]
        assert missing.version == (versions[n] if n else None)
    short = follow_chain(index, deltas | {key: deltas[key].model_copy(update={"added": []})})
    assert (short.version, short.unverified) == ((versions[n] if n else None), versions[-1])
    assert follow_chain(BucketIndex.build("acme", T0, [base]), deltas).version is None  # a scan: no chain


_TENANTS = ["acme", "beta"]


@given(st.lists(st.tuples(st.sampled_from(["add", "replace", "delete"]), st.sampled_from(_TENANTS)),
                min_size=1, max_size=15))
def test_each_tenants_links_form_one_chain_in_the_state_machine(tmp_path_factory: pytest.TempPathFactory,
                                                               ops: list[tuple[str, str]]) -> None:
    """Whatever commands change whichever tenants, each change's link starts where the tenant's last one ended,
    so a reader that holds every delta reaches the tenant's current version."""
    clock = Clock()
    metastore = _Metastore(tmp_path_factory.mktemp("links") / "state.db", clock)
    blocks: dict[str, list[BlockMeta]] = {t: [] for t in _TENANTS}
    tombstoned: dict[str, list[str]] = {t: [] for t in _TENANTS}
    links: dict[str, list[DeltaLink]] = {t: [] for t in _TENANTS}
    for n, (op, tenant) in enumerate(ops):
        clock.advance(1)
        if op == "add" or not blocks[tenant]:
            blocks[tenant].append(block(tenant, n))
            result = metastore.apply(AddBlocks(blocks=[blocks[tenant][-1]]))
        elif op == "replace":
            gone = blocks[tenant].pop()
            tombstoned[tenant].append(gone.id)
            result = metastore.apply(ReplaceBlocks(tenant=tenant, sources=[gone.id], blocks=[], reason="deleted"))
        else:
            result = metastore.apply(DeleteTombstones(block_ids=tombstoned[tenant] or ["01ARZ3NDEKTSV4RRFFQ69G5FAV"]))
            tombstoned[tenant] = []
        assert result.ok, result
        for name, raw in result.data["links"].items():
            link = DeltaLink.of(raw)
            assert link is not None
            assert link.time == clock.now
            links[name].append(link)
    versions = metastore.sm.reader.tenant_versions()
    for tenant in _TENANTS:
        previous = 0
        for link in links[tenant]:
            assert link.previous == previous
            previous = link.version
        assert versions.get(tenant, 0) == previous
        if links[tenant]:  # the newest link digests the tenant as the state machine holds it now
            reader = metastore.sm.reader
            assert links[tenant][-1].digest == state_digest(reader.tenant_block_ids(tenant),
                                                            reader.generation_rules(tenant))
