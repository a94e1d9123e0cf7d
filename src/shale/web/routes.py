"""The status page's routes, added to the metastore's FastAPI app by ``shale metastore serve``: the page, its JSON,
and the login form that opens a browser session (``metastore/api/sessions.py``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any
from urllib.parse import parse_qs

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from shale.config import ShaleConfig
from shale.metastore import IndexReads
from shale.metastore.api import auth, sessions
from shale.objstore import BucketReader
from shale.web.page import login_page, render
from shale.web.status import collect

MAX_FORM_BYTES = 4096


def mount(app: FastAPI, index: IndexReads, node_status: Callable[[], dict[str, Any]], bucket: BucketReader,
          config: ShaleConfig,
          partial_blocks: Callable[[], dict[str, int]] = dict,
          iceberg: Callable[[], dict[str, Any]] = dict,
          overlaps: Callable[[], dict[str, list[dict[str, Any]]]] = dict) -> None:
    browser: sessions.Sessions = app.state.sessions
    tokens: auth.TokenTable = app.state.tokens

    @app.get("/", include_in_schema=False)
    def root() -> RedirectResponse:
        return RedirectResponse("/ui")

    @app.get("/ui", response_class=HTMLResponse)
    async def ui() -> str:
        status = await run_in_threadpool(collect, index, node_status(), bucket, config, partial_blocks(), iceberg(),
                                           overlaps())
        return render(status)

    @app.get("/v1/ui/status")
    async def ui_status() -> dict[str, Any]:
        return asdict(await run_in_threadpool(collect, index, node_status(), bucket, config, partial_blocks(),
                                              iceberg(), overlaps()))

    @app.get("/ui/login", response_class=HTMLResponse, include_in_schema=False)
    def login_form() -> str:
        return login_page()

    @app.post("/ui/login", include_in_schema=False)
    async def login(request: Request) -> Response:
        """The token typed into the form opens a session if it may read the page (a reader of every tenant)."""
        body = await request.body()
        token = parse_qs(body[:MAX_FORM_BYTES].decode(errors="replace")).get("token", [""])[0].strip()
        who = tokens.authenticate(token) if token else None
        if who is None or not auth.EVERY_TENANT.met_by(who):
            message = "unknown token" if who is None else f"{who} may not open the status page: it needs " \
                                                          f"{auth.EVERY_TENANT}"
            return HTMLResponse(login_page(message), status_code=401 if who is None else 403)
        response = RedirectResponse("/ui", status_code=303)
        response.headers.append("set-cookie", sessions.cookie_header(browser.open(token),
                                                                     secure=request.url.scheme == "https"))
        return response

    @app.post("/ui/logout", include_in_schema=False)
    def logout(request: Request) -> Response:
        browser.close(request.cookies.get(sessions.COOKIE))
        response = RedirectResponse("/ui/login", status_code=303)
        response.headers.append("set-cookie", sessions.cleared_cookie_header(secure=request.url.scheme == "https"))
        return response
