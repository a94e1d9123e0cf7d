"""``MetastoreService``: the metastore's logic over a command log and its state, used in-process (embedded
mode) and behind the HTTP API (server mode).

Reads that must be current are linearizable: before reading, the service runs the log's read barrier (the
leader commits a no-op; a follower asks the leader for such an index and waits until it has applied it, the
read-index pattern of seed 004).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from prometheus_client import Counter, Histogram

from shale.block import BlockMeta
from shale.compaction.messages import PollRequest, PollResponse
from shale.compaction.model import PlanLimits
from shale.compaction.state import CompactionState
from shale.config import CompactionConfig
from shale.errors import MetastoreUnavailableError
from shale.index import IncarnationRow, LossRow, OffsetRow, SchemaVersionRow, TombstoneRow, parse_matchers
from shale.metastore.commands import Command, Result
from shale.metastore.compaction import job_rows, plan_command, prepare_plan, queue_counts
from shale.metastore.fsm import StateMachine
from shale.metastore.leases import lease_rows
from shale.metastore.log import CommandLog
from shale.metastore.restores import restore_rows

COMMANDS = Counter("shale_metastore_commands_total", "Commands proposed, by kind and outcome (ok or the "
                   "rejection reason).", ["kind", "outcome"])
COMMAND_SECONDS = Histogram("shale_metastore_command_seconds", "Time from proposal to applied result.", ["kind"])
READS = Counter("shale_metastore_reads_total", "Index reads, by API.", ["api"])


# The share of a job's memory budget that its uncompressed input may take: the merge holds the input and one
# sorted copy of it, plus Parquet buffers (docs/DESIGN.md, 11.4).
JOB_INPUT_SHARE = 0.4


def plan_limits(config: CompactionConfig) -> PlanLimits:
    return PlanLimits(blocks_per_job=tuple(config.blocks_per_job),
                      job_byte_budget=int(config.job_byte_limit * JOB_INPUT_SHARE),
                      max_age_ms=int(config.max_age * 1000), max_level=config.max_level,
                      lease_ms=int(config.lease_duration * 1000), queue_limit=config.queue_limit)


class MetastoreService:
    def __init__(self, state: StateMachine, log: CommandLog, *, linearize: Callable[[float], None] | None = None,
                 command_format: str = "json", timeout: float = 30.0,
                 compaction: CompactionConfig | None = None, clock: Callable[[], float] = time.time,
                 query_timeout: float | None = None) -> None:
        self.state = state
        self.query_timeout = query_timeout  # block and label queries stop past this many seconds
        self.log = log
        self.limits = plan_limits(compaction or CompactionConfig())
        self.clock = clock
        self._plan_lock = threading.Lock()
        self._linearize = linearize or (lambda t: None)
        self.command_format = command_format
        self.timeout = timeout

    # -- writes ---------------------------------------------------------------------------------

    def submit(self, command: Command) -> Result:
        start = time.perf_counter()
        result = self.log.propose_command(command, self.timeout)
        COMMAND_SECONDS.labels(command.kind).observe(time.perf_counter() - start)
        COMMANDS.labels(command.kind, "ok" if result.ok else result.reason).inc()
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
        return self.state.reader.query_blocks(list(tenants), start, end, matchers, group, self.query_timeout)

    def get_block(self, block_id: str) -> BlockMeta | None:
        self.linearize()
        return self.state.reader.get_block(block_id)

    def label_names(self, tenants: Sequence[str], start: int, end: int, selector: str = "") -> list[str]:
        READS.labels("label_names").inc()
        matchers = parse_matchers(selector)
        self.linearize()
        return self.state.reader.label_names(list(tenants), start, end, matchers, self.query_timeout)

    def label_values(self, name: str, tenants: Sequence[str], start: int, end: int, selector: str = "") -> list[str]:
        READS.labels("label_values").inc()
        matchers = parse_matchers(selector)
        self.linearize()
        return self.state.reader.label_values(name, list(tenants), start, end, matchers, self.query_timeout)

    def offsets(self, group: str | None = None, generation: int | None = None) -> list[OffsetRow]:
        READS.labels("offsets").inc()
        self.linearize()
        return self.state.reader.offsets(group, generation)

    def offset_history(self, group: str | None = None,
                       generation: int | None = None) -> tuple[list[IncarnationRow], list[LossRow]]:
        """Past topic incarnations and acknowledged losses."""
        self.linearize()
        return self.state.reader.incarnations(group, generation), self.state.reader.losses(group, generation)

    def tombstones(self, created_before: int | None = None, limit: int = 1000) -> list[TombstoneRow]:
        return self.state.reader.tombstones(created_before, limit)

    def generation_rules(self, tenant: str) -> list[tuple[str, int, int, int]]:
        self.linearize()
        return self.state.reader.generation_rules(tenant)

    def tenants(self) -> list[str]:
        return self.state.reader.tenants()

    def tenant_blocks(self, tenant: str, *, after: str = "", limit: int | None = None) -> list[BlockMeta]:
        """A tenant's blocks in id order: all of them, or the first ``limit`` with an id after ``after``."""
        self.linearize()
        return self.state.reader.tenant_blocks(tenant, after=after, limit=limit)

    # -- compaction ---------------------------------------------------------------------------------

    def poll_compaction(self, request: PollRequest) -> PollResponse:
        """A worker's poll (seed 003): its reports are applied, new jobs are planned for its free capacity, and
        jobs are assigned to it. Leader only; one poll at a time on the leader."""
        with self._plan_lock:
            term = self.log.status().term
            plan = prepare_plan(CompactionState(self.state.reader.conn), request, int(self.clock() * 1000),
                                self.limits)
            result = self.submit(plan_command(plan, request, term, self.limits))
        if not result.ok:
            raise MetastoreUnavailableError(f"compaction plan not applied ({result.reason}): {result.message}; "
                                            "poll again")
        # A worker marks a refused job's output for deletion unless the index holds it: say which reported outputs
        # it holds, so that a compactor token needs no reader role to ask.
        outputs = [b.id for u in request.updates for b in u.outputs]
        return PollResponse.model_validate({**result.data, "indexed": [
            i for i in outputs if self.state.reader.get_block(i) is not None]})

    def compaction_jobs(self) -> list[dict[str, Any]]:
        return job_rows(CompactionState(self.state.reader.conn), int(self.clock() * 1000))

    def ingest_leases(self, group: str | None = None) -> list[dict[str, Any]]:
        """Every shard's ingest lease as of now (``holder`` empty when nobody holds it, or its lease was granted
        under an older shard map), of one group or all. Not linearized: a standby watches these rows, and a read
        barrier would write a no-op to the log on every look."""
        READS.labels("ingest_leases").inc()
        return lease_rows(self.state.reader.conn, int(self.clock() * 1000), group)

    def schema_versions(self, tenant: str, topic: str | None = None) -> list[SchemaVersionRow]:
        """The writer schemas the tenant's live blocks hold, per topic, group and generation."""
        return self.state.reader.schema_versions(tenant, topic)

    def restores(self, limit: int = 100) -> list[dict[str, Any]]:
        """The newest runs of ``shale restore`` first."""
        return restore_rows(self.state.reader.conn, limit)

    def compaction_queue(self) -> dict[str, int]:
        return queue_counts(CompactionState(self.state.reader.conn))

    def status(self) -> dict[str, Any]:
        s = self.log.status()
        return {"role": s.role, "leader": s.leader, "term": s.term, "applied_index": s.applied_index,
                "commit_index": s.commit_index, "members": s.members, "has_quorum": s.has_quorum,
                "blocks": self.state.reader.count_blocks()}

