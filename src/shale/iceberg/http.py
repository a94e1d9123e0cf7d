"""``POST /v1/iceberg/sync``: ``shale iceberg sync`` against a running metastore (the leader publishes)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from shale.iceberg.publisher import IcebergPublisher


def mount_sync(app: FastAPI, publisher: IcebergPublisher, is_leader: Callable[[], bool]) -> None:
    @app.post("/v1/iceberg/sync", response_model=None)
    async def sync(full: bool = False) -> dict[str, Any] | JSONResponse:
        if not is_leader():
            return JSONResponse({"error": "not_leader"}, status_code=503)
        return await run_in_threadpool(publisher.sync, full=full)
