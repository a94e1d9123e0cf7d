"""Who may call what: the rules table, tokens, and the API enforcing them (the real app on a real single-node
state, served by uvicorn on loopback in a thread of the test)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from tests.unit.metastore.helpers import meta
from tests.unit.metastore.served import app_for, served

from shale.errors import ConfigError
from shale.metastore import AddBlocks, CommitIngestBatch, OffsetRange
from shale.metastore.api import auth
from shale.metastore.api.auth import (
    ADMIN,
    ANY_ROLE,
    COMPACTOR,
    EVERY_TENANT,
    PEER,
    SOME_READER,
    Principal,
    command_need,
    ingest,
    read,
)
from shale.metastore.api.service import MetastoreService

WHO = {
    "admin": Principal("ops", "admin"),
    "ingest-backup": Principal("ib", "ingest", groups=frozenset({"backup"})),
    "ingest-any": Principal("ia", "ingest", groups=frozenset({"*"})),
    "compactor": Principal("c", "compactor"),
    "reader-acme": Principal("ra", "reader", tenants=frozenset({"acme"})),
    "reader-all": Principal("rall", "reader", tenants=frozenset({"*"})),
    "peer": Principal("p", "peer"),
}


@pytest.mark.parametrize(("need", "allowed"), [
    (ADMIN, {"admin"}),
    (PEER, {"admin", "peer"}),
    (COMPACTOR, {"admin", "compactor"}),
    (ingest("backup"), {"admin", "ingest-backup", "ingest-any"}),
    (ingest("partition"), {"admin", "ingest-any"}),
    (read(["acme"]), {"admin", "reader-acme", "reader-all"}),
    (read(["acme", "beta"]), {"admin", "reader-all"}),
    (EVERY_TENANT, {"admin", "reader-all"}),
    (SOME_READER, {"admin", "reader-acme", "reader-all"}),
    (ANY_ROLE, set(WHO)),
    (command_need("CommitIngestBatch", "backup"), {"admin", "ingest-backup", "ingest-any"}),
    (command_need("ReplaceBlocks"), {"admin"}),
    (command_need("AddBlocks"), {"admin"}),
    (command_need("DeleteTombstones"), {"admin"}),
    (command_need("SetActiveGeneration"), {"admin"}),
    (command_need("SetCompactionFailureLimit"), {"admin"}),
    (command_need("AcknowledgeOffsetLoss"), {"admin"}),  # a kind added later needs admin until decided
])
def test_the_rules_table(need: auth.Need, allowed: set[str]) -> None:
    assert {name for name, who in WHO.items() if need.met_by(who)} == allowed


def test_the_needed_role_is_described_for_403_answers() -> None:
    assert read(["beta"]).describe() == {"role": "reader", "tenants": ["beta"]}
    assert str(read(["beta"])) == "role reader for tenant beta or role admin"
    assert ingest("partition").describe() == {"role": "ingest", "group": "partition"}
    assert str(ADMIN) == "role admin"


def _app(tmp_path: Path, tokens: auth.TokenTable, **kwargs: object) -> tuple[FastAPI, MetastoreService]:
    return app_for(tmp_path, tokens, **kwargs)


def test_every_route_has_a_rule_and_only_probes_and_metrics_are_open(tmp_path: Path) -> None:
    app, _ = _app(tmp_path, auth.TokenTable(None))
    routes = {f"{m} {r.path}" for r in app.routes for m in getattr(r, "methods", ()) if m != "HEAD"}
    assert routes - set(auth.RULES) == {"POST /v1/commands"}  # decided by the command, from its body
    assert {r for r in routes if auth.rule_for(*r.split(" ", 1)) is auth.OPEN} == {
        "GET /healthz", "GET /readyz", "GET /metrics", "GET /", "GET /ui/login", "POST /ui/login", "POST /ui/logout"}
    assert auth.rule_for("GET", "/v1/some-route-added-later") is not auth.OPEN


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[httpx.Client, MetastoreService, dict[str, str]]]:
    tokens = {name: auth.new_token() for name in ("admin", "ingest-backup", "compactor", "reader-acme")}
    entries = [auth.TokenEntry(name="admin", role="admin", sha256=auth.digest(tokens["admin"])),
               auth.TokenEntry(name="ingest-backup", role="ingest", groups=["backup"],
                               sha256=auth.digest(tokens["ingest-backup"])),
               auth.TokenEntry(name="compactor", role="compactor", sha256=auth.digest(tokens["compactor"])),
               auth.TokenEntry(name="reader-acme", role="reader", tenants=["acme"],
                               sha256=auth.digest(tokens["reader-acme"]))]
    auth.write_private(tmp_path / "tokens.toml", "".join(auth.format_entry(e) for e in entries))
    app, service = _app(tmp_path, auth.TokenTable(tmp_path / "tokens.toml"), max_request_bytes=64 * 1024)
    service.submit(AddBlocks(blocks=[meta(tenant="acme", start=0), meta(tenant="beta", start=0)]))
    with served(app) as client:
        yield client, service, tokens


def _bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def _batch(group: str) -> bytes:
    block = meta(tenant="acme", group=group, start=5000, end=5010)
    return CommitIngestBatch(group=group, ranges=[OffsetRange(topic="app", partition=0, start=5000, end=5010)],
                             blocks=[block]).model_dump_json().encode()


MUTATING = [
    ("POST", "/v1/commands", _batch("backup")),
    ("POST", "/v1/commands", b'{"kind": "SetActiveGeneration", "tenant": "acme", "topic": "app", "generation": 2, '
                             b'"start": 0, "end": 9999999999999, "retire": true}'),
    ("POST", "/v1/commands", b'{"kind": "SetCompactionFailureLimit", "limit": 99}'),
    ("POST", "/v1/compaction/poll", b'{"worker": "w", "capacity": 5}'),
    ("POST", "/v1/raft/barrier", b""),
    ("GET", "/v1/snapshot", b""),
    ("GET", "/v1/state-hash", b""),
]


def test_without_a_valid_token_every_call_is_401_and_changes_nothing(api) -> None:  # type: ignore[no-untyped-def]
    client, service, _ = api
    before = service.state.state_hash()
    for method, path, body in MUTATING:
        for headers in ({}, _bearer("shale_not-a-known-token"), {"authorization": "Basic !!"}):
            answer = client.request(method, path, content=body, headers=headers)
            assert answer.status_code == 401, (path, answer.text)
            assert answer.json()["error"] == "unauthenticated"
            assert answer.headers.get_list("www-authenticate") == ['Bearer realm="shale"']
    assert service.state.state_hash() == before
    assert client.get("/healthz").status_code == 200
    assert client.get("/metrics").status_code == 200


def test_a_reader_gets_403_naming_the_role_needed_on_every_mutating_route(api) -> None:  # type: ignore[no-untyped-def]
    client, service, tokens = api
    before = service.state.state_hash()
    for method, path, body in MUTATING:
        answer = client.request(method, path, content=body, headers=_bearer(tokens["reader-acme"]))
        assert answer.status_code == 403, (path, answer.text)
        assert answer.json()["error"] == "forbidden"
        assert answer.json()["needed"]["role"] in ("ingest", "admin", "compactor", "peer")
        assert "token 'reader-acme' (role reader, tenants acme)" in answer.json()["message"]
    assert service.state.state_hash() == before


def test_readers_see_their_tenants_only(api) -> None:  # type: ignore[no-untyped-def]
    client, service, tokens = api
    reader = _bearer(tokens["reader-acme"])
    assert client.get("/v1/blocks", params={"tenant": "acme"}, headers=reader).status_code == 200
    for path, params in [("/v1/blocks", {"tenant": "beta"}), ("/v1/blocks", {"tenant": ["acme", "beta"]}),
                         ("/v1/labels", {"tenant": "beta"}), ("/v1/tenants/beta/blocks", {}),
                         ("/v1/offsets", {}), ("/v1/tombstones", {}), ("/ui", {})]:
        answer = client.get(path, params=params, headers=reader)
        assert answer.status_code == 403, path
    denied = client.get("/v1/blocks", params={"tenant": "beta"}, headers=reader).json()
    assert denied["needed"] == {"role": "reader", "tenants": ["beta"]}
    beta_block = service.tenant_blocks("beta")[0].id
    assert client.get(f"/v1/blocks/{beta_block}", headers=reader).status_code == 404  # as a missing one
    assert client.get("/v1/tenants", headers=reader).json() == {"tenants": ["acme"]}
    assert client.get("/v1/tenants", headers=_bearer(tokens["admin"])).json() == {"tenants": ["acme", "beta"]}
    assert client.get("/v1/status", headers=reader).status_code == 200


def test_ingest_tokens_commit_their_own_groups_and_compactors_poll(api) -> None:  # type: ignore[no-untyped-def]
    client, _, tokens = api
    own = client.post("/v1/commands", content=_batch("backup"), headers=_bearer(tokens["ingest-backup"]))
    assert own.status_code == 200, own.text
    other = client.post("/v1/commands", content=_batch("partition"), headers=_bearer(tokens["ingest-backup"]))
    assert other.status_code == 403
    assert other.json()["needed"] == {"role": "ingest", "group": "partition"}
    offsets = client.get("/v1/offsets", params={"group": "backup"}, headers=_bearer(tokens["ingest-backup"]))
    assert offsets.status_code == 200
    poll = client.post("/v1/compaction/poll", content=b'{"worker": "w", "capacity": 1}',
                       headers=_bearer(tokens["compactor"]))
    assert poll.status_code == 200, poll.text
    hoard = client.post("/v1/compaction/poll", content=b'{"worker": "w", "capacity": 100000}',
                        headers=_bearer(tokens["compactor"]))
    assert hoard.status_code == 400  # capacity is bounded (compaction.protocol.MAX_POLL_CAPACITY)
    assert "capacity" in hoard.json()["message"]


def test_basic_credentials_are_not_accepted(api) -> None:  # type: ignore[no-untyped-def]
    """Issue 27, case 1: a browser caches Basic credentials and sends them cross-site; they open nothing now."""
    client, _, tokens = api
    basic = base64.b64encode(f"anyone:{tokens['admin']}".encode()).decode()
    for path in ("/ui", "/v1/ui/status", "/v1/status"):
        answer = client.get(path, headers={"authorization": f"Basic {basic}"})
        assert answer.status_code in (303, 401), path
        assert "Basic" not in " ".join(answer.headers.get_list("www-authenticate"))


def test_oversized_bodies_are_refused_before_they_are_read(api) -> None:  # type: ignore[no-untyped-def]
    client, service, tokens = api
    before = service.state.state_hash()
    big = b'{"kind": "AddBlocks", "blocks": []' + b" " * 100_000 + b"}"
    declared = client.post("/v1/commands", content=big, headers=_bearer(tokens["admin"]))
    assert declared.status_code == 413
    assert "metastore.max_request_bytes" in declared.json()["message"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit applies to what arrives
        yield big[:50_000]
        yield big[50_000:]

    streamed = client.post("/v1/commands", content=chunks(), headers=_bearer(tokens["admin"]))
    assert streamed.status_code == 413
    assert service.state.state_hash() == before


def test_a_query_past_its_deadline_is_a_clear_422(api) -> None:  # type: ignore[no-untyped-def]
    client, service, tokens = api
    service.query_timeout = 0.0
    answer = client.get("/v1/blocks", params={"tenant": "acme"}, headers=_bearer(tokens["admin"]))
    assert answer.status_code == 422
    assert answer.json()["error"] == "query_timeout"


def test_the_tokens_file_is_reread_so_a_deleted_entry_is_revoked(tmp_path: Path) -> None:
    token = auth.new_token()
    entry = auth.TokenEntry(name="grafana", role="reader", tenants=["acme"], sha256=auth.digest(token))
    path = tmp_path / "tokens.toml"
    auth.write_private(path, auth.format_entry(entry))
    table = auth.TokenTable(path, recheck_seconds=0)
    assert table.authenticate(token) == Principal("grafana", "reader", tenants=frozenset({"acme"}))
    assert table.authenticate(token + "x") is None
    auth.write_private(path, "# every token revoked\n")
    assert table.authenticate(token) is None
    path.write_text("[[token]]\nname = 'x'\nrole = 'ingest'\nsha256 = '" + "0" * 64 + "'\n")
    assert table.authenticate(token) is None
    with pytest.raises(ConfigError, match="an ingest token lists the groups"):
        auth.load_tokens(path)


@pytest.mark.parametrize("breakage", ["deleted", "not TOML", "an invalid entry", "unreadable"])
def test_a_tokens_file_deleted_or_broken_revokes_its_tokens(tmp_path: Path, breakage: str,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    """Issue 27, case 2: fail closed. Deleting (or corrupting) the tokens file used to keep every loaded token
    valid; now it revokes them all, loudly, until the file is valid again. Fixed tokens (peer, local admin) stay."""
    token, local = auth.new_token(), auth.new_token()
    entry = auth.TokenEntry(name="grafana", role="reader", tenants=["acme"], sha256=auth.digest(token))
    path = tmp_path / "tokens.toml"
    auth.write_private(path, auth.format_entry(entry))
    table = auth.TokenTable(path, recheck_seconds=0)
    table.add(local, Principal("local-admin", "admin"))
    assert table.authenticate(token) is not None
    if breakage == "deleted":
        path.unlink()
    elif breakage == "not TOML":
        path.write_text("[[token]\nname = ")
    elif breakage == "an invalid entry":
        path.write_text(auth.format_entry(entry).replace("reader", "root"))
    else:
        path.unlink()
        path.mkdir()  # reading a directory fails (as root, a chmod would not)
    with caplog.at_level("ERROR", logger="shale.metastore.api.auth"):
        assert table.authenticate(token) is None
        assert table.authenticate(token) is None
    assert [r.message for r in caplog.records].count(caplog.records[0].message) == 1  # said once, not per call
    assert "every token it listed is refused" in caplog.records[0].message
    assert table.authenticate(local) == Principal("local-admin", "admin")
    if path.is_dir():
        path.rmdir()
    auth.write_private(path, auth.format_entry(entry))
    assert table.authenticate(token) is not None


def test_token_headers_and_files(tmp_path: Path) -> None:
    basic = base64.b64encode(b"user:shale_abc").decode()
    assert auth.token_from_header(f"Basic {basic}") is None
    assert auth.token_from_header("Bearer shale_abc") == "shale_abc"
    assert auth.token_from_header("Digest x") is None
    assert auth.token_from_header(None) is None
    path, token = auth.local_admin_token(tmp_path)
    assert path.stat().st_mode & 0o777 == 0o600
    assert auth.local_admin_token(tmp_path) == (path, token)  # created once, then reused
    path.chmod(0o644)
    with pytest.raises(ConfigError, match="readable by other users"):
        auth.read_token_file(path, "the local admin token")
