"""The messages of the compaction service (seed 003): what workers and the service say to each other, and the
entries of the plan update the leader replicates.

A worker polls with its free capacity and its reports (lease refreshes, successes with outputs); the service
answers with new assignments (each with its fencing token and lease) and an outcome per report.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from shale.block import BlockMeta


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class JobUpdate(_Model):
    """A worker's report on one job: a lease refresh, or success with the output blocks."""

    job: str
    token: int
    status: Literal["in_progress", "success"]
    outputs: list[BlockMeta] = Field(default_factory=list)


# The most jobs one poll may ask for: a worker cannot hoard the whole queue, however many slots it claims.
MAX_POLL_CAPACITY = 256


class PollRequest(_Model):
    """``request`` names this poll: a worker sends an unanswered poll again unchanged, with the same id, and the
    service answers a poll it already applied with the answer it gave then (the same assignments, no new work)."""

    worker: str = Field(min_length=1, max_length=200)
    request: str = Field(default="", max_length=200)
    capacity: int = Field(ge=0, le=MAX_POLL_CAPACITY)
    updates: list[JobUpdate] = Field(default_factory=list)


class ErasePlan(_Model):
    """An erase job's work (``shale erase``): its source rewritten without the records at these positions,
    (topic, partition, offset, incarnation); incarnation '' matches any."""

    erasure: str
    positions: list[tuple[str, int, int, str]]


class Assigned(_Model):
    job: str
    token: int
    lease_expires_at: int
    tenant: str
    shard: int
    level: int
    group: str
    generation: int
    sources: list[BlockMeta]
    erase: ErasePlan | None = Field(default=None, description="set for an erase job: rewrite the one source "
                                    "without these records, instead of merging")
    erased: list[str] | None = Field(default=None, description="a merge job: the erasures whose records none of "
                                     "its sources holds (the output's ``erased``)")


class PollResponse(_Model):
    assigned: list[Assigned] = Field(default_factory=list)
    updates: dict[str, str] = Field(default_factory=dict, description="per reported job: refreshed, completed, "
                                                                        "or why it was refused")
    indexed: list[str] | None = Field(default=None, description="of the outputs of refused reports, those the "
                                      "index holds (never to be marked for deletion); None: not said (an older "
                                      "metastore), so the worker marks none")
    links: dict[str, list[Any]] = Field(default_factory=dict, description="per job completed by this poll, its "
                                        "tenant's [previous version, version, log time ms, state digest, "
                                        "generation switches or null]: the link its bucket index delta carries "
                                        "(``shale.bucketindex.DeltaLink.of``)")


class NewJob(_Model):
    """A job the leader planned (the replicated plan update carries it; every replica applies it)."""

    name: str
    tenant: str
    shard: int
    level: int
    group: str
    generation: int
    sources: list[str]
    raw_bytes: int
    created_at: int


class AssignJob(_Model):
    """An assignment the leader planned, applied only if the job still has the token it was planned against."""

    job: str
    expect_token: int
    reassign: bool
