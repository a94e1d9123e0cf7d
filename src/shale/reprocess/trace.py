"""Traceability both ways (seed 002: file names that trace back to Kafka offsets).

* ``trace_block``: a partition-group block → its Kafka ranges and the backup blocks holding them (recorded in
  ``derived_from`` by reprocessing; found by offset range for blocks written by live ingestion).
* ``locate``: a Kafka (topic, partition, offset) → the live block of every group and generation that holds it.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow.compute as pc

from shale.block import BlockMeta, read_dataset
from shale.errors import NotFoundError
from shale.metastore import IndexReads
from shale.objstore import BucketReader


@dataclass
class Location:
    group: str
    generation: int
    tenant: str
    block: str
    dataset: str
    level: int
    incarnation: str = ""
    """The topic incarnation the offset belongs to: a recreated topic reuses offsets."""


def _all_blocks(metastore: IndexReads, topic: str, group: str | None = None) -> list[BlockMeta]:
    tenants = metastore.tenants()
    return metastore.query_blocks(tenants, 0, 2**62, f'{{topic="{topic}"}}', group=group) if tenants else []


def trace_block(metastore: IndexReads, block_id: str) -> dict[str, object]:
    meta = metastore.get_block(block_id)
    if meta is None:
        raise NotFoundError(f"no live block {block_id} in the index (compacted or deleted? "
                            f"`shale tombstones --block {block_id}`)")
    sources: set[str] = set(meta.derived_from)
    if not sources:
        for topic in {r.topic for r in meta.kafka}:
            for backup in _all_blocks(metastore, topic, "backup"):
                if any(b.topic == r.topic and b.partition == r.partition and b.start < r.end and r.start < b.end
                       for b in backup.kafka for r in meta.kafka):
                    sources.add(backup.id)
    return {"block": meta.id, "tenant": meta.tenant, "group": meta.group, "generation": meta.generation,
            "kafka": [r.model_dump() for r in meta.kafka], "backup_blocks": sorted(sources),
            "parser": meta.parser.model_dump() if meta.parser else None}


def locate(metastore: IndexReads, bucket: BucketReader, topic: str, partition: int, offset: int) -> list[Location]:
    """Every live block holding the record, one per group and generation (reads one column of candidates)."""
    found = []
    for meta in _all_blocks(metastore, topic):
        holding = [r for r in meta.kafka if r.topic == topic and r.partition == partition and r.start <= offset < r.end]
        if not holding:
            continue
        for dataset in meta.datasets:
            if dataset.topic != topic:
                continue
            table = read_dataset(bucket, meta, dataset, columns=["partition", "offset"], whole_object=None,
                                 filters=(pc.field("partition") == partition) & (pc.field("offset") == offset))
            if table.num_rows:
                found.append(Location(meta.group, meta.generation, meta.tenant, meta.id, dataset.name, meta.level,
                                      holding[0].incarnation))
    return sorted(found, key=lambda loc: (loc.group, loc.generation, loc.incarnation))
