"""Every read declared in ``IndexReads`` answers the same through the HTTP client as in the service, over the real
app on loopback: the routes and the client's calls are derived from the declarations (reads.py), so a read's
parameters, query names and answer types must survive the trip."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.unit.metastore.helpers import meta
from tests.unit.metastore.served import app_for, issue, served

from shale.metastore import (
    AddBlocks,
    CommitIngestBatch,
    IndexReads,
    MetastoreClient,
    MetastoreService,
    OffsetRange,
    ReplaceBlocks,
    SetActiveGeneration,
)
from shale.metastore.api import auth
from shale.metastore.api.reads import Read, served_reads

BLOCKS = [meta(tenant="acme", start=0, labels=[{"topic": "app", "env": "prod"}]),
          meta(tenant="acme", start=100, end=200), meta(tenant="beta", start=0, topic="audit")]
CALLS: dict[str, list[tuple[tuple[Any, ...], dict[str, Any]]]] = {
    "query_blocks": [((["acme"], 0, 2**62), {}), ((("acme", "beta"), 0, 2**62, '{topic="app"}'), {"group": "backup"}),
                     ((["beta"],), {})],
    "label_names": [((["acme", "beta"], 0, 2**62), {})],
    "label_values": [(("topic", ["acme", "beta"]), {"selector": '{env="prod"}'})],
    "get_block": [((BLOCKS[0].id,), {}), (("0" * 26,), {})],
    "tenants": [((), {})],
    "tenant_blocks": [(("acme",), {}), (("acme",), {"limit": 1}), (("acme",), {"after": BLOCKS[0].id})],
    "generation_rules": [(("acme",), {})],
    "tombstones": [((), {}), ((None, 1), {})],
    "schema_versions": [(("acme",), {}), (("acme", "app"), {})],
    "offsets": [((), {}), (("backup", 1), {})],
    "offset_history": [(("backup",), {})],
    "compaction_jobs": [((), {})],
    "compaction_queue": [((), {})],
    "ingest_leases": [((), {}), (("backup",), {})],
    "erasures": [((), {}), ((None, 5), {})],
    "restores": [((), {"limit": 3})],
}
LOCAL_ONLY = {"tenant_totals", "level_histogram"}  # the status page's, read from the node's own state file


@pytest.fixture
def both(tmp_path: Path) -> Iterator[tuple[MetastoreService, MetastoreClient]]:
    tokens, table = issue(tmp_path)
    app, service = app_for(tmp_path, table)
    service.submit(AddBlocks(blocks=BLOCKS[1:]))
    assert service.submit(CommitIngestBatch(group="backup", ranges=[
        OffsetRange(topic="app", partition=0, start=0, end=100)], blocks=[BLOCKS[0]])).ok
    compacted = meta(tenant="beta", start=0, topic="audit", level=1, sources=[BLOCKS[2].id], key="compacted")
    assert service.submit(ReplaceBlocks(tenant="beta", sources=[BLOCKS[2].id], blocks=[compacted])).ok
    assert service.submit(SetActiveGeneration(tenant="acme", topic="app", generation=2, start=0, end=10)).ok
    with served(app) as http:
        client = MetastoreClient([str(http.base_url)], token=tokens["admin"], deadline=30)
        try:
            yield service, client
        finally:
            client.close()


def test_every_read_has_sample_calls() -> None:
    reads = {name for name, value in vars(IndexReads).items()
             if isinstance(value, Read) or (callable(value) and name not in ("fresh", "status", "snapshot")
                                            and not name.startswith("_"))}
    assert reads - LOCAL_ONLY == set(CALLS)


def test_every_served_route_has_a_rule_of_its_own() -> None:
    for read in served_reads():
        assert read.route is not None
        assert f"GET {read.route.path}" in auth.RULES, f"{read.name}: {read.route.path} has no rule in auth.RULES"


def test_the_client_answers_every_read_as_the_service_does(both: tuple[MetastoreService, MetastoreClient]) -> None:
    service, client = both
    for name, calls in CALLS.items():
        for args, kwargs in calls:
            local = getattr(service, name)(*args, **kwargs)
            remote = getattr(client, name)(*args, **kwargs)
            assert remote == local, f"{name}{args}{kwargs}: {remote!r} over HTTP, {local!r} in the service"
    assert service.query_blocks(["acme"], 0, 2**62), "the sample state holds blocks"
    assert service.offsets(), "and offsets"
    assert service.tombstones(), "and a tombstone"
    assert service.generation_rules("acme"), "and a generation rule"


def test_status_reads_a_user_acts_on_are_linearized(tmp_path: Path) -> None:
    """A node restarted from its journal answers from its own state until it catches up: a status read there could
    report a finished erasure as rewriting again (found by the leader-kill erasure test). These reads run the
    barrier."""
    asked: list[tuple[str, bool]] = []

    class Recording(IndexReads):
        def fresh(self, api: str, *, current: bool = True) -> None:
            asked.append((api, current))

    _, service = app_for(tmp_path, issue(tmp_path)[1])
    reads = Recording(service.reader)
    reads.erasures()
    reads.restores()
    assert asked == [("erasures", True), ("restores", True)]
