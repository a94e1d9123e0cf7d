"""The metastore as its users see it: one protocol, served in-process (``MetastoreService``, the embedded
default) or over HTTP (``MetastoreClient``). Ingest, compaction, queries and the bucket-index writer take a
``Metastore`` and never know which one they got."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from shale.block import BlockMeta
from shale.compaction.messages import PollRequest, PollResponse
from shale.index import IncarnationRow, LossRow, OffsetRow, TombstoneRow
from shale.metastore.commands import Command, Result


class Metastore(Protocol):
    def submit(self, command: Command) -> Result:
        """Propose a command and wait until it is applied. Rejections are results (``ok`` false)."""
        ...

    def query_blocks(self, tenants: Sequence[str], start: int, end: int, selector: str = "",
                     group: str | None = None) -> list[BlockMeta]:
        """Blocks overlapping ``[start, end]`` ms whose datasets match ``selector``. Linearizable."""
        ...

    def get_block(self, block_id: str) -> BlockMeta | None: ...

    def label_names(self, tenants: Sequence[str], start: int, end: int, selector: str = "") -> list[str]: ...

    def label_values(self, name: str, tenants: Sequence[str], start: int, end: int,
                     selector: str = "") -> list[str]: ...

    def offsets(self, group: str | None = None, generation: int | None = None) -> list[OffsetRow]:
        """Committed ingest offsets. Linearizable."""
        ...

    def offset_history(self, group: str | None = None,
                       generation: int | None = None) -> tuple[list[IncarnationRow], list[LossRow]]:
        """Past topic incarnations and acknowledged offset losses. Linearizable."""
        ...

    def tombstones(self, created_before: int | None = None, limit: int = 1000) -> list[TombstoneRow]: ...

    def generation_rules(self, tenant: str) -> list[tuple[str, int, int, int]]:
        """Generation switches of a tenant, oldest first: (topic, start ms, end ms, generation)."""
        ...

    def tenants(self) -> list[str]: ...

    def tenant_blocks(self, tenant: str) -> list[BlockMeta]:
        """Every block of a tenant (for the bucket-index writer and the status page)."""
        ...

    def poll_compaction(self, request: PollRequest) -> PollResponse:
        """A compaction worker's poll: report on its jobs, get new ones (seed 003)."""
        ...

    def compaction_jobs(self) -> list[dict[str, Any]]: ...

    def compaction_queue(self) -> dict[str, int]: ...

    def status(self) -> dict[str, Any]: ...
