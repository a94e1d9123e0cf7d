"""``ReadOnlyIndex``: a read-only view of a metastore's state file, for every reader that changes nothing (queries,
``shale offsets show``, ``verify``, ``ledger``, ``trace``, ``locate``, ``metastore status``, ``bucket cleanup``'s
protected set, the status page). It has no log and no write path, never creates a state file, and a read cannot
hold the state's write lock. Reads see what is committed when each statement runs.

``open_index_view`` (in ``shale.metastore.server``) gives this view for an embedded metastore and a
``MetastoreClient`` for a remote one; both fit the readers' small protocols. Only writers open a ``StateMachine``
(``tests/unit/test_state_writers.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from shale.block import BlockMeta
from shale.compaction.state import CompactionState
from shale.errors import ConfigError
from shale.index import (
    IncarnationRow,
    IndexReader,
    LossRow,
    OffsetRow,
    SchemaVersionRow,
    TombstoneRow,
    connect,
    copy_state,
    parse_matchers,
)
from shale.metastore.compaction import job_rows, queue_counts
from shale.metastore.leases import lease_rows
from shale.metastore.restores import restore_rows


class ReadOnlyIndex:
    def __init__(self, path: Path, timeout: float | None = None, clock: Callable[[], float] = time.time) -> None:
        if not path.exists():
            raise ConfigError(f"no metastore state at {path}: nothing was ingested with this configuration yet "
                              "(check metastore.data_dir)")
        self.path = path
        self.reader = IndexReader(lambda: connect(str(path), readonly=True))
        self.timeout = timeout
        """Block and label queries stop past this many seconds (``metastore.query_timeout``)."""
        self.clock = clock

    # -- blocks ---------------------------------------------------------------------------------

    def query_blocks(self, tenants: Sequence[str], start: int, end: int, selector: str = "",
                     group: str | None = None) -> list[BlockMeta]:
        return self.reader.query_blocks(list(tenants), start, end, parse_matchers(selector), group, self.timeout)

    def label_names(self, tenants: Sequence[str], start: int, end: int, selector: str = "") -> list[str]:
        return self.reader.label_names(list(tenants), start, end, parse_matchers(selector), self.timeout)

    def label_values(self, name: str, tenants: Sequence[str], start: int, end: int, selector: str = "") -> list[str]:
        return self.reader.label_values(name, list(tenants), start, end, parse_matchers(selector), self.timeout)

    def get_block(self, block_id: str) -> BlockMeta | None:
        return self.reader.get_block(block_id)

    def tenants(self) -> list[str]:
        return self.reader.tenants()

    def tenant_blocks(self, tenant: str) -> list[BlockMeta]:
        return self.reader.tenant_blocks(tenant)

    def generation_rules(self, tenant: str) -> list[tuple[str, int, int, int]]:
        return self.reader.generation_rules(tenant)

    def tombstones(self, created_before: int | None = None, limit: int = 1000) -> list[TombstoneRow]:
        return self.reader.tombstones(created_before, limit)

    # -- offsets --------------------------------------------------------------------------------

    def offsets(self, group: str | None = None, generation: int | None = None) -> list[OffsetRow]:
        return self.reader.offsets(group, generation)

    def offset_history(self, group: str | None = None,
                       generation: int | None = None) -> tuple[list[IncarnationRow], list[LossRow]]:
        return self.reader.incarnations(group, generation), self.reader.losses(group, generation)

    # -- the status page and `shale metastore status` -------------------------------------------

    def tenant_totals(self) -> list[tuple[str, int, int, int]]:
        return self.reader.tenant_totals()

    def level_histogram(self, bucket_ms: int) -> list[tuple[str, int, int, int]]:
        return self.reader.level_histogram(bucket_ms)

    def compaction_jobs(self) -> list[dict[str, Any]]:
        return job_rows(CompactionState(self.reader.conn), int(self.clock() * 1000))

    def ingest_leases(self, group: str | None = None) -> list[dict[str, Any]]:
        """Every shard's ingest lease as of now (``holder`` empty when nobody holds it), of one group or all."""
        return lease_rows(self.reader.conn, int(self.clock() * 1000), group)

    def schema_versions(self, tenant: str, topic: str | None = None) -> list[SchemaVersionRow]:
        return self.reader.schema_versions(tenant, topic)

    def restores(self, limit: int = 100) -> list[dict[str, Any]]:
        """The newest runs of ``shale restore`` first."""
        return restore_rows(self.reader.conn, limit)

    def compaction_queue(self) -> dict[str, int]:
        return queue_counts(CompactionState(self.reader.conn))

    def status(self) -> dict[str, Any]:
        """An embedded metastore's status, as its single-node log reports it: term 1, every entry committed."""
        index, _ = self.reader.applied()
        return {"role": "single", "leader": None, "term": 1, "applied_index": index, "commit_index": index,
                "members": [], "has_quorum": True, "blocks": self.reader.count_blocks()}

    def snapshot(self, out: Path) -> None:
        """A consistent copy of the whole state (as ``MetastoreClient.snapshot`` gets a node's): SQLite's online
        backup in one step, one read transaction."""
        copy_state(self.path, out)
