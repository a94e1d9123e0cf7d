"""The real metastore app on a real single-node state, served by uvicorn on loopback in a thread of the test, with
a tokens file of one token per role (shared by the security tests)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import uvicorn
from fastapi import FastAPI
from tests.waiting import eventually

from shale.config import CompactionConfig, ShaleConfig
from shale.metastore import SingleNodeLog, StateMachine, read_only_index
from shale.metastore.api import auth
from shale.metastore.api.http import create_app
from shale.metastore.api.service import MetastoreService
from shale.objstore import open_bucket_url
from shale.process import free_port
from shale.web import mount

ENTRIES = {  # name: (role, groups, tenants)
    "admin": ("admin", [], []),
    "ingest-backup": ("ingest", ["backup"], []),
    "compactor": ("compactor", [], []),
    "reader-acme": ("reader", [], ["acme"]),
    "reader-all": ("reader", [], ["*"]),
    "revoked": ("reader", [], ["*"]),
}


def app_for(tmp_path: Path, tokens: auth.TokenTable, bucket_url: str = "", clock: Callable[[], float] = time.time,
            compaction: CompactionConfig | None = None, **kwargs: object) -> tuple[FastAPI, MetastoreService]:
    state = StateMachine(tmp_path / "state.db")
    service = MetastoreService(state, SingleNodeLog(state, clock=clock), clock=clock, compaction=compaction)
    app = create_app(service, lambda: "http://self", lambda: True, lambda: 0, tokens, **kwargs)  # type: ignore[arg-type]
    mount(app, read_only_index(tmp_path / "state.db"), service.status,
          open_bucket_url(bucket_url or f"memory://auth-{os.getpid()}"), ShaleConfig())
    return app, service


def write_tokens(path: Path, names: list[str], tokens: dict[str, str]) -> None:
    entries = [auth.TokenEntry(name=n, role=ENTRIES[n][0], groups=ENTRIES[n][1], tenants=ENTRIES[n][2],  # type: ignore[arg-type]
                               sha256=auth.digest(tokens[n])) for n in names]
    auth.write_private(path, "".join(auth.format_entry(e) for e in entries))


def issue(tmp_path: Path) -> tuple[dict[str, str], auth.TokenTable]:
    """A token per entry, all in a tokens file re-read on every call."""
    tokens = {name: auth.new_token() for name in ENTRIES}
    write_tokens(tmp_path / "tokens.toml", list(ENTRIES), tokens)
    return tokens, auth.TokenTable(tmp_path / "tokens.toml", recheck_seconds=0)


def revoke(tmp_path: Path, tokens: dict[str, str], name: str) -> None:
    write_tokens(tmp_path / "tokens.toml", [n for n in ENTRIES if n != name], tokens)


@contextmanager
def served(app: FastAPI) -> Iterator[httpx.Client]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    eventually(lambda: server.started, 30, "the test server to start")
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30,
                          headers={"content-type": "application/json"}) as client:
            yield client
    finally:
        server.should_exit = True
        thread.join(timeout=30)
