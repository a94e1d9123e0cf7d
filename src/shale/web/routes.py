"""The status page's routes, added to the metastore's FastAPI app by ``shale metastore serve``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, RedirectResponse
from starlette.concurrency import run_in_threadpool

from shale.config import ShaleConfig
from shale.objstore import BucketReader
from shale.web.page import render
from shale.web.status import PageIndex, collect


def mount(app: FastAPI, index: PageIndex, node_status: Callable[[], dict[str, Any]], bucket: BucketReader,
          config: ShaleConfig,
          partial_blocks: Callable[[], dict[str, int]] = dict,
          iceberg: Callable[[], dict[str, Any]] = dict,
          overlaps: Callable[[], dict[str, list[dict[str, Any]]]] = dict) -> None:
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
