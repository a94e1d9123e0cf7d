"""Verify, the ledger and restore read every erasure, a page at a time, not the newest page only: after 1,001
erasures the oldest one's offsets were reported missing (exit 1) with nothing lost."""

from __future__ import annotations

import base64
from pathlib import Path
from types import SimpleNamespace

from tests.factories import Clock

from shale.metastore import (
    ErasedPosition,
    MetastoreService,
    PlanErasure,
    RequestErasure,
    SingleNodeLog,
    StateMachine,
    erasure_id,
    every_erasure,
)
from shale.metastore.rules.erasures import PAGE
from shale.restore.job import RestoreJob
from shale.restore.offsets import erased_source_offsets
from shale.verify.reconcile import erased_of


def _erase(service: MetastoreService, key: bytes, offset: int) -> str:
    erasure = erasure_id("acme", ["app"], key)
    service.submit(RequestErasure(id=erasure, tenant="acme", topics=["app"],
                                  key=base64.b64encode(key).decode())).raise_for_rejection()
    service.submit(PlanErasure(id=erasure, positions=[ErasedPosition(topic="app", partition=0, offset=offset)]))
    return erasure


def test_every_erasure_is_read_past_the_first_page(tmp_path: Path) -> None:
    clock = Clock()
    state = StateMachine(tmp_path / "s.db")
    service = MetastoreService(state, SingleNodeLog(state, clock=clock), clock=clock)
    count = PAGE + 1
    ids = [_erase(service, f"customer-{n}".encode(), n) for n in range(count)]
    assert len(service.erasures(limit=PAGE)) == PAGE  # one read answers a page
    assert [r["id"] for r in every_erasure(service.erasures)] == ids[::-1]
    erased = erased_of(service, "app")
    assert erased[0][0] == ids[0]  # the oldest erasure's offset is erased, not missing
    assert len(erased[0]) == count
    plan = SimpleNamespace(topic="app", incarnation="", tenant="acme")
    assert erased_source_offsets(service, plan) == {0: list(range(count))}  # type: ignore[arg-type]
    report = SimpleNamespace(plan={"partitions": [{"partition": 0, "start": 0, "end": count}]}, warnings=[])
    RestoreJob._erased(SimpleNamespace(index=service), plan, report)  # type: ignore[arg-type]
    assert report.plan["erased"] == count
