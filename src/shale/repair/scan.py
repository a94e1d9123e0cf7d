"""One scan of a tenant for ``shale bucket repair``: the bucket first, then the metastore, then the data.

The order matters as in the leader's bucket scan (DESIGN 9.5): the tenant's blocks are listed *before* the index
is read, so a block committed after the listing is indexed in that read, or still claimable by it (the same
``garbage.unclaimed`` rule), and never judged uncommitted. Every data object of the blocks a repair may judge is
then read and checked against meta.json (size and CRC32, as ``shale bucket verify`` does). Kafka is asked only
when a block is damaged, and only about its partitions.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from shale.block import BlockFetcher, BlockMeta, BlockState, BlockView, ParserInfo, block_file_key, crc32_hex
from shale.config import BucketConfig, IngestConfig, KafkaConfig
from shale.errors import NotFoundError
from shale.logs import redact
from shale.metastore import Claims, IndexReads, unclaimed
from shale.objstore import BucketReader
from shale.repair.model import ABSENT, BlockFacts, KafkaPartition, Sources

log = logging.getLogger(__name__)
TOMBSTONES_READ = 1_000_000


@dataclass
class Scan:
    tenant: str
    facts: list[BlockFacts]
    sources: Sources
    metastore: bool

    def meta(self, block_id: str) -> BlockMeta:
        for f in self.facts:
            if f.id == block_id and f.meta is not None:
                return f.meta
        raise KeyError(f"the scan has no metadata of block {block_id}")


def check_objects(bucket: BucketReader, view: BlockView) -> tuple[str, ...]:
    """What is wrong with the data objects meta.json lists: missing, another size, another CRC32 (as
    ``shale bucket verify`` reports them)."""
    assert view.meta is not None
    problems = []
    for info in view.meta.files:
        try:
            data = bucket.get(block_file_key(view.meta, info.name))
        except NotFoundError:
            problems.append(f"missing-object: {info.name} is listed but missing")
            continue
        if len(data) != info.size:
            problems.append(f"size-mismatch: {info.name}: {len(data)} bytes, meta.json says {info.size}")
        elif crc32_hex(data) != info.crc32:
            problems.append(f"checksum-mismatch: {info.name}: CRC32 {crc32_hex(data)}, meta.json says {info.crc32}")
    return tuple(problems)


def _damage(bucket: BucketReader, views: Sequence[BlockView], concurrency: int) -> dict[str, tuple[str, ...]]:
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        found = list(pool.map(lambda v: (v.id, check_objects(bucket, v)), views))
    return {block_id: problems for block_id, problems in found if problems}


def scan_tenant(bucket: BucketReader, tenant: str, *, sync_delay: float, index: IndexReads | None,
                kafka: Callable[[list[tuple[str, int]]], dict[tuple[str, int], KafkaPartition]] | None = None,
                parsers: Callable[[list[str]], dict[str, ParserInfo | str]] | None = None,
                concurrency: int = 16) -> Scan:
    """The facts of every block of ``tenant``. ``kafka`` gives the state of topic-partitions (or raises);
    ``parsers`` the parser each partition-group topic gets now."""
    result = BlockFetcher(bucket, sync_delay).sync(tenant)  # the listing first, then the index
    indexed: dict[str, BlockMeta] = {}
    tombstoned: dict[str, str] = {}
    claims = Claims({}, {}, frozenset())
    if index is not None:
        indexed = {m.id: m for m in index.tenant_blocks(tenant)}
        tombstoned = {t.block_id: t.reason for t in index.tombstones(limit=TOMBSTONES_READ) if t.tenant == tenant}
        claims = Claims.of(index.offsets(), index.offset_history()[0],
                           [job["source_ids"] for job in index.compaction_jobs()])
    judged = [v for v in result.blocks.values() if v.meta is not None
              and (v.id in indexed or v.state not in (BlockState.FRESH, BlockState.MARKED_FOR_DELETION))]
    damage = _damage(bucket, judged, concurrency)
    facts = []
    for view in sorted(result.blocks.values(), key=lambda v: v.id):
        meta = view.meta or indexed.get(view.id)
        problems = damage.get(view.id, ())
        if view.meta is None and (view.id in indexed or view.quarantine is not None):
            problems = (f"meta.json: {view.error or 'missing'}", *problems)
        unclaimed_why = None
        if index is not None and meta is not None and view.id not in indexed and view.id not in tombstoned:
            unclaimed_why = unclaimed(meta, claims)
        facts.append(BlockFacts(
            id=view.id, state=view.state.value, meta=meta, indexed=view.id in indexed,
            tombstoned=tombstoned.get(view.id), unclaimed=unclaimed_why, damage=problems,
            mark=view.mark.reason if view.mark else None,
            quarantine=(f"{'; '.join(view.quarantine.damage)} ({view.quarantine.reason})" if view.quarantine else None),
            objects=tuple(o.key for o in view.objects)))
    for block_id in sorted(set(indexed) - set(result.blocks)):
        facts.append(BlockFacts(id=block_id, state=ABSENT, meta=indexed[block_id], indexed=True,
                                damage=("missing-object: the index holds it, the bucket has no object of it",)))
    return Scan(tenant, facts, _sources(facts, kafka, parsers), index is not None)


def _sources(facts: list[BlockFacts],
             kafka: Callable[[list[tuple[str, int]]], dict[tuple[str, int], KafkaPartition]] | None,
             parsers: Callable[[list[str]], dict[str, ParserInfo | str]] | None) -> Sources:
    damaged = [f.meta for f in facts if f.meta is not None and (f.damage or f.quarantine is not None)]
    if not damaged:
        return Sources()
    partitions = sorted({(r.topic, r.partition) for m in damaged for r in m.kafka if r.end > r.start})
    topics = sorted({d.topic for m in damaged if m.group == "partition" for d in m.datasets})
    found = parsers(topics) if parsers is not None and topics else {}
    if kafka is None:
        return Sources(kafka_error="Kafka was not asked", parsers=found)
    try:
        return Sources(kafka=kafka(partitions), parsers=found)
    except Exception as exc:  # Kafka is one source among others: the plan says it could not be asked
        why = redact(str(exc))[:300]
        log.warning("Kafka could not be asked about the damaged blocks' partitions", extra={"error": why})
        return Sources(kafka_error=why, parsers=found)


def kafka_state(config: KafkaConfig) -> Callable[[list[tuple[str, int]]], dict[tuple[str, int], KafkaPartition]]:
    """The live Kafka's topic incarnations and read_committed bounds, for ``scan_tenant``."""
    from shale.kafka import describe_topics, offset_bounds

    def ask(partitions: list[tuple[str, int]]) -> dict[tuple[str, int], KafkaPartition]:
        topics = describe_topics(config, sorted({t for t, _ in partitions}))
        present = [(t, p) for t, p in partitions if t in topics and p in topics[t].partitions]
        bounds = offset_bounds(config, present)
        return {(t, p): KafkaPartition(topics[t].incarnation, *bounds[(t, p)]) for t, p in present}

    return ask


def current_parsers(bucket: BucketConfig, ingest: IngestConfig) -> Callable[[list[str]], dict[str, ParserInfo | str]]:
    """The parser each topic gets now from ``ingest.parsers`` (or why it gets none), for ``scan_tenant``."""
    from shale.encoder import GroupSpec

    spec = GroupSpec("partition", ingest.generation, bucket, ingest)

    def ask(topics: list[str]) -> dict[str, ParserInfo | str]:
        out: dict[str, ParserInfo | str] = {}
        for topic in topics:
            parser = spec.parser_for(topic)
            out[topic] = parser if isinstance(parser, str) else ParserInfo(
                name=parser.name, version=parser.version, options_digest=parser.digest())
        return out

    return ask
