"""``shale bucket verify``: everything that can be checked from the bucket alone.

* every meta.json loads and validates (a corrupt or unknown-version meta.json is reported with its block);
* every data object listed in meta.json exists with its size and CRC32 (``check_data``);
* no two live blocks of one group and generation hold the same Kafka record (an overlap that the seed's
  full-overlap rule does not explain would make readers see records twice). Blocks legitimately share Kafka
  ranges (the partition-group blocks of one chunk, one per day; a quarantine block beside a records block;
  compaction outputs of different days), so where ranges overlap the records themselves are compared, read from
  the data objects checked anyway; with ``check_data`` off only blocks of the same partition values and dataset
  kinds count as overlapping;
* partial blocks, blocks marked for deletion and orphan deletion marks are reported with their age;
* quarantined blocks are reported with their damage as notes: ``shale bucket repair`` found their records nowhere
  else, readers skip them and nothing deletes them.
"""

from __future__ import annotations

import io
import json
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import pyarrow.parquet as pq

from shale.block.fetcher import BlockState, BlockView, FetchResult
from shale.block.layout import block_file_key
from shale.block.writer import crc32_hex
from shale.errors import NotFoundError
from shale.objstore import BucketReader

SEVERE = ("corrupt-meta", "missing-object", "checksum-mismatch", "size-mismatch", "kafka-overlap", "partial")


@dataclass(frozen=True)
class Problem:
    kind: str
    tenant: str
    block_id: str
    detail: str

    @property
    def severe(self) -> bool:
        return self.kind in SEVERE


@dataclass
class VerifyReport:
    tenant: str
    blocks: int
    states: dict[str, int]
    problems: list[Problem]

    @property
    def ok(self) -> bool:
        return not any(p.severe for p in self.problems)

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "ok": self.ok})


def _check_files(bucket: BucketReader, view: BlockView,
                 keys: bool) -> tuple[list[Problem], set[tuple[str, int, int]] | None]:
    """Problems of the block's data objects, and (with ``keys``) the (topic, partition, offset) of its records
    (None when an object could not be read whole)."""
    assert view.meta is not None
    problems: list[Problem] = []
    held: set[tuple[str, int, int]] | None = set()
    for info in view.meta.files:
        key = block_file_key(view.meta, info.name)
        try:
            data = bucket.get(key)
        except NotFoundError:
            problems.append(Problem("missing-object", view.tenant, view.id, f"{info.name} is listed but missing"))
            held = None
            continue
        if len(data) != info.size or crc32_hex(data) != info.crc32:
            held = None
        if len(data) != info.size:
            problems.append(Problem("size-mismatch", view.tenant, view.id,
                                    f"{info.name}: {len(data)} bytes, meta.json says {info.size}"))
        elif crc32_hex(data) != info.crc32:
            problems.append(Problem("checksum-mismatch", view.tenant, view.id,
                                    f"{info.name}: CRC32 {crc32_hex(data)}, meta.json says {info.crc32}"))
        elif keys and held is not None:
            table = pq.read_table(io.BytesIO(data), columns=["topic", "partition", "offset"])
            held.update(zip(table.column("topic").to_pylist(), table.column("partition").to_pylist(),
                            table.column("offset").to_pylist(), strict=True))
    return problems, held


def _overlapping(result: FetchResult, same_shape_only: bool) -> list[tuple[str, str, str]]:
    """Pairs of live blocks (earlier, later, what) of one group and generation whose Kafka ranges intersect on a
    topic-partition. With ``same_shape_only``, only blocks of the same partition values and dataset kinds."""
    live = [v for v in result.in_state(BlockState.HEALTHY, BlockState.FRESH) if v.meta is not None]
    ranges: dict[tuple[object, ...], list[tuple[int, int, str]]] = defaultdict(list)
    for view in live:
        assert view.meta is not None
        shape = (json.dumps(view.meta.partition_values, sort_keys=True),
                 tuple(sorted({d.kind for d in view.meta.datasets}))) if same_shape_only else ()
        for r in view.meta.kafka:
            if r.end > r.start and view.meta.datasets:
                ranges[(view.meta.group, view.meta.generation, r.topic, r.partition, shape)].append(
                    (r.start, r.end, view.id))
    pairs = []
    for (group, generation, topic, partition, _), spans in ranges.items():
        spans.sort()
        for i, (_, end, block_id) in enumerate(spans):
            for other_start, _, other in spans[i + 1:]:
                if other_start >= end:
                    break
                pairs.append((block_id, other, f"{group} generation {generation} {topic}[{partition}]"))
    return pairs


def _same_shape(result: FetchResult, first: str, second: str) -> bool:
    a, b = result.blocks[first].meta, result.blocks[second].meta
    assert a is not None
    assert b is not None
    return a.partition_values == b.partition_values and {d.kind for d in a.datasets} == {d.kind for d in b.datasets}


def _overlap_problems(result: FetchResult,
                      held: dict[str, set[tuple[str, int, int]] | None] | None) -> list[Problem]:
    """Overlaps: compared record by record where both blocks' records were read, by ranges elsewhere."""
    problems = []
    for first, second, where in _overlapping(result, same_shape_only=held is None):
        ours, theirs = (held.get(first), held.get(second)) if held is not None else (None, None)
        if ours is not None and theirs is not None:
            shared = ours & theirs
            if not shared:
                continue
            detail = f"{len(shared)} records of {where} are in both {first} and {second}"
        elif held is not None and not _same_shape(result, first, second):
            continue  # a block that could not be read (reported above) and one of another shape
        else:
            detail = f"{where}: the Kafka ranges of {first} and {second} overlap (records not compared)"
        problems.append(Problem("kafka-overlap", result.tenant, second, detail + "; if one is an uncommitted "
                                "orphan, `shale bucket cleanup` with the metastore removes it"))
    return problems


def verify_tenant(bucket: BucketReader, result: FetchResult, *, check_data: bool = True,
                  concurrency: int = 16) -> VerifyReport:
    problems: list[Problem] = []
    states: dict[str, int] = defaultdict(int)
    for view in result.blocks.values():
        states[view.state.value] += 1
        if view.error and view.quarantine is None:
            problems.append(Problem("corrupt-meta", view.tenant, view.id, view.error))
        elif view.state is BlockState.PARTIAL:
            problems.append(Problem("partial", view.tenant, view.id,
                                    f"no meta.json {view.age:.0f}s after its last upload; the cleaner marks it"))
        if view.state is BlockState.MARKED_FOR_DELETION and view.mark is not None:
            problems.append(Problem("marked", view.tenant, view.id,
                                    f"marked for deletion at {view.mark.deletion_time:.0f} ({view.mark.reason})"))
        if view.quarantine is not None:
            damage = "; ".join(view.quarantine.damage) or "damage not recorded"
            problems.append(Problem("quarantined", view.tenant, view.id, f"{damage} ({view.quarantine.reason})"))
    for block_id in result.orphan_marks:
        problems.append(Problem("orphan-mark", result.tenant, block_id, "deletion mark without block objects"))
    held: dict[str, set[tuple[str, int, int]] | None] | None = None
    if check_data:
        involved = {block_id for pair in _overlapping(result, same_shape_only=False) for block_id in pair[:2]}
        checkable = [v for v in result.blocks.values() if v.meta is not None and v.mark is None
                     and v.quarantine is None]
        held = {}
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            for view, (found, keys) in zip(checkable, pool.map(
                    lambda v: _check_files(bucket, v, v.id in involved), checkable), strict=True):
                problems.extend(found)
                held[view.id] = keys
    problems.extend(_overlap_problems(result, held))
    return VerifyReport(result.tenant, len(result.blocks), dict(states), problems)
