"""Every bucket request an ingest makes is counted by the process that exports the metrics, also the uploads of
Spark's Python workers (issue 59: 46 PUTs were reported against at least 169 objects written): after a batch
into a fresh bucket, the PUTs counted equal the objects the bucket holds; after compaction, the objects it
added."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY
from tests.factories import write_backup_block
from tests.integration.ingest_helpers import config_of, create_topic, produce_json, write_config

from shale.block import parse_meta
from shale.compactor.worker import CompactionWorker
from shale.config import CompactionConfig, ShaleConfig
from shale.iceberg import IcebergPublisher
from shale.ingest.job import IngestJob
from shale.metastore import AddBlocks, open_metastore
from shale.objstore import open_bucket


def requests_counted(operation: str) -> dict[str, float]:
    """``shale_objstore_requests_total`` of this process for ``operation``, by the ``by`` label (all outcomes)."""
    counted: dict[str, float] = {}
    for family in REGISTRY.collect():
        for sample in family.samples:
            if sample.name == "shale_objstore_requests_total" and sample.labels["operation"] == operation:
                by = sample.labels.get("by", "process")
                counted[by] = counted.get(by, 0.0) + sample.value
    return counted


def test_the_puts_counted_are_the_objects_written(kafka: Any, minio_bucket: Any, spark: Any, tmp_path: Path) -> None:
    topic = f"counted-{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap_servers, topic, 4)
    produce_json(kafka.bootstrap_servers, topic, 20_000, seed=3)
    config = config_of(write_config(tmp_path, kafka.bootstrap_servers, minio_bucket, [topic]))
    metastore = open_metastore(config)
    before = {op: requests_counted(op) for op in ("put", "get", "list")}
    batches = {}
    for group in ("backup", "partition"):
        job = IngestJob(config, group, spark=spark, metastore=metastore)
        job.run(available_now=True)
        batches[group] = job.batches
        assert job.batches >= 1
    counted = {op: {by: n - before[op].get(by, 0.0) for by, n in requests_counted(op).items()} for op in before}
    puts = counted["put"]
    bucket = open_bucket(config.bucket)
    objects = [o.key for o in bucket.list("")]
    print(f"batches {batches}, requests counted {counted}, objects in the bucket {len(objects)}")
    assert puts.get("tasks", 0) > 0  # the Python workers' uploads reached this process's metric
    assert sum(puts.values()) == len(objects), sorted(objects)

    # The cost page's formulas (docs/OPERATING.md, "What the bucket costs"), on this run: a block per task, topic,
    # tenant and data hour in each batch; its objects are its datasets and meta.json; one GET per block (meta.json
    # looked for first, absent); a bucket-index delta per commit.
    tasks = min(4, spark.sparkContext.defaultParallelism)
    metas = [parse_meta(bucket.get(k), where=k) for k in objects if k.endswith("/meta.json")]
    for group, runs in batches.items():
        hours = {m.min_time // 3_600_000 for m in metas if m.group == group}
        assert len([m for m in metas if m.group == group]) == runs * tasks * len(hours)
    assert len(objects) == sum(len(m.datasets) + 1 for m in metas) + sum(batches.values())
    assert sum(counted["get"].values()) == len(metas)


    # Iceberg on (the SQL catalog, its metadata in the bucket): the partition group's one commit touched one table,
    # created with two metadata.json, and is one snapshot of three objects (a manifest, a manifest list, a
    # metadata.json). pyiceberg writes them through its own file IO: they are not in Shale's request counter.
    on = config.model_copy(update={"iceberg": config.iceberg.model_copy(update={
        "enabled": True, "catalog_uri": f"sqlite:///{tmp_path}/catalog.db"})})
    IcebergPublisher(on, metastore.state.reader, metastore.submit, bucket).sync()
    iceberg = [o.key for o in bucket.list("_shale/iceberg/")]
    assert len(iceberg) == 2 + 3 * batches["partition"], sorted(iceberg)


def test_the_puts_counted_by_a_compaction_worker_are_the_objects_it_added(minio_bucket: Any, spark: Any,
                                                                          tmp_path: Path) -> None:
    config = ShaleConfig(bucket=minio_bucket, metastore={"data_dir": str(tmp_path / "ms")},  # type: ignore[arg-type]
                         compaction=CompactionConfig(blocks_per_job=[10], max_level=1))
    service = open_metastore(config)
    bucket = open_bucket(minio_bucket)
    service.submit(AddBlocks(blocks=[write_backup_block(bucket, "acme", "app", i % 2, (i // 2) * 5, 5)
                                     for i in range(40)]))
    objects_before = len(list(bucket.list("")))
    before = {op: requests_counted(op) for op in ("put", "get", "get_range", "head", "list", "delete")}
    CompactionWorker(service, minio_bucket, spark, slots=2, poll_interval=0.2).run(until_idle=True)
    counted = {op: {by: n - before[op].get(by, 0.0) for by, n in requests_counted(op).items()} for op in before}
    puts = counted["put"]
    objects = [o.key for o in bucket.list("")]
    print(f"requests counted {counted}, objects added {len(objects) - objects_before}")
    assert puts.get("tasks", 0) > 0
    assert sum(puts.values()) == len(objects) - objects_before, sorted(objects)
    # The cost page's formulas: a job per 10 sources; a GET per source data object and one per job (its output's
    # meta.json looked for first); a PUT per output object (its one dataset and meta.json).
    jobs = 40 // 10
    assert sum(counted["get"].values()) == 40 + jobs
    assert sum(puts.values()) == jobs * 2
