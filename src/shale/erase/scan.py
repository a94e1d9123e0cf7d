"""Finding an erasure's records: the backup group's rows whose key is the erased key, below the high watermarks
the request recorded (each bounding its own topic incarnation: ``shale.metastore.Watermarks``), and the blocks of
either group whose Kafka ranges hold one of them.

The backup group stores every record verbatim, so it is where a key is matched; the partition group's rows of
the same records are found by their Kafka position (topic, partition, offset, incarnation), whatever their parser
made of the key. A data object whose key bloom filter rules the key out is not read at all; of the others only the
key column and the position columns are read (a ranged read for a large object).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from shale.block import (
    INCARNATION_COLUMN,
    BlockMeta,
    Dataset,
    decode_column_types,
    may_hold_key,
    read_dataset,
    row_incarnation_names,
)
from shale.erase.column import column_type, column_values, matching
from shale.metastore import Watermarks
from shale.objstore import BucketReader

Position = tuple[str, int, int, str]
"""(topic, partition, offset, incarnation); incarnation '' where the block could not tell."""


@dataclass(frozen=True)
class Match:
    """One record of the key, as a backup block holds it."""

    block: str
    generation: int
    topic: str
    partition: int
    offset: int
    incarnation: str
    timestamp_ms: int

    @property
    def position(self) -> Position:
        return (self.topic, self.partition, self.offset, self.incarnation)


@dataclass
class ScanResult:
    matches: list[Match] = field(default_factory=list)
    blocks_total: int = 0
    """The tenant's live blocks of the erasure's topics, both groups."""
    opened: list[str] = field(default_factory=list)
    """The backup blocks whose data were read (the others' key bloom filters ruled the key out)."""
    affected: list[BlockMeta] = field(default_factory=list)
    """The blocks of either group whose Kafka ranges hold a match: each is rewritten."""
    undecided: list[Match] = field(default_factory=list)
    """Rows of the key at or past a watermark whose incarnation their block cannot tell: not erased (they may be
    records produced after the request, ``Watermarks``), reported."""

    @property
    def positions(self) -> list[Position]:
        return sorted({m.position for m in self.matches})


def _topics_of(block: BlockMeta) -> set[str]:
    return {d.topic for d in block.datasets} | {r.topic for r in block.kafka}


def read_rows(bucket: BucketReader, block: BlockMeta, dataset: Dataset, columns: list[str]) -> pa.Table:
    """``columns`` of ``dataset``'s rows, with the incarnation column a backup dataset merged from two incarnations
    of its topic carries (``shale.block.records``; ``row_incarnation_names`` reads it)."""
    if block.level > 0 and len({r.incarnation for r in block.kafka if r.topic == dataset.topic}) > 1:
        # An older compactor merged two incarnations without naming rows: then the ranges tell (or say '').
        with contextlib.suppress(Exception):
            return read_dataset(bucket, block, dataset, columns=[*columns, INCARNATION_COLUMN], whole_object=None)
    return read_dataset(bucket, block, dataset, columns=columns, whole_object=None)


def _read(bucket: BucketReader, block: BlockMeta, dataset: Dataset, also: str | None = None) -> pa.Table:
    """Position, time and key columns (with ``also``, a column erasure's top-level field instead of the key)."""
    return read_rows(bucket, block, dataset, ["topic", "partition", "offset", "timestamp", also or "key"])


def candidates(bucket: BucketReader, block: BlockMeta, key: bytes, topics: set[str]) -> list[Dataset]:
    """The datasets of ``block`` of ``topics`` (empty: any) that may hold ``key``: their key bloom filters
    (``shale.block.bloom``; objects written before filters were always may) do not rule it out."""
    return [d for d in block.datasets if d.rows and (not topics or d.topic in topics)
            and may_hold_key(bucket, block, d, key)]


def column_types(dataset: Dataset) -> dict[str, pa.DataType]:
    """A dataset's parser columns and their types (a column without a recorded type is a string)."""
    return {c: pa.string() for c in dataset.columns} | decode_column_types(dataset.column_types)


def column_datasets(block: BlockMeta, path: str, topics: set[str]) -> list[tuple[Dataset, pa.DataType]]:
    """The records datasets of ``block`` of ``topics`` (empty: any) that have the column ``path``, with its type."""
    out = []
    for d in block.datasets:
        type_ = column_type(column_types(d), path) if d.kind == "records" and d.rows else None
        if type_ is not None and (not topics or d.topic in topics):
            out.append((d, type_))
    return out


def block_matches(bucket: BucketReader, block: BlockMeta, key: bytes, datasets: list[Dataset],
                  marks: Watermarks, column: tuple[str, str] | None = None,
                  undecided: list[Match] | None = None) -> list[Match]:
    """The rows of ``datasets`` of ``block`` (a backup block) whose key is ``key``, not produced after the request
    (``marks``); with ``column`` (path, SHA-256 of the value's canonical form, ``shale.erase.column``), the rows of
    a partition block whose column holds that value instead. Rows left out only because their incarnation is
    unknown go to ``undecided``."""
    found: list[Match] = []
    for dataset in datasets:
        if column is None:
            table = _read(bucket, block, dataset)
            hit = pc.fill_null(pc.equal(table.column("key"), pa.scalar(key, pa.binary())), False)
        else:
            table = _read(bucket, block, dataset, also=column[0].split(".", 1)[0])
            hit = matching(column_values(table, column[0]), column[1])
        table = table.filter(hit)
        if not table.num_rows:
            continue
        names = row_incarnation_names(block, dataset.topic, table).to_pylist()
        times = pc.cast(table.column("timestamp"), pa.int64()).to_pylist()
        unit = table.schema.field("timestamp").type.unit  # microseconds; older blocks milliseconds
        for topic, partition, offset, when, name in zip(table.column("topic").to_pylist(),
                                                        table.column("partition").to_pylist(),
                                                        table.column("offset").to_pylist(), times, names,
                                                        strict=True):
            match = Match(block.id, block.generation, topic, partition, offset, name or "",
                          when // 1000 if unit == "us" else when)
            if not marks.produced_later(topic, partition, offset, match.incarnation):
                found.append(match)
            elif undecided is not None and marks.undecided(topic, partition, offset, match.incarnation):
                undecided.append(match)
    return found


def holds(block: BlockMeta, positions: Iterable[Position]) -> bool:
    """Whether ``block``'s Kafka ranges hold one of ``positions``."""
    for topic, partition, offset, incarnation in positions:
        for r in block.kafka:
            if (r.topic == topic and r.partition == partition and r.start <= offset < r.end
                    and (not incarnation or not r.incarnation or r.incarnation == incarnation)):
                return True
    return False


def _scan(blocks: list[BlockMeta], topics: Iterable[str], group: str,
          datasets_of: Callable[[BlockMeta, set[str]], list[Dataset]],
          matches_of: Callable[[BlockMeta, list[Dataset], list[Match]], Iterable[Match]]) -> ScanResult:
    """The matches in ``group``'s blocks among ``blocks`` of ``topics`` (all when empty), reading only the datasets
    ``datasets_of`` names, and the blocks of either group that hold a matched position."""
    wanted = set(topics)
    scoped = [b for b in blocks if not wanted or _topics_of(b) & wanted]
    result = ScanResult(blocks_total=len(scoped))
    for block in scoped:
        if block.group != group:
            continue
        datasets = datasets_of(block, wanted)
        if datasets:
            result.opened.append(block.id)
            result.matches.extend(matches_of(block, datasets, result.undecided))
    positions = result.positions
    result.affected = [b for b in scoped if positions and holds(b, positions)]
    return result


def find_matches(bucket: BucketReader, blocks: list[BlockMeta], key: bytes, topics: Iterable[str] = (),
                 marks: Watermarks | None = None) -> ScanResult:
    """The records of ``key`` in the backup blocks among ``blocks`` (a tenant's live blocks), and the blocks of
    either group that hold one. A record the backup group holds in several generations is one match per copy;
    its position is one."""
    return _scan(blocks, topics, "backup", lambda block, wanted: candidates(bucket, block, key, wanted),
                 lambda block, datasets, undecided: block_matches(bucket, block, key, datasets,
                                                                  marks or Watermarks([]), undecided=undecided))


def find_column_matches(bucket: BucketReader, blocks: list[BlockMeta], path: str, sha256: str,
                        topics: Iterable[str] = (), marks: Watermarks | None = None) -> ScanResult:
    """The records whose column ``path`` holds the value of SHA-256 ``sha256`` (canonical form) in the partition
    blocks among ``blocks``, and the blocks of either group that hold one: a record's backup copies are found by
    its position, as a key's partition rows are. Partition blocks have no filter on a column: every records
    dataset of the topics that has the column is read (the position columns and the column's top-level field)."""
    return _scan(blocks, topics, "partition",
                 lambda block, wanted: [d for d, _ in column_datasets(block, path, wanted)],
                 lambda block, datasets, undecided: block_matches(bucket, block, b"", datasets,
                                                                  marks or Watermarks([]), column=(path, sha256),
                                                                  undecided=undecided))
