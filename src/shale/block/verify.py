"""``shale bucket verify``: everything that can be checked from the bucket alone.

* every meta.json loads and validates (a corrupt or unknown-version meta.json is reported with its block);
* every data object listed in meta.json exists with its size and CRC32 (``check_data``);
* no two live blocks of one group and generation hold the same Kafka offsets (an overlap that the seed's
  full-overlap rule does not explain would make readers see records twice);
* partial blocks, blocks marked for deletion and orphan deletion marks are reported with their age;
* quarantined blocks are reported with their damage as notes: ``shale bucket repair`` found their records nowhere
  else, readers skip them and nothing deletes them.
"""

from __future__ import annotations

import json
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

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


def _check_files(bucket: BucketReader, view: BlockView) -> list[Problem]:
    assert view.meta is not None
    problems = []
    for info in view.meta.files:
        key = block_file_key(view.tenant, view.id, info.name)
        try:
            data = bucket.get(key)
        except NotFoundError:
            problems.append(Problem("missing-object", view.tenant, view.id, f"{info.name} is listed but missing"))
            continue
        if len(data) != info.size:
            problems.append(Problem("size-mismatch", view.tenant, view.id,
                                    f"{info.name}: {len(data)} bytes, meta.json says {info.size}"))
        elif crc32_hex(data) != info.crc32:
            problems.append(Problem("checksum-mismatch", view.tenant, view.id,
                                    f"{info.name}: CRC32 {crc32_hex(data)}, meta.json says {info.crc32}"))
    return problems


def _kafka_overlaps(result: FetchResult) -> list[Problem]:
    """Live blocks holding the same offsets. Partition-group blocks of one batch share a Kafka range (each
    holds the records of one partition value), so they are compared only with blocks of the same values."""
    live = [v for v in result.in_state(BlockState.HEALTHY, BlockState.FRESH) if v.meta is not None]
    ranges: dict[tuple[object, ...], list[tuple[int, int, str]]] = defaultdict(list)
    for view in live:
        assert view.meta is not None
        if view.meta.group == "partition" and not view.meta.partition_values:
            continue
        pv = json.dumps(view.meta.partition_values, sort_keys=True)
        for r in view.meta.kafka:
            if r.end > r.start:
                ranges[(view.meta.group, view.meta.generation, r.topic, r.partition, pv)].append(
                    (r.start, r.end, view.id))
    problems = []
    for (group, generation, topic, partition, _), spans in ranges.items():
        spans.sort()
        reach, holder = spans[0][1], spans[0][2]  # the furthest end so far, and the block that reaches it
        for start, end, block_id in spans[1:]:
            if start < reach:
                problems.append(Problem(
                    "kafka-overlap", result.tenant, block_id,
                    f"{group} generation {generation} {topic}[{partition}] offsets [{start},{min(reach, end)}) are in "
                    f"both {holder} and {block_id}; if one is an uncommitted orphan, `shale bucket cleanup` with the "
                    "metastore removes it"))
            if end > reach:
                reach, holder = end, block_id
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
    if check_data:
        checkable = [v for v in result.blocks.values() if v.meta is not None and v.mark is None
                     and v.quarantine is None]
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            for found in pool.map(lambda v: _check_files(bucket, v), checkable):
                problems.extend(found)
    problems.extend(_kafka_overlaps(result))
    return VerifyReport(result.tenant, len(result.blocks), dict(states), problems)
