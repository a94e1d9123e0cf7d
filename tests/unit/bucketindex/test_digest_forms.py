"""The tenant digest's two forms: the set-hash form the metastore stamps now (kept per tenant, updated by each
command's changes) and the first form (every id, sorted), which links stamped by the previous release carry. A
reader checks each link in its own form, so deltas written before an upgrade still vouch for a view."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from tests.unit.bucketindex.helpers import T0, block

from shale.bucketindex import (
    SET_HASH_MODULUS,
    BucketIndex,
    DeltaLink,
    block_id_hash,
    digest_of_set,
    legacy_state_digest,
    set_hash,
    state_digest,
)
from shale.bucketindex.deltas import IndexDelta, follow_chain
from shale.bucketindex.model import DIGEST_FORM

_RULES = [("app", 0, 10, 2)]


@given(n=st.integers(0, 12), removed=st.sets(st.integers(0, 11)), order=st.randoms(use_true_random=False))
def test_a_set_hash_kept_by_changes_is_the_set_hash_of_the_set(n: int, removed: set[int], order: object) -> None:
    ids = [block("acme", i).id for i in range(n)]
    kept = 0
    for i in ids:
        kept = (kept + block_id_hash(i)) % SET_HASH_MODULUS
    for i in sorted(removed):
        if i < n:
            kept = (kept - block_id_hash(ids[i])) % SET_HASH_MODULUS
    live = [x for k, x in enumerate(ids) if k not in removed]
    order.shuffle(live)  # type: ignore[attr-defined]
    assert kept == set_hash(live)
    assert digest_of_set(kept, _RULES) == state_digest(live, _RULES)
    assert state_digest(live, _RULES).startswith(DIGEST_FORM)
    if live:
        assert state_digest(live[1:], _RULES) != state_digest(live, _RULES)


def test_a_set_hash_counts_a_duplicate() -> None:
    a = block("acme", 1).id
    assert set_hash([a, a]) != set_hash([])  # a XOR would forget both


def _chain(digest: str) -> tuple[BucketIndex, dict[str, IndexDelta]]:
    a, b = block("acme", 1), block("acme", 2)
    index = BucketIndex.build("acme", T0, [a], tenant_version=5)
    delta = IndexDelta(tenant="acme", time=T0 + 1, added=[b],
                       link=DeltaLink(previous=5, version=7, time=T0 + 1, digest=digest))
    return index, {"d1": delta}


def test_a_link_of_the_first_form_still_vouches_for_the_view() -> None:
    ids = [block("acme", 1).id, block("acme", 2).id]
    for digest in (legacy_state_digest(ids, None), state_digest(ids, None)):
        index, deltas = _chain(digest)
        assert follow_chain(index, deltas).version == 7, digest


def test_a_link_of_either_form_that_the_view_does_not_match_does_not_vouch() -> None:
    ids = [block("acme", 1).id]  # the delta's block is missing from what the link digests
    for digest in (legacy_state_digest(ids, None), state_digest(ids, None)):
        index, deltas = _chain(digest)
        chain = follow_chain(index, deltas)
        assert chain.version is None, digest
        assert chain.unverified == 7, digest


def test_the_first_form_is_what_the_previous_release_stamped() -> None:
    # The previous release's state_digest, as it was written: blake2b of the sorted ids and the rules' JSON.
    import hashlib
    import json

    ids = [block("acme", 2).id, block("acme", 1).id]
    text = "\n".join(sorted(ids)) + "\n\n" + json.dumps([list(r) for r in _RULES], separators=(",", ":"))
    assert legacy_state_digest(ids, _RULES) == hashlib.blake2b(text.encode(), digest_size=16).hexdigest()
