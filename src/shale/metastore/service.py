"""``MetastoreService``: the metastore's logic over a command log and its state, used in-process (embedded
mode) and behind the HTTP API (server mode).

Reads that must be current are linearizable: before reading, the service runs the log's read barrier (the
leader commits a no-op; a follower asks the leader for such an index and waits until it has applied it, the
read-index pattern of seed 004).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from prometheus_client import Counter, Histogram

from shale.block import BlockMeta
from shale.index import OffsetRow, TombstoneRow, parse_matchers
from shale.metastore.commands import Result, _Command
from shale.metastore.fsm import StateMachine
from shale.metastore.log import CommandLog

COMMANDS = Counter("shale_metastore_commands_total", "Commands proposed, by kind and outcome (ok or the "
                   "rejection reason).", ["kind", "outcome"])
COMMAND_SECONDS = Histogram("shale_metastore_command_seconds", "Time from proposal to applied result.", ["kind"])
READS = Counter("shale_metastore_reads_total", "Index reads, by API.", ["api"])


class MetastoreService:
    def __init__(self, state: StateMachine, log: CommandLog, *, linearize: Callable[[float], None] | None = None,
                 command_format: str = "json", timeout: float = 30.0) -> None:
        self.state = state
        self.log = log
        self._linearize = linearize or (lambda t: None)
        self.command_format = command_format
        self.timeout = timeout

    # -- writes ---------------------------------------------------------------------------------

    def submit(self, command: _Command) -> Result:
        kind = str(getattr(command, "kind", type(command).__name__))
        start = time.perf_counter()
        result = self.log.propose_command(command, self.timeout)  # type: ignore[arg-type]
        COMMAND_SECONDS.labels(kind).observe(time.perf_counter() - start)
        COMMANDS.labels(kind, "ok" if result.ok else result.reason).inc()
        return result

    def submit_bytes(self, data: bytes) -> Result:
        """Propose already-encoded command bytes (the HTTP API and the DLQ hand these over unchanged)."""
        return self.log.propose(data, self.timeout)

    # -- reads ----------------------------------------------------------------------------------

    def linearize(self) -> None:
        self._linearize(self.timeout)

    def query_blocks(self, tenants: Sequence[str], start: int, end: int, selector: str = "",
                     group: str | None = None) -> list[BlockMeta]:
        READS.labels("query_blocks").inc()
        matchers = parse_matchers(selector)
        self.linearize()
        return self.state.reader.query_blocks(list(tenants), start, end, matchers, group)

    def get_block(self, block_id: str) -> BlockMeta | None:
        self.linearize()
        return self.state.reader.get_block(block_id)

    def label_names(self, tenants: Sequence[str], start: int, end: int, selector: str = "") -> list[str]:
        READS.labels("label_names").inc()
        matchers = parse_matchers(selector)
        self.linearize()
        return self.state.reader.label_names(list(tenants), start, end, matchers)

    def label_values(self, name: str, tenants: Sequence[str], start: int, end: int, selector: str = "") -> list[str]:
        READS.labels("label_values").inc()
        matchers = parse_matchers(selector)
        self.linearize()
        return self.state.reader.label_values(name, list(tenants), start, end, matchers)

    def offsets(self, group: str | None = None, generation: int | None = None) -> list[OffsetRow]:
        READS.labels("offsets").inc()
        self.linearize()
        return self.state.reader.offsets(group, generation)

    def tombstones(self, created_before: int | None = None, limit: int = 1000) -> list[TombstoneRow]:
        return self.state.reader.tombstones(created_before, limit)

    def tenants(self) -> list[str]:
        return self.state.reader.tenants()

    def tenant_blocks(self, tenant: str) -> list[BlockMeta]:
        self.linearize()
        return self.state.reader.tenant_blocks(tenant)

    def status(self) -> dict[str, Any]:
        s = self.log.status()
        return {"role": s.role, "leader": s.leader, "term": s.term, "applied_index": s.applied_index,
                "commit_index": s.commit_index, "members": s.members, "has_quorum": s.has_quorum,
                "blocks": self.state.reader.count_blocks()}
