"""Builders of block metadata and facts for the repair planner's tests (no bucket: the planner is pure)."""

from __future__ import annotations

from tests.factories import BASE_MS

from shale.block import (
    BlockMeta,
    Compaction,
    Dataset,
    FileInfo,
    KafkaRange,
    ParserInfo,
    deterministic_block_id,
    meta_key,
)
from shale.repair.model import BlockFacts

JSON = ParserInfo(name="json", version="1", options_digest="d1")
NAMES = "abcdefghijklmnopqrstuvwxyz"


def block_id(name: str) -> str:
    """Ids sort like the names (their ULID times do): ``a`` < ``b`` < ..."""
    return deterministic_block_id(BASE_MS + NAMES.index(name[0]) * 1000 + len(name), f"test/{name}")


def blk(name: str, start: int, end: int, *, group: str = "backup", generation: int = 1, topic: str = "app",
        partition: int = 0, incarnation: str = "inc1", kind: str | None = "records", pv: dict[str, str] | None = None,
        level: int = 0, sources: list[str] | None = None, parents: list[str] | None = None, rows: int | None = None,
        parser: ParserInfo | None = None, kinds: tuple[str, ...] = ()) -> BlockMeta:
    """A block of offsets ``[start, end)`` of one partition. ``kind=None`` makes a block with no records;
    ``kinds`` several datasets of different kinds. ``sources`` and ``parents`` are names."""
    own = block_id(name)
    n = end - start if rows is None else rows
    datasets = [Dataset(name=f"{k}/{topic}", kind=k, topic=topic, file=f"{k}-{i}.parquet",  # type: ignore[arg-type]
                        rows=n, bytes=n * 100, min_time=BASE_MS, max_time=BASE_MS + 1000)
                for i, k in enumerate(kinds or ([kind] if kind else []))]
    return BlockMeta(
        id=own, tenant="acme", level=level, group=group, generation=generation, min_time=BASE_MS,
        max_time=BASE_MS + 1000, kafka=[KafkaRange(topic=topic, partition=partition, start=start, end=end,
                                                   incarnation=incarnation)],
        partition_values=pv or {}, datasets=datasets,
        files=[FileInfo(name=d.file, size=n * 10, crc32="00000000") for d in datasets],
        compaction=Compaction(sources=[block_id(s) for s in sources] if sources else [own],
                              parents=[block_id(p) for p in parents or []]),
        parser=parser)


def facts(meta: BlockMeta, state: str = "healthy", *, indexed: bool = True, tombstoned: str | None = None,
          unclaimed: str | None = None, damage: tuple[str, ...] = (), mark: str | None = None,
          quarantine: str | None = None) -> BlockFacts:
    return BlockFacts(id=meta.id, state=state, meta=meta, indexed=indexed, tombstoned=tombstoned, unclaimed=unclaimed,
                      damage=damage, mark=mark, quarantine=quarantine, objects=(meta_key(meta),))
