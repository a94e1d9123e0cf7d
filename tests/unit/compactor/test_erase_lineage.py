"""An erase job's output supersedes its source for a reader of the bucket alone: while both are there unmarked (the
source's deletion mark comes later), seed 000's full-overlap rule judges the source overlapped by its rewrite. With
the source's lineage alone the two had equal source sets, and the greater id won: the source, holding the erased
records, half the time."""

from __future__ import annotations

import uuid

from hypothesis import example, given, settings
from hypothesis import strategies as st
from tests.unit.erase.test_erase import _block

from shale.block import BlockMeta
from shale.block.fetcher import BlockFetcher, BlockState
from shale.bucketindex.model import BucketIndex, live_blocks
from shale.compaction import ErasePlan, Job, QueueKey
from shale.compactor.erase import erase_block
from shale.config import BucketConfig
from shale.metastore.rules.erasures import job_name, output_problem
from shale.objstore import open_bucket

ERASURE_IDS = st.text("0123456789abcdef", min_size=16, max_size=16)


def _readable(store: object, blocks: list[BlockMeta]) -> tuple[list[str], list[str]]:
    """The live blocks as the bucket index and a bucket scanner judge them."""
    index = BucketIndex(tenant="acme", updated_at=0, blocks=blocks)
    scan = BlockFetcher(store, sync_delay=0).sync("acme")  # type: ignore[arg-type]
    return [b.id for b in live_blocks(index)], sorted(v.id for v in scan.in_state(BlockState.HEALTHY))


@settings(max_examples=20, deadline=None)
@given(first=ERASURE_IDS, second=ERASURE_IDS, token=st.integers(1, 2**31))
@example(first="0000000000000000", second="0000000000000001", token=1)  # the source's id was the greater
def test_a_rewrite_and_a_rewrite_of_it_supersede_their_sources(first: str, second: str, token: int) -> None:
    store = open_bucket(BucketConfig(url=f"memory://lineage-{uuid.uuid4().hex}"))
    source = _block(store, "backup", "app", 0, 0, 10)
    once = erase_block(store, source, ErasePlan(erasure=first, positions=[("app", 0, 3, "")]),
                       job=job_name(first, source.id), token=token).output
    assert _readable(store, [source, once]) == ([once.id], [once.id])
    assert set(once.compaction.sources) == {*source.compaction.sources, once.id}
    twice = erase_block(store, once, ErasePlan(erasure=second, positions=[("app", 0, 4, "")]),
                        job=job_name(second, once.id), token=token).output
    assert _readable(store, [source, once, twice]) == ([twice.id], [twice.id])
    job = Job(job_name(second, once.id), QueueKey("acme", 0, 0, "backup", 1), [once.id], 0, 0)
    assert output_problem(job, once, [twice]) is None  # the metastore accepts the lineage
