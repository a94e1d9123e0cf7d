"""Which files an Iceberg table holds, as a pure function of the index: no I/O, covered by table tests.

A table is one tenant's one topic in the partition group, or one record type of it when the topic's parser stores
each type as its own dataset (``Dataset.record``, subject name strategies). Its files are the ``records`` datasets
of that topic's (and type's) partition-group blocks, each shown exactly where ``shale query`` shows it: where its
generation is the active one (``shale.query.plan.active_intervals``). A dataset whose generation is active over its
whole time range is registered as it is (its own Parquet object, no copy). One whose range a generation switch cuts
is registered as a *copy* of the rows in its active intervals, because pyiceberg cannot write delete files
(docs/DESIGN.md 16.3).

The state at an earlier log entry is reconstructed backwards from the current state and the change feed:
blocks added after the entry are taken out, blocks removed after it are put back, and generation switches
appended after it are dropped (switches are append-only, one per ``generations`` change).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from shale.block import BlockMeta, Dataset
from shale.index import BlockChange
from shale.query import active_intervals

Rule = tuple[str, int, int, int]
"""A generation switch: (topic, start ms, end ms, generation), oldest first."""


@dataclass(frozen=True, order=True)
class TableKey:
    tenant: str
    topic: str
    record: str = ""
    """The record type ('' = none: the topic's one table)."""


@dataclass(frozen=True)
class FileSpec:
    """One data file a table must hold: a block's dataset, whole or (``intervals``) only the rows in those
    inclusive data-time intervals (ms)."""

    block: BlockMeta
    dataset: Dataset
    intervals: tuple[tuple[int, int], ...] | None

    @property
    def block_id(self) -> str:
        return self.block.id

    def copy_name(self) -> str:
        """The name of a copy of this file's rows: the same rows always give the same name, so a retried publish
        rewrites the same object."""
        spans = "all" if self.intervals is None else ",".join(f"{a}-{b}" for a, b in self.intervals)
        digest = hashlib.sha256(f"{self.dataset.file}/{spans}".encode()).hexdigest()[:12]
        return f"{self.block.id}-{self.dataset.file.removesuffix('.parquet')}-{digest}.parquet"


def tables_of(block: BlockMeta) -> list[TableKey]:
    """The tables a block's records belong to (partition group only)."""
    if block.group != "partition":
        return []
    return sorted({TableKey(block.tenant, d.topic, d.record or "") for d in block.datasets
                   if d.kind == "records" and d.rows})


def table_files(block: BlockMeta, topic: str, rules: Sequence[Rule], default_generation: int,
                record: str = "") -> list[FileSpec]:
    """The files ``block`` contributes to its tenant's table of ``topic`` (and record type)."""
    out: list[FileSpec] = []
    if block.group != "partition":
        return out
    for d in block.datasets:
        if d.kind != "records" or d.topic != topic or (d.record or "") != record or not d.rows:
            continue
        spans = active_intervals(list(rules), topic, block.generation, default_generation, d.min_time, d.max_time)
        if not spans:
            continue
        whole = spans == [(d.min_time, d.max_time)]
        out.append(FileSpec(block, d, None if whole else tuple(spans)))
    return out


def rules_at(rules: Sequence[Rule], topic: str, later: Iterable[BlockChange]) -> list[Rule]:
    """``topic``'s switches as they were before the ``later`` changes: one switch fewer per later
    ``generations`` change of the topic."""
    dropped = sum(1 for c in later if c.change == "generations" and c.subject == topic)
    mine = [r for r in rules if r[0] == topic]
    return mine[:len(mine) - dropped] if dropped else mine


def blocks_at(current: Mapping[str, BlockMeta], known: Mapping[str, BlockMeta],
              later: Sequence[BlockChange]) -> dict[str, BlockMeta]:
    """The blocks live before the ``later`` changes (in log order): undo them newest first. ``known`` holds the
    metadata of removed blocks that still have it (their tombstones); a block whose tombstone is gone had its
    objects deleted too, so it cannot be shown again and is left out."""
    live = dict(current)
    for change in reversed(later):
        if change.change == "add":
            live.pop(change.subject, None)
        elif change.change == "remove" and change.subject in known:
            live[change.subject] = known[change.subject]
    return live


def desired(blocks: Iterable[BlockMeta], key: TableKey, rules: Sequence[Rule],
            default_generation: int) -> dict[str, list[FileSpec]]:
    """Per block id, the files the table ``key`` holds given these live blocks and switches."""
    out: dict[str, list[FileSpec]] = {}
    for block in blocks:
        if block.tenant != key.tenant:
            continue
        files = table_files(block, key.topic, rules, default_generation, key.record)
        if files:
            out[block.id] = files
    return out
