"""The previous release's own bytes (``tests/fixtures/previous_release``): its delta links carry digests of the first
form, and they still vouch for the view they describe; its metastore state keeps no set hashes, and the first
change after the upgrade stamps a digest of the new form that matches the tenant's blocks."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.factories import BASE_MS
from tests.unit.metastore.helpers import meta

from shale.bucketindex import BucketIndex, IndexDelta, state_digest
from shale.bucketindex.deltas import follow_chain
from shale.bucketindex.model import DIGEST_FORM
from shale.metastore.rules.commands import AddBlocks
from shale.metastore.rules.fsm import StateMachine

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "previous_release"
TENANT = "default"


def _deltas() -> dict[str, IndexDelta]:
    folder = FIXTURE / "objects" / TENANT / "bucket-index-deltas"
    return {p.name: IndexDelta.model_validate_json(p.read_bytes()) for p in sorted(folder.iterdir())}


def test_the_previous_releases_links_still_vouch_for_their_views() -> None:
    deltas = _deltas()
    digests = {d.link.digest for d in deltas.values() if d.link is not None and d.link.digest is not None}
    assert digests
    assert not any(d.startswith(DIGEST_FORM) for d in digests)
    chain = follow_chain(BucketIndex.build(TENANT, 0.0, [], tenant_version=0), deltas)
    newest = max(d.link.version for d in deltas.values() if d.link is not None)
    assert chain.version is not None
    assert chain.unverified is None
    assert chain.hole is None
    assert chain.version == newest


def test_the_first_change_after_the_upgrade_stamps_the_new_form(tmp_path: Path) -> None:
    shutil.copytree(FIXTURE / "metastore", tmp_path / "metastore")
    state = StateMachine(tmp_path / "metastore" / "state.db")
    before = state.reader.tenant_block_ids(TENANT)
    assert before
    added = meta(tenant=TENANT, topic="upgrade", key="after-the-upgrade", time_ms=BASE_MS)
    result = state.apply_next(1, BASE_MS, AddBlocks(blocks=[added]))
    assert result.ok, result
    digest = result.data["links"][TENANT][3]
    assert digest.startswith(DIGEST_FORM)
    assert digest == state_digest(before | {added.id}, state.reader.generation_rules(TENANT))
    state.close()
