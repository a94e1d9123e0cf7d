"""Which topic incarnation a backup row belongs to, for a restore.

A record is (incarnation, topic, partition, offset) (``shale.block.records``): a topic deleted and recreated
starts again at offset 0, and compaction may merge blocks of both incarnations into one. A row's incarnation is
the one its block names for it (``row_incarnation_names``: the merged dataset's ``incarnation`` column, else the
one incarnation whose ranges cover its offset). A restore of incarnation ``X`` reads the rows named ``X`` only,
whatever their offsets. A row its block cannot name (written before compaction kept the column, under ranges of
two incarnations) that ``X``'s ranges cover is *ambiguous*: a restore never sends it as either, it stops before
it, naming the block.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from shale.block import BlockMeta, row_incarnation_names


@dataclass(frozen=True)
class Attributed:
    """A table's rows of one incarnation (in the table's order), and the offsets of rows its block cannot name
    that may be that incarnation's."""

    rows: pa.Table
    ambiguous: list[int]
    others: list[str]
    """The other incarnations whose ranges cover an ambiguous row."""


def attribute(meta: BlockMeta, table: pa.Table, topic: str, partition: int, incarnation: str) -> Attributed:
    """The rows of ``table`` (rows of ``meta`` of ``topic`` and ``partition``) that are ``incarnation``'s."""
    names = row_incarnation_names(meta, topic, table)
    mine = pc.fill_null(pc.equal(names, incarnation), False)
    offsets = table.column("offset")
    unknown = pc.is_null(names)
    covered = pa.array([False] * table.num_rows, pa.bool_())
    others: set[str] = set()
    for r in meta.kafka:
        if r.topic == topic and r.partition == partition and r.end > r.start:
            inside = pc.and_(pc.greater_equal(offsets, r.start), pc.less(offsets, r.end))
            if r.incarnation == incarnation:
                covered = pc.or_(covered, inside)
            elif pc.any(pc.and_(inside, unknown)).as_py():
                others.add(r.incarnation)
    ambiguous = table.filter(pc.and_(unknown, covered)).column("offset").to_pylist()
    return Attributed(table.filter(mine), sorted(ambiguous), sorted(others))
