"""What a consumer may need from the metastore, each capability declared once as a protocol (as obspec declares an
object store's): a consumer names the ones it uses, combined (``class StoredBlocks(Tenants, BlockQueries,
OffsetReads, Protocol)``), and every metastore fits them all: the embedded service, the HTTP client and the
read-only view of a state file (``IndexReads``, where each read is implemented and served), and whatever else
answers the same question (a bucket index answers ``BlockQueries`` and ``GenerationRules``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from shale.block import BlockMeta
from shale.index import OffsetRow
from shale.metastore.rules import Command, Result


class BlockQueries(Protocol):
    def query_blocks(self, tenants: Sequence[str], start: int, end: int, selector: str = "",
                     group: str | None = None) -> list[BlockMeta]:
        """The live blocks of ``tenants`` with a dataset overlapping ``[start, end]`` ms that matches the label
        selector (and of ``group`` only, if named), each with only its matching datasets."""
        ...


class GenerationRules(Protocol):
    def generation_rules(self, tenant: str) -> list[tuple[str, int, int, int]]:
        """The tenant's generation switches, oldest first: (topic, start ms, end ms, generation)."""
        ...


class Tenants(Protocol):
    def tenants(self) -> list[str]:
        """Every tenant with a live block."""
        ...


class TenantBlocks(Protocol):
    def tenant_blocks(self, tenant: str) -> list[BlockMeta]:
        """Every live block of ``tenant``, in id order."""
        ...


class OffsetReads(Protocol):
    def offsets(self, group: str | None = None, generation: int | None = None) -> list[OffsetRow]:
        """The committed offset ranges' ends, per group, generation and partition incarnation."""
        ...


class ErasureReads(Protocol):
    def erasures(self, erasure: str | None = None, limit: int = 100,
                 before: int | None = None) -> list[dict[str, Any]]:
        """Erasures newest first, or the one named, with the blocks rewritten for each; ``before``: the next page
        (``every_erasure``)."""
        ...


class RestoreReads(Protocol):
    def restores(self, limit: int = 100) -> list[dict[str, Any]]:
        """The newest runs of ``shale restore`` first."""
        ...


class Commands(Protocol):
    def submit(self, command: Command) -> Result:
        """The command, applied through the replicated log once it commits; its result."""
        ...
