"""The metastore's HTTP/JSON API (FastAPI). Writes go to the leader; any node answers reads linearizably.

Errors: 400 for a malformed request (the body says what is wrong), 409 for a command the state machine
rejected (the body is its ``Result``), 503 when this node cannot serve the call right now, with
``{"error": "not_leader", "leader": "<http address>"}`` when another node is the leader.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from shale.compaction.protocol import PollRequest
from shale.errors import CommandRejectedError, InvalidNameError, MetastoreUnavailableError, NotLeaderError
from shale.metastore.commands import decode
from shale.metastore.service import MetastoreService

CLIENT_COMMANDS = {"Noop", "AddBlocks", "CommitIngestBatch", "ReplaceBlocks", "DeleteTombstones",
                   "SetCompactionFailureLimit", "SetActiveGeneration"}


def create_app(service: MetastoreService, leader_http: Callable[[], str | None],
               ready: Callable[[], bool], barrier: Callable[[], int]) -> FastAPI:
    """``leader_http`` maps the current Raft leader to its HTTP address; ``ready`` says whether this node can
    serve (a leader is known and it has caught up); ``barrier`` is the leader's read barrier."""
    app = FastAPI(title="Shale metastore", version="1")

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
        command = decode(body)  # validates before anything reaches the log
        if command.kind not in CLIENT_COMMANDS:
            raise CommandRejectedError(f"{command.kind} is proposed by the metastore itself, not by clients",
                                       reason="forbidden")
        result = await run_in_threadpool(service.submit_bytes, body)
        return JSONResponse(result.model_dump(mode="json"), status_code=200 if result.ok else 409)

    @app.post("/v1/compaction/poll")
    async def compaction_poll(request: Request) -> Response:
        poll = PollRequest.model_validate_json(await request.body())
        response = await run_in_threadpool(service.poll_compaction, poll)
        return Response(response.model_dump_json(), media_type="application/json")

    @app.get("/v1/compaction/jobs")
    def compaction_jobs() -> dict[str, Any]:
        return {"jobs": service.compaction_jobs(), "queue": service.compaction_queue()}

    @app.post("/v1/raft/barrier")
    async def raft_barrier(request: Request) -> dict[str, int]:
        return {"index": await run_in_threadpool(barrier)}

    @app.get("/v1/blocks")
    def blocks(tenant: list[str] = Query(...), start: int = 0, end: int = 2**62, selector: str = "",  # noqa: B008
               group: str | None = None) -> Response:
        metas = service.query_blocks(tenant, start, end, selector, group)
        payload = "[" + ",".join(m.model_dump_json() for m in metas) + "]"
        return Response(f'{{"blocks": {payload}}}', media_type="application/json")

    @app.get("/v1/blocks/{block_id}")
    def block(block_id: str) -> Response:
        meta = service.get_block(block_id)
        if meta is None:
            return JSONResponse({"error": "not_found", "message": f"no block {block_id} in the index"}, 404)
        return Response(meta.model_dump_json(), media_type="application/json")

    @app.get("/v1/tenants/{tenant}/blocks")
    def tenant_blocks(tenant: str) -> Response:
        metas = service.tenant_blocks(tenant)
        return Response('{"blocks": [' + ",".join(m.model_dump_json() for m in metas) + "]}",
                        media_type="application/json")

    @app.get("/v1/tenants/{tenant}/generations")
    def generations(tenant: str) -> dict[str, Any]:
        return {"rules": service.generation_rules(tenant)}

    @app.get("/v1/labels")
    def labels(tenant: list[str] = Query(...), start: int = 0, end: int = 2**62,  # noqa: B008
               selector: str = "") -> dict[str, list[str]]:
        return {"names": service.label_names(tenant, start, end, selector)}

    @app.get("/v1/labels/{name}/values")
    def label_values(name: str, tenant: list[str] = Query(...), start: int = 0, end: int = 2**62,  # noqa: B008
                     selector: str = "") -> dict[str, list[str]]:
        return {"values": service.label_values(name, tenant, start, end, selector)}

    @app.get("/v1/offsets")
    def offsets(group: str | None = None, generation: int | None = None, history: bool = False) -> dict[str, Any]:
        body: dict[str, Any] = {"offsets": [o.model_dump() for o in service.offsets(group, generation)]}
        if history:
            incarnations, losses = service.offset_history(group, generation)
            body.update(incarnations=[i.model_dump() for i in incarnations], losses=[x.model_dump() for x in losses])
        return body

    @app.get("/v1/tombstones")
    def tombstones(created_before: int | None = None, limit: int = 1000) -> dict[str, Any]:
        return {"tombstones": [t.model_dump() for t in service.tombstones(created_before, limit)]}

    @app.get("/v1/tenants")
    def tenants() -> dict[str, list[str]]:
        return {"tenants": service.tenants()}

    @app.get("/v1/status")
    def status() -> dict[str, Any]:
        return {**service.status(), "leader_http": leader_http()}

    @app.get("/v1/state-hash")
    def state_hash() -> dict[str, Any]:
        return {"hash": service.state.state_hash(), "applied_index": service.state.applied()[0]}

    @app.get("/v1/snapshot")
    def snapshot() -> FileResponse:
        folder = Path(tempfile.mkdtemp(prefix="shale-snapshot-"))
        target = folder / "metastore.db"
        service.state.backup_to(target)
        return FileResponse(target, filename="metastore.db",
                            background=BackgroundTask(shutil.rmtree, folder, ignore_errors=True))

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

