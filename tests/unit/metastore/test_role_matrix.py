"""Issue 27: the role matrix. Every route x every caller (each role, no token, an unknown token, a revoked token) x
(own tenant or group, another one), sent to the real HTTP server; each answer must be the one the code's rules
give (``auth.RULES``, ``auth.command_need``), and docs/design/metastore.md (9.6) must hold the table those rules
generate.

Regenerate the table after changing a rule: ``python -m tests.unit.metastore.test_role_matrix --write``.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from starlette.datastructures import QueryParams
from tests.unit.metastore.helpers import meta
from tests.unit.metastore.served import ENTRIES, app_for, issue, revoke, served

from shale.iceberg.http import mount_sync
from shale.metastore import AddBlocks, CommitIngestBatch, OffsetRange
from shale.metastore.api import auth
from shale.metastore.api.auth import Principal
from shale.metastore.raft import raftwire

DESIGN = Path(__file__).resolve().parents[3] / "docs" / "design" / "metastore.md"
BEGIN, END = "<!-- role-matrix (generated: tests/unit/metastore/test_role_matrix.py) -->", "<!-- /role-matrix -->"
PEER_SECRET = "matrix-cluster-secret"
CALLERS: dict[str, Principal | None] = {  # None: not authenticated
    "admin": Principal("admin", "admin"),
    "ingest (backup)": Principal("ingest-backup", "ingest", groups=frozenset({"backup"})),
    "compactor": Principal("compactor", "compactor"),
    "reader (acme)": Principal("reader-acme", "reader", tenants=frozenset({"acme"})),
    "reader (*)": Principal("reader-all", "reader", tenants=frozenset({"*"})),
    "peer": Principal("metastore-peer", "peer"),
    "no token": None, "unknown token": None, "revoked token": None,
}
TOKEN_OF = {"admin": "admin", "ingest (backup)": "ingest-backup", "compactor": "compactor",
            "reader (acme)": "reader-acme", "reader (*)": "reader-all", "revoked token": "revoked"}
OWN, OTHER = {"tenant": "acme", "group": "backup"}, {"tenant": "beta", "group": "partition"}
BLOCKS = {t: meta(tenant=t, start=0) for t in ("acme", "beta")}


class _Publisher:
    """Stands in for the Iceberg publisher behind ``POST /v1/iceberg/sync`` (mounted by the CLI when enabled)."""

    def sync(self, full: bool = False) -> dict[str, object]:
        return {"full": full}


def _app(tmp_path: Path, tokens: auth.TokenTable) -> tuple[Any, Any]:
    app, service = app_for(tmp_path, tokens)
    mount_sync(app, _Publisher(), lambda: True)  # type: ignore[arg-type]
    return app, service


def _batch(group: str) -> str:
    block = meta(tenant="acme", group=group, start=5000, end=5010)
    return CommitIngestBatch(group=group, ranges=[OffsetRange(topic="app", partition=0, start=5000, end=5010)],
                             blocks=[block]).model_dump_json()


@dataclass(frozen=True)
class Row:
    """One request of the matrix: ``{tenant}``, ``{group}`` and ``{block}`` are filled with the caller's own (or
    another) tenant, group and a block of that tenant."""

    method: str
    route: str  # the route's path template, as in auth.RULES
    path: str = ""
    query: str = ""
    body: str = ""
    ok: int = 200
    label: str = ""

    def fill(self, scope: dict[str, str]) -> tuple[str, str, str]:
        values = {**scope, "block": BLOCKS[scope["tenant"]].id}
        return ((self.path or self.route).format(**values), self.query.format(**values),
                self.body.replace("{group}", scope["group"]))

    @property
    def scoped(self) -> bool:
        return "{" in self.path + self.query + self.body

    @property
    def name(self) -> str:
        return f"`{self.method} {self.route}`" + (f" {self.label}" if self.label else "")


ROWS = [
    Row("GET", "/healthz"), Row("GET", "/readyz"), Row("GET", "/metrics"), Row("GET", "/", ok=307),
    Row("GET", "/ui/login"), Row("POST", "/ui/login", ok=303, label="(the caller's token in the form)"),
    Row("POST", "/ui/logout", ok=303),
    Row("GET", "/v1/openapi.json"),
    Row("POST", "/v1/commands", body="<batch {group}>", label="CommitIngestBatch"),
    Row("POST", "/v1/commands", body='{"kind": "SetCompactionFailureLimit", "limit": 5}',
        label="any other kind (here SetCompactionFailureLimit)"),
    Row("POST", "/v1/compaction/poll", body='{"worker": "matrix", "capacity": 0}'),
    Row("GET", "/v1/compaction/jobs"),
    Row("GET", "/v1/restores"),
    Row("GET", "/v1/erasures"),
    Row("POST", "/v1/raft/barrier", body="{}"),
    Row("GET", "/v1/blocks", query="tenant={tenant}"),
    Row("GET", "/v1/blocks/{block_id}", path="/v1/blocks/{block}"),
    Row("GET", "/v1/tenants/{tenant}/blocks", path="/v1/tenants/{tenant}/blocks"),
    Row("GET", "/v1/tenants/{tenant}/generations", path="/v1/tenants/{tenant}/generations"),
    Row("GET", "/v1/tenants/{tenant}/schemas", path="/v1/tenants/{tenant}/schemas"),
    Row("GET", "/v1/labels", query="tenant={tenant}"),
    Row("GET", "/v1/labels/{name}/values", path="/v1/labels/topic/values", query="tenant={tenant}"),
    Row("GET", "/v1/offsets", query="group={group}"),
    Row("GET", "/v1/ingest/leases", query="group={group}"),
    Row("GET", "/v1/tombstones"), Row("GET", "/v1/tenants"), Row("GET", "/v1/status"),
    Row("GET", "/v1/state-hash"), Row("GET", "/v1/snapshot"),
    Row("GET", "/ui"), Row("GET", "/v1/ui/status"),
    Row("POST", "/v1/iceberg/sync", body="{}", label="(when Iceberg publishing is enabled)"),
]


def _need(row: Row, scope: dict[str, str]) -> auth.Need | None:
    """The need the code's rule gives this request (None: open)."""
    _, query, _ = row.fill(scope)
    if row.route == "/v1/commands":
        return auth.command_need("CommitIngestBatch", scope["group"]) if "batch" in row.body else \
            auth.command_need("SetCompactionFailureLimit")
    request = SimpleNamespace(query_params=QueryParams(query), path_params={"tenant": scope["tenant"]})
    return asyncio.run(auth.rule_for(row.method, row.route)(request))


def expected(row: Row, caller: str, scope: dict[str, str]) -> int:
    who = CALLERS[caller]
    if row.route == "/ui/login" and row.method == "POST":  # an open form that checks the token it is sent
        return 401 if who is None else (row.ok if auth.EVERY_TENANT.met_by(who) else 403)
    need = _need(row, scope)
    if need is None:
        return row.ok
    if who is None:
        return 303 if row.route == "/ui" else 401  # a browser without a session is sent to the login form
    if not need.met_by(who):
        return 403
    if row.route == "/v1/blocks/{block_id}" and not auth.read([scope["tenant"]]).met_by(who):
        return 404  # another tenant's block answers as a missing one
    return row.ok


def table() -> str:
    head = "| request | " + " | ".join(CALLERS) + " |\n|" + " --- |" * (len(CALLERS) + 1) + "\n"
    lines = []
    for row in ROWS:
        cells = []
        for caller in CALLERS:
            own, other = expected(row, caller, OWN), expected(row, caller, OTHER)
            cells.append(str(own) if own == other or not row.scoped else f"{own} / {other}")
        lines.append(f"| {row.name} | " + " | ".join(cells) + " |")
    return head + "\n".join(lines) + "\n"


def test_every_route_is_in_the_matrix(tmp_path: Path) -> None:
    _, table_ = issue(tmp_path)
    app, _ = _app(tmp_path, table_)
    routes = {f"{m} {r.path}" for r in app.routes for m in getattr(r, "methods", ()) if m != "HEAD"}
    assert routes == {f"{row.method} {row.route}" for row in ROWS}


def test_the_design_document_holds_the_table_the_rules_generate() -> None:
    text = DESIGN.read_text()
    assert BEGIN in text, f"docs/design/metastore.md (9.6) lacks the role matrix markers {BEGIN}"
    assert END in text
    documented = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert documented == table().strip(), ("docs/design/metastore.md's role matrix differs from the rules; "
                                           "regenerate it: python -m tests.unit.metastore.test_role_matrix --write")


def test_the_server_answers_as_the_matrix_says(tmp_path: Path) -> None:
    tokens, tokens_table = issue(tmp_path)
    peer = raftwire.peer_token(PEER_SECRET)
    tokens_table.add(peer, CALLERS["peer"])  # type: ignore[arg-type]
    revoke(tmp_path, tokens, "revoked")
    app, service = _app(tmp_path, tokens_table)
    service.submit(AddBlocks(blocks=list(BLOCKS.values())))
    secrets = {**{c: tokens[n] for c, n in TOKEN_OF.items()}, "peer": peer, "unknown token": auth.new_token()}
    wrong = []
    with served(app) as client:
        origin = str(client.base_url).rstrip("/")
        for row in ROWS:
            for scope in (OWN, OTHER) if row.scoped else (OWN,):
                for caller in CALLERS:
                    path, query, body = row.fill(scope)
                    if body.startswith("<batch"):
                        body = _batch(scope["group"])
                    headers = {"authorization": f"Bearer {secrets[caller]}"} if caller in secrets else {}
                    if row.route.startswith("/ui/log"):
                        headers = {"content-type": "application/x-www-form-urlencoded", "origin": origin}
                        body = f"token={secrets.get(caller, '')}"
                    answer = client.request(row.method, path + (f"?{query}" if query else ""),
                                            content=body.encode(), headers=headers)
                    want = expected(row, caller, scope)
                    if answer.status_code != want:
                        wrong.append(f"{row.method} {path}?{query} as {caller}: {answer.status_code}, "
                                     f"documented {want}: {answer.text[:200]}")
    assert not wrong, "\n".join(wrong)
    assert set(TOKEN_OF.values()) <= set(ENTRIES)


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        text = DESIGN.read_text()
        before, rest = text.split(BEGIN, 1)
        DESIGN.write_text(before + BEGIN + "\n" + table() + rest[rest.index(END):])
    else:
        sys.stdout.write(table())
