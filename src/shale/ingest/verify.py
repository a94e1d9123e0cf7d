"""``shale verify``: reconcile Kafka's offsets with the index and the blocks' contents (guarantee 1).

For each partition of the topic: the offsets that hold records in Kafka (read with a consumer, so transaction
markers and compacted-away offsets are not counted as missing), the metastore's committed end, and the offsets
stored in the group's live blocks (records and quarantine datasets, read one column at a time). Every Kafka
offset below the committed end must be stored exactly once; offsets Kafka no longer holds (retention) are
checked for duplicates only.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

from shale.block import BlockMeta, Dataset, read_dataset
from shale.config import KafkaConfig
from shale.ingest.kafka import existing_offsets, list_partitions, watermarks
from shale.metastore import Metastore
from shale.objstore import BucketReader


@dataclass
class PartitionReport:
    partition: int
    kafka_earliest: int
    kafka_end: int
    committed_end: int | None
    stored: int
    quarantined: int
    missing: int
    duplicated: int
    not_yet_ingested: int
    missing_sample: list[int] = field(default_factory=list)


@dataclass
class VerifyReport:
    group: str
    generation: int
    topic: str
    partitions: list[PartitionReport]

    @property
    def missing(self) -> int:
        return sum(p.missing for p in self.partitions)

    @property
    def duplicated(self) -> int:
        return sum(p.duplicated for p in self.partitions)

    @property
    def quarantined(self) -> int:
        return sum(p.quarantined for p in self.partitions)

    @property
    def stored(self) -> int:
        return sum(p.stored for p in self.partitions)

    @property
    def ok(self) -> bool:
        return self.missing == 0 and self.duplicated == 0

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "missing": self.missing, "duplicated": self.duplicated,
                "quarantined": self.quarantined, "stored": self.stored, "ok": self.ok}


def group_blocks(metastore: Metastore, group: str, generation: int, topic: str) -> list[BlockMeta]:
    """The group's live blocks holding ``topic`` (every tenant), with only that topic's datasets."""
    tenants = metastore.tenants()
    if not tenants:
        return []
    metas = metastore.query_blocks(tenants, 0, 2**62, f'{{topic="{topic}"}}', group=group)
    return [m for m in metas if m.generation == generation]


def stored_offsets(bucket: BucketReader, metas: list[BlockMeta], topic: str,
                   concurrency: int = 16) -> tuple[dict[int, list[int]], dict[int, int]]:
    """Offsets per partition stored in the blocks' datasets of ``topic``, and quarantined counts."""
    jobs = [(m, d) for m in metas for d in m.datasets if d.topic == topic]

    def load(job: tuple[BlockMeta, Dataset]) -> tuple[str, list[int], list[int]]:
        meta, dataset = job
        table = read_dataset(bucket, meta, dataset, columns=["partition", "offset"], whole_object=None)
        return dataset.kind, table.column("partition").to_pylist(), table.column("offset").to_pylist()

    offsets: dict[int, list[int]] = defaultdict(list)
    quarantined: Counter[int] = Counter()
    with ThreadPoolExecutor(concurrency) as pool:
        for kind, partitions, values in pool.map(load, jobs):
            for partition, offset in zip(partitions, values, strict=True):
                offsets[partition].append(offset)
                if kind == "quarantine":
                    quarantined[partition] += 1
    return offsets, dict(quarantined)


def verify_topic(metastore: Metastore, bucket: BucketReader, kafka: KafkaConfig, group: str, generation: int,
                 topic: str) -> VerifyReport:
    parts = list_partitions(kafka.bootstrap_servers, [topic], options=kafka.options).get(topic, [])
    marks = watermarks(kafka.bootstrap_servers, {topic: parts}, kafka.options) if parts else {}
    committed = {o.partition: o.committed_end for o in metastore.offsets(group, generation) if o.topic == topic}
    stored, quarantined = stored_offsets(bucket, group_blocks(metastore, group, generation, topic), topic)
    reports = []
    for partition in parts:
        earliest, end = marks[(topic, partition)]
        done = committed.get(partition)
        counts = Counter(stored.get(partition, []))
        duplicated = sum(n - 1 for n in counts.values() if n > 1)
        upto = min(end, done) if done is not None else earliest
        in_kafka = existing_offsets(kafka.bootstrap_servers, topic, partition, earliest, upto, kafka.options)
        missing = [o for o in in_kafka if o not in counts]
        reports.append(PartitionReport(
            partition=partition, kafka_earliest=earliest, kafka_end=end, committed_end=done,
            stored=sum(counts.values()), quarantined=quarantined.get(partition, 0), missing=len(missing),
            duplicated=duplicated, not_yet_ingested=max(0, end - (done if done is not None else earliest)),
            missing_sample=missing[:10]))
    return VerifyReport(group, generation, topic, reports)

