"""``IndexReads``: every read of the metastore's state, written once. The service (``MetastoreService``, behind the
HTTP API and embedded) and the read-only view of a state file (``ReadOnlyIndex``) are both ``IndexReads``; they
differ only in what happens before a read (``fresh``: the service counts the read and, where a read must be
current, runs the log's read barrier; the view reads what is committed when each statement runs) and in their
status. The HTTP routes and ``MetastoreClient`` serve and call these methods by the same names.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from shale.block import BlockMeta
from shale.compaction.state import CompactionState
from shale.index import (
    IncarnationRow,
    IndexReader,
    LossRow,
    OffsetRow,
    SchemaVersionRow,
    TombstoneRow,
    parse_matchers,
)
from shale.metastore.compaction import job_rows, queue_counts
from shale.metastore.erasures import erasure_rows
from shale.metastore.leases import lease_rows
from shale.metastore.restores import restore_rows


class IndexReads:
    """Reads over ``reader``; block and label queries stop past ``query_timeout`` seconds."""

    def __init__(self, reader: IndexReader, query_timeout: float | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.reader = reader
        self.query_timeout = query_timeout
        self.clock = clock

    def fresh(self, api: str, *, current: bool = True) -> None:
        """Before the read ``api``; ``current``: it must see every write acknowledged before it started."""

    # -- blocks ---------------------------------------------------------------------------------

    def query_blocks(self, tenants: Sequence[str], start: int, end: int, selector: str = "",
                     group: str | None = None) -> list[BlockMeta]:
        matchers = parse_matchers(selector)
        self.fresh("query_blocks")
        return self.reader.query_blocks(list(tenants), start, end, matchers, group, self.query_timeout)

    def label_names(self, tenants: Sequence[str], start: int, end: int, selector: str = "") -> list[str]:
        matchers = parse_matchers(selector)
        self.fresh("label_names")
        return self.reader.label_names(list(tenants), start, end, matchers, self.query_timeout)

    def label_values(self, name: str, tenants: Sequence[str], start: int, end: int, selector: str = "") -> list[str]:
        matchers = parse_matchers(selector)
        self.fresh("label_values")
        return self.reader.label_values(name, list(tenants), start, end, matchers, self.query_timeout)

    def get_block(self, block_id: str) -> BlockMeta | None:
        self.fresh("get_block")
        return self.reader.get_block(block_id)

    def tenants(self) -> list[str]:
        self.fresh("tenants", current=False)
        return self.reader.tenants()

    def tenant_blocks(self, tenant: str, *, after: str = "", limit: int | None = None) -> list[BlockMeta]:
        """A tenant's blocks in id order: all of them, or the first ``limit`` with an id after ``after``."""
        self.fresh("tenant_blocks")
        return self.reader.tenant_blocks(tenant, after=after, limit=limit)

    def generation_rules(self, tenant: str) -> list[tuple[str, int, int, int]]:
        self.fresh("generation_rules")
        return self.reader.generation_rules(tenant)

    def tombstones(self, created_before: int | None = None, limit: int = 1000) -> list[TombstoneRow]:
        self.fresh("tombstones", current=False)
        return self.reader.tombstones(created_before, limit)

    def schema_versions(self, tenant: str, topic: str | None = None) -> list[SchemaVersionRow]:
        """The writer schemas the tenant's live blocks hold, per topic, group and generation."""
        self.fresh("schema_versions", current=False)
        return self.reader.schema_versions(tenant, topic)

    # -- offsets --------------------------------------------------------------------------------

    def offsets(self, group: str | None = None, generation: int | None = None) -> list[OffsetRow]:
        self.fresh("offsets")
        return self.reader.offsets(group, generation)

    def offset_history(self, group: str | None = None,
                       generation: int | None = None) -> tuple[list[IncarnationRow], list[LossRow]]:
        """Past topic incarnations and acknowledged losses."""
        self.fresh("offset_history")
        return self.reader.incarnations(group, generation), self.reader.losses(group, generation)

    # -- the status page, `shale metastore status` and the operators' lists -----------------------

    def tenant_totals(self) -> list[tuple[str, int, int, int]]:
        self.fresh("tenant_totals", current=False)
        return self.reader.tenant_totals()

    def level_histogram(self, bucket_ms: int) -> list[tuple[str, int, int, int]]:
        self.fresh("level_histogram", current=False)
        return self.reader.level_histogram(bucket_ms)

    def compaction_jobs(self) -> list[dict[str, Any]]:
        self.fresh("compaction_jobs", current=False)
        return job_rows(CompactionState(self.reader.conn), int(self.clock() * 1000))

    def compaction_queue(self) -> dict[str, int]:
        self.fresh("compaction_queue", current=False)
        return queue_counts(CompactionState(self.reader.conn))

    def ingest_leases(self, group: str | None = None) -> list[dict[str, Any]]:
        """Every shard's ingest lease as of now (``holder`` empty when nobody holds it, or its lease was granted
        under an older shard map), of one group or all. Not linearized: a standby watches these rows, and a read
        barrier would write a no-op to the log on every look."""
        self.fresh("ingest_leases", current=False)
        return lease_rows(self.reader.conn, int(self.clock() * 1000), group)

    def erasures(self, erasure: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """Erasures newest first, or the one named, with the blocks rewritten for each (``shale erase status``)."""
        self.fresh("erasures", current=False)
        return erasure_rows(self.reader.conn, erasure, limit)

    def restores(self, limit: int = 100) -> list[dict[str, Any]]:
        """The newest runs of ``shale restore`` first."""
        self.fresh("restores", current=False)
        return restore_rows(self.reader.conn, limit)
