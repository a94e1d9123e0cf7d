"""Builders of block metadata for metastore tests (no bucket needed: the index stores metadata only)."""

from __future__ import annotations

from tests.factories import BASE_MS

from shale.block import BlockMeta, Compaction, Dataset, FileInfo, KafkaRange, deterministic_block_id


def meta(tenant: str = "acme", topic: str = "app", partition: int = 0, start: int = 0, end: int = 100,
         group: str = "backup", generation: int = 1, time_ms: int = BASE_MS, min_time: int | None = None,
         max_time: int | None = None, labels: list[dict[str, str]] | None = None, level: int = 0,
         sources: list[str] | None = None, key: str | None = None, shard: int = 0) -> BlockMeta:
    block_id = deterministic_block_id(time_ms, key or f"{tenant}/{group}/{generation}/{topic}/{partition}/{start}")
    low = time_ms if min_time is None else min_time
    high = low + 60_000 if max_time is None else max_time
    return BlockMeta(
        id=block_id, tenant=tenant, shard=shard, level=level, group=group, generation=generation,
        min_time=low, max_time=high,
        kafka=[KafkaRange(topic=topic, partition=partition, start=start, end=end)],
        datasets=[Dataset(name=f"records/{topic}", kind="records", topic=topic, file="records-0.parquet",
                          rows=end - start, bytes=(end - start) * 100, min_time=low, max_time=high,
                          labels=labels if labels is not None else [{"topic": topic}])],
        files=[FileInfo(name="records-0.parquet", size=(end - start) * 10, crc32="00000000")],
        compaction=Compaction(sources=sources or [block_id]),
    )


def output_of(sources: list[BlockMeta], key: str = "out", max_time: int | None = None) -> BlockMeta:
    """A compaction output of ``sources`` as the merge writes it: one level up, the sources as parents, their
    lineage, their Kafka ranges joined, their rows, the ULID time of the oldest."""
    head = sources[0]
    spans: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for s in sources:
        for r in s.kafka:
            spans.setdefault((r.topic, r.partition), []).append((r.start, r.end))
    kafka = []
    for (topic, partition), ranges in sorted(spans.items()):
        ranges.sort()
        low, high = ranges[0]
        for start, end in ranges[1:]:
            if start > high:
                kafka.append(KafkaRange(topic=topic, partition=partition, start=low, end=high))
                low = start
            high = max(high, end)
        kafka.append(KafkaRange(topic=topic, partition=partition, start=low, end=high))
    low = min(s.min_time for s in sources)
    high = max(s.max_time for s in sources) if max_time is None else max_time
    rows = sum(s.rows for s in sources)
    block_id = deterministic_block_id(min(s.time_ms for s in sources), key)
    topic = head.datasets[0].topic
    return BlockMeta(
        id=block_id, tenant=head.tenant, shard=head.shard, level=head.level + 1, group=head.group,
        generation=head.generation, min_time=low, max_time=high, kafka=kafka,
        datasets=[Dataset(name=f"records/{topic}", kind="records", topic=topic, file="records-0.parquet", rows=rows,
                          bytes=rows * 100, min_time=low, max_time=high, labels=[{"topic": topic}])],
        files=[FileInfo(name="records-0.parquet", size=rows * 10, crc32="00000000")],
        compaction=Compaction(sources=sorted({x for s in sources for x in s.compaction.sources}),
                              parents=sorted(s.id for s in sources)))
