"""``MetastoreService``: the metastore's logic over a command log and its state, used in-process (embedded
mode) and behind the HTTP API (server mode).

Its reads are ``IndexReads``; those that must be current are linearizable: before reading, the service runs the
log's read barrier (the leader commits a no-op; a follower asks the leader for such an index and waits until it
has applied it, the read-index pattern of seed 004).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import Counter, Histogram

from shale.compaction import PlanLimits, PollRequest, PollResponse
from shale.config import CompactionConfig
from shale.errors import MetastoreUnavailableError
from shale.index import CompactionState
from shale.metastore.api.reads import IndexReads
from shale.metastore.raft import CommandLog
from shale.metastore.rules import Command, Result, StateMachine, plan_command, prepare_plan

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


class MetastoreService(IndexReads):
    def __init__(self, state: StateMachine, log: CommandLog, *, linearize: Callable[[float], None] | None = None,
                 command_format: str = "json", timeout: float = 30.0,
                 compaction: CompactionConfig | None = None, clock: Callable[[], float] = time.time,
                 query_timeout: float | None = None) -> None:
        super().__init__(state.reader, query_timeout, clock, state.path)
        self.state = state
        self.log = log
        self.limits = plan_limits(compaction or CompactionConfig())
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

    def fresh(self, api: str, *, current: bool = True) -> None:
        READS.labels(api).inc()
        if current:
            self.linearize()

    # -- compaction ---------------------------------------------------------------------------------

    def poll_compaction(self, request: PollRequest) -> PollResponse:
        """A worker's poll (seed 003): its reports are applied, new jobs are planned for its free capacity, and
        jobs are assigned to it. Leader only; one poll at a time on the leader."""
        with self._plan_lock:
            term = self.log.status().term
            plan = prepare_plan(CompactionState(self.state.reader.conn), request, int(self.clock() * 1000),
                                self.limits, blocks=self.state.reader.get_block)
            result = self.submit(plan_command(plan, request, term, self.limits))
        if not result.ok:
            raise MetastoreUnavailableError(f"compaction plan not applied ({result.reason}): {result.message}; "
                                            "poll again")
        # A worker marks a refused job's output for deletion unless the index holds it: say which reported outputs
        # it holds, so that a compactor token needs no reader role to ask.
        outputs = [b.id for u in request.updates for b in u.outputs]
        return PollResponse.model_validate({**result.data, "indexed": [
            i for i in outputs if self.state.reader.get_block(i) is not None]})

    def status(self) -> dict[str, Any]:
        s = self.log.status()
        return {"role": s.role, "leader": s.leader, "term": s.term, "applied_index": s.applied_index,
                "commit_index": s.commit_index, "members": s.members, "has_quorum": s.has_quorum,
                "blocks": self.state.reader.count_blocks()}

