"""The metastore's HTTP/JSON API (FastAPI). Writes go to the leader; any node answers reads linearizably.

Every route but /healthz, /readyz, /metrics and the status page's login form needs a token, checked before
anything else about the request but its origin and body type (auth.py has the rule of each route; sessions.py the
cross-site checks and the browser sessions). Errors: 403 ``cross_site`` for a state-changing request from another
site, 415 for one whose body is not JSON (or msgpack), 401 without a valid token (``reason``: ``missing_token`` or
``unknown_token``), 403 when the token's role or scope does
not allow the call (the body names the role, group or tenant needed), 400 for a malformed request (the body says
what is wrong), 409 for a command the state machine rejected (the body is its ``Result``), 413 for a body over
``metastore.max_request_bytes`` (refused before it is read), 422 for a query stopped at its deadline, 503 when
this node cannot serve the call right now, with ``{"error": "not_leader", "leader": "<http address>"}`` when
another node is the leader.
"""

from __future__ import annotations

import inspect
import shutil
import tempfile
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, Counter, generate_latest
from pydantic import ValidationError
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shale.compaction import PollRequest
from shale.errors import (
    AccessDeniedError,
    CommandRejectedError,
    InvalidNameError,
    MetastoreUnavailableError,
    NotLeaderError,
    QueryTimeoutError,
)
from shale.metastore.api import auth, openapi, sessions
from shale.metastore.api.reads import PAGE_LIMIT, Read, served_reads
from shale.metastore.api.service import MetastoreService
from shale.metastore.rules import (
    CLIENT_COMMANDS,
    CommitIngestBatch,
    IngestLeaseCommand,
    RecordRestore,
    RequestErasure,
    decode,
    encode,
)

AUTH_FAILURES = Counter("shale_metastore_auth_failures_total", "API calls refused before they ran, by route and "
                        "reason: missing or unknown token (401), forbidden (403), too-large body (413).",
                        ["route", "reason"])


class _BodyLimit:
    """Refuse request bodies over ``limit`` bytes with 413: at once when Content-Length says so, else as soon as
    the chunks received pass the limit (the body is never held whole)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._refuse(scope, send)
            return
        received = 0
        started = False

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.limit:
                raise _TooLargeError
            return message

        async def watch(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited, watch)
        except _TooLargeError:
            if not started:
                await self._refuse(scope, send)

    async def _refuse(self, scope: Scope, send: Send) -> None:
        AUTH_FAILURES.labels("(before routing)", "too-large").inc()  # not the path: callers choose paths freely
        response = JSONResponse({"error": "too_large", "message": f"request body over {self.limit} bytes "
                                 "(metastore.max_request_bytes); split the request"}, status_code=413,
                                headers={"connection": "close"})
        await response(scope, _no_receive, send)


class _TooLargeError(Exception):
    pass


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}


def _principal(request: Request) -> auth.Principal:
    who: auth.Principal = request.state.principal
    return who


def _deny(request: Request, need: auth.Need) -> None:
    """Raise 403 unless the caller meets ``need`` (for checks that need data the route rule did not have)."""
    who = _principal(request)
    if not need.met_by(who):
        route = getattr(request.scope.get("route"), "path", request.url.path)
        AUTH_FAILURES.labels(route, "forbidden").inc()
        raise _ForbiddenError(who, need)


class _ForbiddenError(Exception):
    def __init__(self, who: auth.Principal, need: auth.Need) -> None:
        super().__init__(f"{who} may not make this call: it needs {need}")
        self.need = need


class _UnauthenticatedError(AccessDeniedError):
    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message, status=401)
        self.reason = reason


class _RefusedError(Exception):
    """Refused before authentication: a cross-site request (403) or a body type a browser form could send (415)."""

    def __init__(self, message: str, error: str, status: int) -> None:
        super().__init__(message)
        self.error = error
        self.status = status


def _check_origin_and_type(request: Request, route: str) -> None:
    form = f"{request.method} {route}" in sessions.FORM_ROUTES
    why = sessions.cross_site(request.method, request.headers.get("origin"), request.headers.get("sec-fetch-site"),
                              request.headers.get("host"), form)
    if why is not None:
        AUTH_FAILURES.labels(route, "cross-site").inc()
        raise _RefusedError(why, "cross_site", 403)
    why = sessions.wrong_content_type(request.method, request.headers.get("content-type"), form)
    if why is not None:
        AUTH_FAILURES.labels(route, "content-type").inc()
        raise _RefusedError(why, "unsupported_media_type", 415)


def _authenticate(request: Request, route: str, tokens: auth.TokenTable,
                  browser: sessions.Sessions) -> auth.Principal:
    token = auth.token_from_header(request.headers.get("authorization"))
    who = tokens.authenticate(token) if token else None
    if token is None and f"{request.method} {route}" in sessions.SESSION_ROUTES:
        digest = browser.digest(request.cookies.get(sessions.COOKIE))
        who = tokens.authenticate_digest(digest) if digest is not None else None
    if who is None:
        reason = "missing_token" if token is None else "unknown_token"
        AUTH_FAILURES.labels(route, reason.replace("_", "-")).inc()
        raise _UnauthenticatedError("this call needs a metastore API token (Authorization: Bearer <token>); "
                                    + ("none was sent" if token is None else "the one sent is not known here")
                                    + ". Clients read it from metastore.token_file or $SHALE_METASTORE__TOKEN (on a "
                                    "single-node metastore's host: <metastore.data_dir>/admin.token); a browser "
                                    "logs in at /ui/login", reason)
    return who


def _authorizer(tokens: auth.TokenTable, browser: sessions.Sessions) -> Callable[[Request], Any]:
    async def authorize(request: Request) -> None:
        """Every route's first step: refuse cross-site requests and form bodies (403, 415), authenticate the token
        (401), then apply the route's rule (403)."""
        route = getattr(request.scope.get("route"), "path", request.url.path)
        _check_origin_and_type(request, route)
        rule = auth.rule_for(request.method, route)
        if rule is auth.OPEN:
            return
        who = _authenticate(request, route, tokens, browser)
        request.state.principal = who
        if route == "/v1/commands" and request.method == "POST":
            command = decode(await request.body())  # validated before anything reaches the log
            request.state.command = command
            group = command.group if isinstance(command, CommitIngestBatch | IngestLeaseCommand) else None
            need = auth.command_need(command.kind, group)
        else:
            need = await rule(request) or auth.ADMIN
        _deny(request, need)
    return authorize


def mount_reads(app: FastAPI, service: MetastoreService) -> None:
    """A GET route per path of the served reads (``reads.served``): its parameters are the reads' own, named and
    bounded as the declaration says, and it answers ``{key: value}`` for each read on the path."""
    paths: dict[str, list[Read[Any, Any]]] = {}
    for read in served_reads():
        assert read.route is not None
        paths.setdefault(read.route.path, []).append(read)
    for path, reads in paths.items():
        app.get(path, name=reads[0].name)(_answer(service, reads))


def _answer(service: MetastoreService, reads: list[Read[Any, Any]]) -> Callable[..., Response]:
    first = reads[0]
    assert first.route is not None
    parameters = []
    for p in first.signature.parameters.values():
        annotation = p.annotation
        if typing.get_origin(annotation) is Sequence:  # a repeated query parameter
            annotation = list[typing.get_args(annotation)]  # type: ignore[misc]
        default = ... if p.default is inspect.Parameter.empty else p.default
        if "{" + p.name + "}" not in first.route.path:
            default = Query(default, **first.route.params.get(p.name, {}))
        parameters.append(p.replace(annotation=annotation, default=default, kind=inspect.Parameter.KEYWORD_ONLY))

    def answer(**arguments: Any) -> Response:
        parts = [b'"%s":%s' % (r.route.key.encode(), r.answer.dump_json(getattr(service, r.name)(**arguments)))
                 for r in reads if r.route is not None]
        return Response(b"{" + b",".join(parts) + b"}", media_type="application/json")

    answer.__signature__ = inspect.Signature(parameters, return_annotation=Response)  # type: ignore[attr-defined]
    answer.__name__ = first.name
    return answer


def create_app(service: MetastoreService, leader_http: Callable[[], str | None],
               ready: Callable[[], bool], barrier: Callable[[], int], tokens: auth.TokenTable,
               max_request_bytes: int = 16 * 2**20) -> FastAPI:
    """``leader_http`` maps the current Raft leader to its HTTP address; ``ready`` says whether this node can
    serve (a leader is known and it has caught up); ``barrier`` is the leader's read barrier; ``tokens`` are
    the callers it accepts."""
    # No interactive docs; the OpenAPI schema is served to authenticated callers (openapi.py).
    browser = sessions.Sessions()
    app = FastAPI(title="Shale metastore", version="1", docs_url=None, redoc_url=None, openapi_url=None,
                  dependencies=[Depends(_authorizer(tokens, browser))])
    app.state.sessions = browser
    app.state.tokens = tokens
    app.add_middleware(_BodyLimit, limit=max_request_bytes)

    @app.exception_handler(AccessDeniedError)
    async def _unauthenticated(request: Request, exc: AccessDeniedError) -> Response:
        if request.method == "GET" and request.url.path == "/ui":  # a browser without a session: the login form
            return RedirectResponse("/ui/login", status_code=303)
        reason = exc.reason if isinstance(exc, _UnauthenticatedError) else "unauthenticated"
        return JSONResponse({"error": "unauthenticated", "reason": reason, "message": str(exc)}, status_code=401,
                            headers={"www-authenticate": 'Bearer realm="shale"'})

    @app.exception_handler(RequestValidationError)
    async def _bad_parameters(request: Request, exc: RequestValidationError) -> JSONResponse:
        # 400 like every malformed request (FastAPI's default 422 means a query stopped at its deadline here).
        error = exc.errors()[0]
        where = ".".join(str(p) for p in error.get("loc", ()))
        return JSONResponse({"error": "invalid", "message": f"{error.get('msg', 'invalid')} at {where}"},
                            status_code=400)

    @app.exception_handler(_RefusedError)
    async def _refused(request: Request, exc: _RefusedError) -> JSONResponse:
        return JSONResponse({"error": exc.error, "message": str(exc)}, status_code=exc.status)

    @app.exception_handler(_ForbiddenError)
    async def _forbidden(request: Request, exc: _ForbiddenError) -> JSONResponse:
        return JSONResponse({"error": "forbidden", "message": str(exc), "needed": exc.need.describe()},
                            status_code=403)

    @app.exception_handler(QueryTimeoutError)
    async def _query_timeout(request: Request, exc: QueryTimeoutError) -> JSONResponse:
        return JSONResponse({"error": "query_timeout", "message": str(exc)}, status_code=422)

    @app.exception_handler(NotLeaderError)
    async def _not_leader(request: Request, exc: NotLeaderError) -> JSONResponse:
        return JSONResponse({"error": "not_leader", "leader": leader_http(), "message": str(exc)}, status_code=503)

    @app.exception_handler(MetastoreUnavailableError)
    async def _unavailable(request: Request, exc: MetastoreUnavailableError) -> JSONResponse:
        return JSONResponse({"error": "unavailable", "message": str(exc)}, status_code=503)

    @app.exception_handler(InvalidNameError)
    async def _invalid(request: Request, exc: InvalidNameError) -> JSONResponse:
        return JSONResponse({"error": "invalid", "message": str(exc)}, status_code=400)

    @app.exception_handler(CommandRejectedError)
    async def _rejected(request: Request, exc: CommandRejectedError) -> JSONResponse:
        return JSONResponse({"error": exc.reason, "message": str(exc)}, status_code=400)

    @app.post("/v1/commands")
    async def commands(request: Request) -> Response:
        body = await request.body()
        command = request.state.command  # decoded and authorized by the route's rule
        if command.kind not in CLIENT_COMMANDS:
            raise CommandRejectedError(f"{command.kind} is proposed by the metastore itself, not by clients",
                                       reason="forbidden")
        if isinstance(command, RecordRestore | RequestErasure):  # who: the caller's token, whatever the body says
            body = encode(command.model_copy(update={"by": f"token {_principal(request).name}"}))
        result = await run_in_threadpool(service.submit_bytes, body)
        return JSONResponse(result.model_dump(mode="json"), status_code=200 if result.ok else 409)

    @app.post("/v1/compaction/poll")
    async def compaction_poll(request: Request) -> Response:
        try:
            poll = PollRequest.model_validate_json(await request.body())
        except ValidationError as exc:
            error = exc.errors()[0]
            raise CommandRejectedError(f"invalid poll: {error['msg']} at {'.'.join(str(p) for p in error['loc'])}",
                                       reason="malformed") from None
        response = await run_in_threadpool(service.poll_compaction, poll)
        return Response(response.model_dump_json(), media_type="application/json")

    mount_reads(app, service)

    @app.post("/v1/raft/barrier")
    async def raft_barrier(request: Request) -> dict[str, int]:
        return {"index": await run_in_threadpool(barrier)}

    @app.get("/v1/blocks/{block_id}")
    def block(block_id: str, request: Request) -> Response:
        meta = service.get_block(block_id)
        if meta is None or not auth.read([meta.tenant]).met_by(_principal(request)):
            # The same answer for a block of a tenant the caller may not read as for no block at all: the
            # answer says nothing about other tenants' blocks.
            return JSONResponse({"error": "not_found", "message": f"no block {block_id} in the index among the "
                                 "tenants this token may read"}, 404)
        return Response(meta.model_dump_json(), media_type="application/json")

    @app.get("/v1/tenants/{tenant}/blocks")
    def tenant_blocks(tenant: str, after: str = Query("", max_length=40),
                      limit: int = Query(PAGE_LIMIT, ge=1, le=PAGE_LIMIT)) -> Response:
        metas = service.tenant_blocks(tenant, after=after, limit=limit + 1)
        more = len(metas) > limit
        metas = metas[:limit]
        after_json = f', "next": "{metas[-1].id}"' if more else ""
        return Response('{"blocks": [' + ",".join(m.model_dump_json() for m in metas) + "]" + after_json + "}",
                        media_type="application/json")

    @app.get("/v1/offsets")
    def offsets(group: str | None = None, generation: int | None = None, history: bool = False) -> dict[str, Any]:
        body: dict[str, Any] = {"offsets": [o.model_dump() for o in service.offsets(group, generation)]}
        if history:
            incarnations, losses = service.offset_history(group, generation)
            body.update(incarnations=[i.model_dump() for i in incarnations], losses=[x.model_dump() for x in losses])
        return body

    @app.get("/v1/tenants")
    def tenants(request: Request) -> dict[str, list[str]]:
        return {"tenants": auth.visible_tenants(_principal(request), service.tenants())}

    @app.get("/v1/status")
    def status() -> dict[str, Any]:
        return {**service.status(), "leader_http": leader_http()}

    @app.get("/v1/state-hash")
    def state_hash() -> dict[str, Any]:
        return {"hash": service.state.state_hash(), "content_hash": service.state.state_hash(with_applied=False),
                "applied_index": service.state.applied()[0]}

    @app.get("/v1/snapshot")
    def snapshot() -> FileResponse:
        folder = Path(tempfile.mkdtemp(prefix="shale-snapshot-"))
        target = folder / "metastore.db"
        service.state.backup_to(target)
        return FileResponse(target, filename="metastore.db",
                            background=BackgroundTask(shutil.rmtree, folder, ignore_errors=True))

    @app.get("/v1/openapi.json", include_in_schema=False)
    def openapi_schema() -> dict[str, Any]:
        return openapi.schema(app)

    @app.get("/healthz")
    def healthz() -> PlainTextResponse:
        return PlainTextResponse("ok")

    @app.get("/readyz")
    def readyz() -> PlainTextResponse:
        return PlainTextResponse("ready" if ready() else "not ready", status_code=200 if ready() else 503)

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    return app

