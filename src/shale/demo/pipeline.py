"""The demo pipeline (``make demo``): real Loghub logs through the whole system, on embedded defaults.

Kafka (KRaft) runs locally; the bucket is a folder on the local filesystem (``file://``, which passes the same
bucket acceptance suite as S3 and MinIO: conditional puts, listings, deletes), so the demo needs no S3 server and
nothing built with ``go install``; the metastore is embedded (a SQLite file); Spark runs in local mode.
Six log streams are produced as six topics, persisted by both ingest groups in several batches, and then
checked and shown: the completeness ledger, a verify summary against Kafka's offsets, and a sample of the parsed
records. Then the rest of the pipeline runs on the same data: a query, compaction on Spark, verify again (still
exactly once), the per-tenant bucket indexes, and the same query through a bucket index, reading fewer objects.
A seventh topic holds the Zookeeper lines again as Avro records written through a real Schema Registry (Apicurio,
started beside Kafka), its schema evolved halfway: the partition group stores it as typed columns, shown at the end
through ``shale query`` and Spark SQL (``shale.demo.typed``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Producer

from shale.block import read_dataset
from shale.bucketindex import BucketIndexReader, BucketIndexWriter
from shale.compactor import CompactionWorker
from shale.config import (
    BucketConfig,
    CompactionConfig,
    IngestConfig,
    ParserRule,
    SchemaRegistryConfig,
    ShaleConfig,
    SparkConfig,
    TenantRule,
)
from shale.demo import typed
from shale.demo.samples import LOGHUB_FORMATS, loghub_lines
from shale.dev import KafkaBroker, SchemaRegistry, connector_conf
from shale.ingest import IngestJob
from shale.kafka import list_partitions
from shale.metastore import MetastoreService, open_metastore
from shale.objstore import Bucket, open_bucket
from shale.query import BlockSource, BucketIndexSource, Query, run_query
from shale.verify import build_ledger, group_blocks, verify_topic

TENANT_OF = {"apache": "web", "openssh": "security", "linux": "security"}  # everything else: infra
DEMO_QUERY = ("infra", '{topic="logs.zookeeper", level="WARN"}')


@dataclass
class DemoResult:
    records: int = 0
    lines: list[str] = field(default_factory=list)
    ok: bool = True


def _config(root: Path, broker: KafkaBroker, registry: SchemaRegistry, bucket_url: str) -> ShaleConfig:
    topics = [*(f"logs.{preset}" for preset in LOGHUB_FORMATS.values()), typed.TOPIC]
    return ShaleConfig(
        bucket=BucketConfig(url=bucket_url),
        kafka={"bootstrap_servers": broker.bootstrap_servers},  # type: ignore[arg-type]
        metastore={"data_dir": str(root / "metastore")},  # type: ignore[arg-type]
        spark=SparkConfig(master="local[2]", conf=connector_conf()),  # the cached jars, not a Maven resolve
        ingest=IngestConfig(
            topics=topics, default_tenant="infra",
            max_records_per_batch=6000,  # several batches, so that there are blocks to compact
            tenants=[TenantRule(topic_pattern=rf"logs\.{p}", tenant=t) for p, t in TENANT_OF.items()],
            parsers=[*(ParserRule(topic_pattern=rf"logs\.{p}", parser="text", options={"preset": p})
                       for p in LOGHUB_FORMATS.values()), typed.PARSER],
            schema_registry=SchemaRegistryConfig(url=registry.url)),
        compaction=CompactionConfig(blocks_per_job=[8], max_level=1, poll_interval=0.2),
    )


def _query(source: BlockSource, bucket: Bucket) -> tuple[int, int, int]:
    """Rows, objects read and bytes read by the demo query (all time, one tenant, two matchers)."""
    tenant, selector = DEMO_QUERY
    query = Query(tenant, 0, 2**62, selector)
    rows = sum(batch.num_rows for batch in run_query(query, source, bucket))
    return rows, query.stats.objects, query.stats.bytes_read


def _verify(say: Callable[[str], None], config: ShaleConfig, metastore: MetastoreService, bucket: Bucket) -> bool:
    ok = True
    say("verify against Kafka (missing / duplicated / quarantined):")
    for topic in config.ingest.topics:
        reports = [verify_topic(metastore, bucket, config.kafka, g, 1, topic) for g in ("backup", "partition")]
        ok = ok and all(r.ok for r in reports)
        say(f"  {topic}: " + "; ".join(f"{r.group} {r.stored} stored, {r.missing} / {r.duplicated} / "
                                         f"{r.quarantined}" for r in reports))
    return ok


def _levels(metastore: MetastoreService) -> str:
    counts: dict[int, int] = {}
    for tenant in metastore.tenants():
        for block in metastore.tenant_blocks(tenant):
            counts[block.level] = counts.get(block.level, 0) + 1
    return ", ".join(f"level {level}: {n}" for level, n in sorted(counts.items()))


def produce_logs(bootstrap: str) -> int:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics = [NewTopic(f"logs.{preset}", 2, 1) for preset in LOGHUB_FORMATS.values()]
    for future in admin.create_topics(topics).values():
        future.result(timeout=30)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 10})
    total = 0
    for sample, preset in LOGHUB_FORMATS.items():
        for n, line in enumerate(loghub_lines(sample)):
            producer.produce(f"logs.{preset}", key=f"{sample}-{n}".encode(), value=line)
            total += 1
    producer.flush(60)
    return total


def _write_config(config: ShaleConfig, path: Path) -> Path:
    """What ``shale query`` and Shale's Spark data source need to find the blocks: the bucket (and the metastore)."""
    path.write_text(f"[bucket]\nurl = {json.dumps(config.bucket.url)}\n"
                    f"[metastore]\ndata_dir = {json.dumps(config.metastore.data_dir)}\n")
    return path


def run_demo(root: Path, say: Callable[[str], None], shale: Callable[[list[str]], None]) -> DemoResult:
    """The whole demo; ``say`` prints a line, ``shale`` runs a ``shale`` command line (the CLI is a layer above)."""
    result = DemoResult()
    from shale.spark import spark_session

    registry = SchemaRegistry(root / "registry")
    with ThreadPoolExecutor(1) as pool:
        registry_started = pool.submit(registry.start)  # Apicurio starts while Kafka does
        try:
            broker = KafkaBroker(root / "kafka").start()
        except BaseException:
            registry_started.result()
            registry.stop()
            raise
    try:
        registry_started.result()
        say(f"Kafka (KRaft) ready at {broker.bootstrap_servers}, Schema Registry (Apicurio) at {registry.url}")
        bucket_url = f"file://{root / 'bucket'}"
        say(f"bucket: {bucket_url} (the local filesystem)")
        config = _config(root, broker, registry, bucket_url)
        result.records = produce_logs(broker.bootstrap_servers)
        say(f"produced {result.records} real log lines (Loghub) to {len(LOGHUB_FORMATS)} topics, 2 partitions each")
        lines = loghub_lines(typed.SAMPLE)
        result.records += typed.produce_avro(broker.bootstrap_servers, registry.url, lines)
        say(f"produced the {len(lines)} {typed.SAMPLE} lines again as Avro records to {typed.TOPIC} (AvroSerializer: "
            "a decimal, a timestamp-millis, an enum, a nested record), the schema evolved halfway (a field added "
            "with a default)")
        spark = spark_session("shale-demo", config.spark)
        metastore = open_metastore(config)
        assert isinstance(metastore, MetastoreService)  # embedded defaults: the in-process metastore
        for group in ("backup", "partition"):
            job = IngestJob(config, group, spark=spark, metastore=metastore)
            job.run(available_now=True)
            say(f"ingest group {group}: {job.batches} batch(es) committed")
        bucket = open_bucket(config.bucket)
        say("")
        say("completeness ledger (partition group):")
        for topic in config.ingest.topics:
            book = build_ledger(metastore, "partition", 1, topic)
            days = ", ".join(f"{d.dt} ({d.rows} rows, {'complete' if d.complete else 'open'})" for d in book.days[:3])
            more = f" and {len(book.days) - 3} more days" if len(book.days) > 3 else ""
            say(f"  {topic}: offsets {[w.committed_end for w in book.partitions]}; {days}{more}")
        say("")
        result.ok = _verify(say, config, metastore, bucket)
        say("")
        say("a sample of the stored records (partition group, parsed):")
        for topic in config.ingest.topics[:3]:
            block = next(m for m in group_blocks(metastore, "partition", 1, topic)
                         if m.datasets[0].kind == "records")
            row = read_dataset(bucket, block, block.datasets[0], whole_object=None).slice(0, 1).to_pylist()[0]
            shown = {k: (row[k].isoformat() if k == "event_time" else row[k])
                     for k in ("event_time", "level", "component", "host", "process", "message")
                     if k in row and row[k] is not None}
            say(f"  tenant {block.tenant} {topic}[{row['partition']}]@{row['offset']}: {shown}")
        say("")
        rows, objects, size = _query(metastore, bucket)
        say(f"query {DEMO_QUERY[1]} on tenant {DEMO_QUERY[0]}: {rows} records from {objects} objects "
            f"({size:,} bytes)")
        say(f"compacting on Spark ({_levels(metastore)})")
        worker = CompactionWorker(metastore, config.bucket, spark, slots=2, poll_interval=0.2)
        worker.run(until_idle=True)
        say(f"  {len(worker.completed)} jobs done; blocks now {_levels(metastore)}")
        result.ok = _verify(say, config, metastore, bucket) and result.ok
        index_writer = BucketIndexWriter(bucket, metastore.state.reader, config.bucket_index)
        for tenant in metastore.tenants():
            index_writer.write_tenant(tenant)
        say(f"bucket indexes written for tenants {', '.join(metastore.tenants())}")
        reader_bucket = open_bucket(config.bucket)  # a fresh client, as a separate reader would have
        after = _query(BucketIndexSource(BucketIndexReader(reader_bucket, config.bucket_index)), reader_bucket)
        calls = reader_bucket.calls.snapshot()
        say(f"the same query through the bucket index (no metastore): {after[0]} records from {after[1]} objects "
            f"({after[2]:,} bytes), with {calls['list']} LIST calls and {calls['get'] + calls['get_range']} GETs in "
            "all: the tenant's index, then the data objects")
        result.ok = result.ok and after[0] == rows
        say("")
        say(f"the typed table of {typed.TOPIC} (the avro parser):")
        spark_rows = typed.show_typed(say, spark, _write_config(config, root / "shale.toml"), shale)
        result.ok = typed.show_duckdb(say, config, metastore, bucket, root / "iceberg" / "catalog.db",
                                      spark_rows) and result.ok
        partitions = list_partitions(config.kafka, config.ingest.topics)
        say(f"\n{len(partitions)} topics, {sum(len(p) for p in partitions.values())} Kafka partitions, "
            f"{len(metastore.tenants())} tenants: {', '.join(metastore.tenants())}")
        spark.stop()
    finally:
        broker.stop()
        registry.stop()
    return result
