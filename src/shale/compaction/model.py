"""Records of the compaction service (seed 003): queued blocks, jobs, and the limits that shape them."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum


class JobStatus(IntEnum):
    """Seed 003's statuses. A successful job is removed from the schedule at once, so it is never stored."""

    UNASSIGNED = 0
    IN_PROGRESS = 1


@dataclass(frozen=True)
class QueueKey:
    """Compaction never crosses these boundaries (seed 003: tenant, shard, level; Shale adds the group and
    generation, because one block holds one of each)."""

    tenant: str
    shard: int
    level: int
    group: str
    generation: int


DAY_MS = 86_400_000


@dataclass(frozen=True)
class QueuedBlock:
    id: str
    key: QueueKey
    raw_bytes: int
    added_at: int  # ms, log time
    day: int = 0
    """A partition-group block's day (UTC days since the epoch of its smallest event time; 0 in the backup group):
    a job holds blocks of one day, so a compaction output keeps its day and its key's ``dt=`` (DESIGN 7.1)."""

    @property
    def queue(self) -> tuple[QueueKey, int]:
        return self.key, self.day


@dataclass
class Job:
    name: str
    key: QueueKey
    sources: list[str]
    raw_bytes: int
    created_at: int
    status: JobStatus = JobStatus.UNASSIGNED
    token: int = 0
    lease_expires_at: int = 0
    failures: int = 0
    worker: str = ""


@dataclass(frozen=True)
class PlanLimits:
    """How jobs close (per level: block count; any level: uncompressed bytes; age) and what a poll may assign."""

    blocks_per_job: tuple[int, ...] = (20, 10, 10)
    job_byte_budget: int = 100 * 2**20
    max_age_ms: int = 3_600_000
    max_level: int = 3
    lease_ms: int = 15_000
    queue_limit: int = 10_000

    def blocks_for(self, level: int) -> int:
        return self.blocks_per_job[min(level, len(self.blocks_per_job) - 1)]


@dataclass
class Assignment:
    job: str
    expect_token: int
    reassign: bool


@dataclass
class PlanUpdate:
    """The read-only half of a poll (seed 003's two-step update): what the leader proposes. Every change
    carries the state it was prepared against, and applies only if that still holds."""

    new_jobs: list[Job] = field(default_factory=list)
    assign: list[Assignment] = field(default_factory=list)
    evict: list[str] = field(default_factory=list)
