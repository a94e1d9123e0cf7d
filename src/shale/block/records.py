"""Which Kafka record a row is, and which blocks may hold the same record.

A record is (topic incarnation, topic, partition, offset): after a topic is deleted and recreated, offset 0 of
the new topic is another record than offset 0 of the old one. Rows carry topic, partition and offset; the
incarnation is their block's, read from its Kafka ranges. Deduplication (queries, compaction) keys rows by all
four, so records of two incarnations are never taken for copies of each other.

A row whose incarnation its block cannot tell (two ranges of different incarnations cover its offset, which a
block merged from both incarnations may have, or no range covers it) gets a key of its own: it is never
dropped as a copy. Dropping a row needs proof; keeping a copy does not lose data.

A backup dataset that compaction merges from blocks of two incarnations of its topic keeps each row's
incarnation in the column ``incarnation`` (``INCARNATION_COLUMN``; null where its source could not tell): the
merged ranges alone cannot say whose a row is once they intersect, and a restore must send one incarnation's
records only (``row_incarnation_names``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shale.block.meta import BlockMeta

RecordScope = tuple[str, int, str]
"""(topic, partition, incarnation)"""


def may_share_records(a: BlockMeta, b: BlockMeta) -> set[RecordScope]:
    """The (topic, partition, incarnation) on which two blocks' offset ranges intersect so that one record could
    be in both (``_may_share``: never between some kinds of blocks, whatever their ranges)."""
    if not _may_share(a, b):
        return set()
    shared = set()
    for ra in a.kafka:
        for rb in b.kafka:
            if ((ra.topic, ra.partition, ra.incarnation) == (rb.topic, rb.partition, rb.incarnation)
                    and ra.start < rb.end and rb.start < ra.end):
                shared.add((ra.topic, ra.partition, ra.incarnation))
    return shared


def incarnations_overlap(a: BlockMeta, b: BlockMeta) -> bool:
    """Whether ``a`` and ``b`` hold ranges of two incarnations of a topic whose offsets intersect on a partition:
    a block merged from both could not tell such rows apart without naming each row's incarnation, which only a
    backup dataset does (``INCARNATION_COLUMN``), so compaction does not merge such partition blocks. One sweep
    per partition holding two incarnations, not every pair of ranges (a compacted block holds thousands)."""
    spans: dict[tuple[str, int], list[tuple[int, int, str, int]]] = defaultdict(list)
    for side, block in enumerate((a, b)):
        for r in block.kafka:
            if r.end > r.start:
                spans[(r.topic, r.partition)].append((r.start, r.end, r.incarnation, side))
    for ranges in spans.values():
        if len({(incarnation, side) for _, _, incarnation, side in ranges}) < 2 or len(
                {incarnation for _, _, incarnation, _ in ranges}) < 2:
            continue
        ranges.sort()
        open_: list[tuple[int, str, int]] = []  # (end, incarnation, side) of the ranges that may still intersect
        for start, end, incarnation, side in ranges:
            open_ = [o for o in open_ if o[0] > start]
            if any(i != incarnation and s != side for _, i, s in open_):
                return True
            open_.append((end, incarnation, side))
    return False


def _may_share(a: BlockMeta, b: BlockMeta) -> bool:
    """Whether two blocks could hold one row at all. Blocks of different groups never share a row (a backup row
    and a parsed row differ); the backup group stores the same verbatim record in every generation, so its
    generations share. Partition-group blocks of different generations are never read for the same data time (a
    generation is active or not there), and level-0 ones of one generation and different partition values share
    ranges but never records."""
    if a.group != b.group or (a.group == "partition" and a.generation != b.generation):
        return False
    return not (a.group == "partition" and a.level == 0 and b.level == 0
                and a.partition_values and b.partition_values and a.partition_values != b.partition_values)


def shared_scopes(blocks: Sequence[BlockMeta]) -> set[RecordScope]:
    """Every scope on which two of ``blocks`` may hold one record (the union of ``may_share_records`` over every
    pair): only there are rows deduplicated. One sweep per scope over its ranges in start order, not every pair
    of ranges of every pair of blocks (two compacted blocks of 5,000 ranges each cost 17 ms per query that way)."""
    spans: dict[RecordScope, list[tuple[int, int, int]]] = defaultdict(list)
    for i, block in enumerate(blocks):
        for r in block.kafka:
            spans[(r.topic, r.partition, r.incarnation)].append((r.start, r.end, i))
    out: set[RecordScope] = set()
    for scope, ranges in spans.items():
        ranges.sort()
        open_: list[tuple[int, int]] = []  # (end, block) of the ranges begun so far that may still intersect
        for start, end, i in ranges:
            open_ = [(e, j) for e, j in open_ if e > start]  # each intersects this range (it began no later)
            if any(j != i and _may_share(blocks[i], blocks[j]) for _, j in open_):
                out.add(scope)
                break
            open_.append((end, i))
    return out


INCARNATION_COLUMN = "incarnation"
"""The column of a merged backup dataset naming each row's topic incarnation."""


def row_incarnation_names(meta: BlockMeta, topic: str, table: pa.Table) -> pa.Array:
    """Per row of ``table`` (rows of ``meta``'s dataset of ``topic``), its incarnation: the row's own
    ``INCARNATION_COLUMN`` where the block has one, else the one incarnation whose ranges cover its (partition,
    offset); null where neither tells (ranges of two incarnations cover it, or none does)."""
    part = np.asarray(table.column("partition").to_numpy(zero_copy_only=False), dtype=np.int64)
    off = np.asarray(table.column("offset").to_numpy(zero_copy_only=False), dtype=np.int64)
    names = np.full(len(part), None, dtype=object)
    ambiguous = np.zeros(len(part), dtype=bool)
    for r in meta.kafka:
        if r.topic != topic or r.end <= r.start:
            continue
        mask = (part == r.partition) & (off >= r.start) & (off < r.end)
        ambiguous |= mask & (names != None) & (names != r.incarnation)  # noqa: E711 (numpy element-wise)
        names[mask] = r.incarnation
    names[ambiguous] = None
    found = pa.array(names, pa.string())
    if INCARNATION_COLUMN in table.column_names:
        own = table.column(INCARNATION_COLUMN).combine_chunks().cast(pa.string())
        found = pc.if_else(pc.is_null(own), found, own)
    return found


class IncarnationCodes:
    """Incarnations as small integers, one numbering for every table compared (a sort key cheaper than strings),
    and negative codes, each used once, for rows whose incarnation is unknown."""

    def __init__(self) -> None:
        self._codes: dict[str, int] = {}
        self._unknown = 0

    def code(self, incarnation: str) -> int:
        return self._codes.setdefault(incarnation, len(self._codes))

    def unknown(self, n: int) -> np.ndarray:
        first = self._unknown
        self._unknown += n
        return -1 - first - np.arange(n, dtype=np.int64)


def row_incarnations(meta: BlockMeta, topic: str, partitions: pa.Array | pa.ChunkedArray,
                     offsets: pa.Array | pa.ChunkedArray, codes: IncarnationCodes) -> np.ndarray:
    """Per row of ``meta``'s dataset of ``topic``, its incarnation's code. A row whose incarnation the block
    cannot tell gets a negative code of its own, so it is never taken for a copy of another row."""
    part = np.asarray(partitions.to_numpy(zero_copy_only=False), dtype=np.int64)
    off = np.asarray(offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
    out = np.full(len(part), -1, dtype=np.int64)
    ambiguous = np.zeros(len(part), dtype=bool)
    for r in meta.kafka:
        if r.topic != topic:
            continue
        code = codes.code(r.incarnation)
        mask = (part == r.partition) & (off >= r.start) & (off < r.end)
        ambiguous |= mask & (out >= 0) & (out != code)
        out[mask] = code
    unknown = np.flatnonzero((out < 0) | ambiguous)
    if len(unknown):
        out[unknown] = codes.unknown(len(unknown))
    return out
