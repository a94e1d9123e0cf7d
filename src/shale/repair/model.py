"""The records of a repair: what the scan found about each block (``BlockFacts``), where damaged blocks' records may
still be (``Sources``), the plan (``Plan`` of ``Step``s), and what crosses to a Spark task to build a new block
(``BuildRequest``, ``BuildResult``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from shale.block import BlockMeta, ParserInfo

REPAIR = "repair: "
"""Every mark and tombstone a repair writes gives its reason after this prefix, so a later run knows its own."""

ABSENT = "absent"
"""The state of a block the index holds but the bucket has no object of."""


@dataclass(frozen=True)
class BlockFacts:
    """One block as the repair sees it: from the bucket (state, marks, damage) and the metastore (indexed,
    tombstoned, claimable). ``meta`` is meta.json's, or the index's when meta.json is missing or unreadable."""

    id: str
    state: str
    """A ``BlockState`` value, or ``ABSENT``."""
    meta: BlockMeta | None = None
    indexed: bool = False
    tombstoned: str | None = None
    """The tombstone's reason, if the index removed the block."""
    unclaimed: str | None = None
    """For a block the index neither holds nor tombstoned: why no commit can claim it (None: one still can)."""
    damage: tuple[str, ...] = ()
    """What is wrong with its objects: missing, size or checksum mismatches, unreadable meta.json."""
    mark: str | None = None
    """The reason of its deletion mark."""
    quarantine: str | None = None
    """What its quarantine mark says."""
    objects: tuple[str, ...] = ()


@dataclass(frozen=True)
class KafkaPartition:
    """A topic-partition as Kafka has it now (read_committed)."""

    incarnation: str
    earliest: int
    end: int


@dataclass(frozen=True)
class Sources:
    """Where the records of damaged blocks may still be, besides the bucket's own blocks."""

    kafka: Mapping[tuple[str, int], KafkaPartition] | None = None
    """Per (topic, partition) of the damaged blocks; None when Kafka was not asked or did not answer."""
    kafka_error: str = ""
    parsers: Mapping[str, ParserInfo | str] = field(default_factory=dict)
    """Per topic of the damaged partition-group blocks: the parser it gets now, or why it has none."""


Action = Literal["mark", "drop", "merge", "rebuild", "quarantine"]


class Step(BaseModel):
    """One thing a repair does, with its reason and its evidence (block ids, Kafka ranges, object keys, what
    covers what)."""

    model_config = ConfigDict(extra="forbid")
    action: Action
    blocks: list[str]
    """The blocks it acts on: marked, dropped, merged, rebuilt or quarantined."""
    reason: str
    evidence: dict[str, Any] = Field(default_factory=dict)
    indexed: list[str] = Field(default_factory=list)
    """Those of ``blocks`` the index holds: the sources of its metastore command."""
    output: str | None = None
    """The block a merge or rebuild writes (a deterministic id: a second run writes the same block)."""
    attempt: int = 0
    """Which attempt ``output`` is: an earlier attempt's output that was marked since is never reused."""
    written: bool = False
    """``output`` is complete in the bucket already (an earlier run wrote it before it stopped)."""
    source: Literal["backup", "kafka", "none"] | None = None
    source_blocks: list[str] = Field(default_factory=list)


class Plan(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tenant: str
    metastore: bool
    """Whether the metastore's view was read (without it, nothing can be applied)."""
    steps: list[Step] = Field(default_factory=list)
    unrecoverable: list[dict[str, Any]] = Field(default_factory=list)
    """Damaged blocks whose records exist nowhere else: kept (quarantined), never deleted."""
    notes: list[str] = Field(default_factory=list)
    in_flight: int = 0
    """Blocks a commit may still claim (fresh, or not yet committed): not judged."""


class BuildRequest(BaseModel):
    """A merge or a rebuild, as a Spark task receives it."""

    model_config = ConfigDict(extra="forbid")
    action: Literal["merge", "rebuild"]
    output: str
    attempt: int
    inputs: list[BlockMeta]
    """Merge: the blocks to merge. Rebuild: the damaged block."""
    source: Literal["backup", "kafka", "none"] | None = None
    source_blocks: list[BlockMeta] = Field(default_factory=list)


class BuildResult(BaseModel):
    model_config = ConfigDict(extra="forbid")
    output: BlockMeta | None = None
    problem: str = ""
    """Why no block was written (a rebuild that would not hold exactly the damaged block's records)."""
