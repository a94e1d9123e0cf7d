"""The change tables benchmark's replay (issue 57): a full topic of ``CHANGES`` upserts (10 million over ``KEYS``
keys, a tenth of them tombstones) replayed into the latest row per key, by Shale and by Spark Structured
Streaming's usual ``foreachBatch`` + ``MERGE INTO`` an Iceberg table, each started cold on the full topic, one
after the other on the same broker and MinIO.

* **Shale**: ``shale run`` on defaults (``bench.freshness``'s deployment: both ingest groups, the metastore, a
  compaction worker), the topic's rule ``table = "upsert"``. Timed from the deployment's start until the partition
  group has committed the whole topic and a cold ``shale.read(latest=True, columns=["key", "v"])`` (a new process's
  read: the whole history) has returned every latest row.
* **Spark**: a local session (``local[2]``, as Shale's services run) with Apache Iceberg's Spark runtime
  (``iceberg-spark-runtime-4.1_2.13`` 1.12.0) and a ``JdbcCatalog`` (SQLite) over S3FileIO at the same MinIO; the
  table ``(key string, v string)``, format version 2 with merge-on-read for merges, updates and deletes (the
  setting Iceberg's documentation gives for frequent row-level changes: copy-on-write rewrites every touched data
  file at each batch). The query reads the topic from the earliest offsets with ``maxOffsetsPerTrigger``
  ``MERGE_BATCH`` (1,000,000: a streaming job's bounded batches, ``availableNow``), and each batch keeps the last
  change per key (``max_by`` over the offset: a key's changes are in one partition) and merges it: a tombstone
  deletes the row, a value updates or inserts it. Timed from the session's creation until the query ends.

Both results are checked against the topic replayed into a dictionary (a key's last ``v``; a tombstone removes it),
key for key and value for value. ``ratios.vs_spark_merge_into`` is Shale's changes per second over Spark's.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any

from tests.producing import CheckedProducer

from bench.common import progress
from bench.freshness import TENANT, _prepare, _wait, deployment
from bench.peers_tables import sink_catalog_conf
from shale.config import BucketConfig, SparkConfig
from shale.dev import connector_conf
from shale.dev.fetch import iceberg_jars
from shale.metastore import MetastoreClient
from shale.query.latest import PROCESS_READS
from shale.query.table import read

CHANGES = int(os.environ.get("CHANGE_TABLES_REPLAY", "10000000"))
MERGE_BATCH = 1_000_000
DELETES = 0.1


def produce_all(bootstrap: str, topic: str, changes: int, keys: int) -> int:
    """``changes`` upserts over ``keys`` keys (``DELETES`` of them tombstones), as fast as the broker takes them;
    returns how many were tombstones."""
    producer = CheckedProducer({"bootstrap.servers": bootstrap, "linger.ms": 20, "compression.type": "lz4",
                                "batch.size": 1_000_000, "queue.buffering.max.messages": 1_000_000,
                                "enable.idempotence": True})
    rng = random.Random(5757)
    filler = b"x" * 80
    ms = int(time.time() * 1000)
    deletes = 0
    for i in range(changes):
        key = b"k%07d" % rng.randrange(keys)
        if rng.random() < DELETES:
            producer.produce(topic, None, key)  # type: ignore[arg-type]  # a tombstone
            deletes += 1
        else:
            producer.produce(topic, b'{"ts": %d, "kind": "change", "v": "%d", "pad": "%s"}' % (ms + i // 1000, i,
                                                                                               filler), key)
    producer.flush(300)  # raises unless every record was delivered
    return deletes


def rows_of(table: Any) -> dict[Any, Any]:
    """A latest read's rows as key -> ``v``."""
    return dict(zip(table.column("key").to_pylist(), table.column("v").to_pylist(), strict=True))


def check_rows(got: dict[Any, Any], expected: dict[bytes, str], who: str) -> None:
    """Raises unless the latest rows ``who`` read (key -> ``v``) equal the topic's replay."""
    if got != expected:
        wrong = [k for k in expected.keys() | got.keys() if got.get(k) != expected.get(k)]
        raise RuntimeError(f"{who}'s latest rows differ from the topic's replay at {len(wrong)} keys, e.g. "
                           f"{sorted(wrong)[:5]}")


def shale_replay(bootstrap: str, bucket: BucketConfig, work: Path, parser: list[str], partitions: int,
                 changes: int, keys: int, expected_of: Any) -> dict[str, Any]:
    """Shale's replay: the topic produced first, then ``shale run`` started cold on it."""
    topic, port, file, secret, config, _ = _prepare("replay", {}, bootstrap, bucket, work, partitions, parser=parser)
    progress(f"replay: producing {changes:,} changes over {keys:,} keys")
    deletes = produce_all(bootstrap, topic, changes, keys)
    expected = expected_of(topic)
    progress(f"replay: {len(expected):,} latest rows in the topic; starting shale run on it")
    began = time.monotonic()
    with deployment(file, work, secret, 1 + len(config.run.ingest_groups) + config.run.compaction_workers) as run:
        started = time.monotonic() - began
        token = (work / "metastore" / "admin.token").read_text().strip()
        client = MetastoreClient([f"http://127.0.0.1:{port}"], deadline=30, token=token)
        _wait(lambda: sum(o.committed_end for o in client.offsets("partition") if o.topic == topic) == changes,
              3600, "the partition group to commit the whole topic", run)
        committed = time.monotonic() - began
        os.environ["SHALE_BUCKET__SECRET_ACCESS_KEY"] = secret  # the read loads the same config file
        PROCESS_READS.clear()  # a new process's read: the whole history
        table = read(file, tenant=TENANT, latest=True, columns=["key", "v"])
        seconds = time.monotonic() - began
        read_seconds = seconds - committed
    check_rows(rows_of(table), expected, "Shale")
    return {"seconds": round(seconds, 1), "started_s": round(started, 1), "committed_s": round(committed, 1),
            "read_s": round(read_seconds, 1), "changes": changes, "deletes": deletes, "rows": table.num_rows,
            "topic": topic, "expected": expected}


def _merge_batch(batch: Any, batch_id: int) -> None:
    """One micro-batch: the last change per key, merged into the table."""
    from pyspark.sql import functions as f

    latest = (batch.groupBy("key").agg(f.max_by(f.struct("v", "deleted"), "offset").alias("c"))
              .select("key", "c.v", "c.deleted"))
    latest.createOrReplaceTempView("changes")
    latest.sparkSession.sql(
        "MERGE INTO merge.bench.latest t USING changes s ON t.key = s.key "
        "WHEN MATCHED AND s.deleted THEN DELETE "
        "WHEN MATCHED THEN UPDATE SET t.v = s.v "
        "WHEN NOT MATCHED AND NOT s.deleted THEN INSERT (key, v) VALUES (s.key, s.v)")


def spark_merge_replay(bootstrap: str, bucket: BucketConfig, work: Path, topic: str, changes: int,
                       expected: dict[bytes, str]) -> dict[str, Any]:
    """Spark Structured Streaming's ``foreachBatch`` + ``MERGE INTO``, started cold on the full topic."""
    from pyspark.sql import functions as f

    from shale.spark import spark_session

    work.mkdir(parents=True, exist_ok=True)
    jars = ",".join([connector_conf()["spark.jars"], *(str(p) for p in iceberg_jars())])
    catalog = sink_catalog_conf("merge", work / "catalog.db", f"{bucket.url}/merge-warehouse", bucket)
    began = time.monotonic()
    spark = spark_session("shale-bench-merge-into", SparkConfig(master="local[2]"), extra_conf={
        "spark.jars": jars, **catalog,
        "spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"})
    try:
        spark.sql("CREATE NAMESPACE IF NOT EXISTS merge.bench")
        spark.sql("CREATE TABLE merge.bench.latest (key string, v string) USING iceberg TBLPROPERTIES ("
                  "'format-version'='2', 'write.merge.mode'='merge-on-read', 'write.update.mode'='merge-on-read', "
                  "'write.delete.mode'='merge-on-read')")
        changes_df = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
                      .option("subscribe", topic).option("startingOffsets", "earliest")
                      .option("maxOffsetsPerTrigger", str(MERGE_BATCH)).load()
                      .select(f.col("key").cast("string").alias("key"),
                              f.get_json_object(f.col("value").cast("string"), "$.v").alias("v"),
                              f.col("value").isNull().alias("deleted"), "offset"))
        query = (changes_df.writeStream.foreachBatch(_merge_batch)
                 .option("checkpointLocation", str(work / "checkpoint")).trigger(availableNow=True).start())
        query.awaitTermination()
        seconds = time.monotonic() - began
        batches = len(query.recentProgress)
        rows = {r["key"].encode(): r["v"] for r in spark.table("merge.bench.latest").collect()}
    finally:
        spark.stop()
    check_rows(rows, expected, "Spark's MERGE INTO")
    return {"seconds": round(seconds, 1), "changes": changes, "rows": len(rows), "batches": batches}


def run(bootstrap: str, bucket: BucketConfig, work: Path, parser: list[str], partitions: int, keys: int,
        expected_of: Any) -> dict[str, Any]:
    """Both replays, Shale's first; their figures."""
    shale = shale_replay(bootstrap, bucket, work / "shale", parser, partitions, CHANGES, keys, expected_of)
    progress(f"replay: Shale {shale['seconds']} s; Spark's foreachBatch + MERGE INTO on the same topic")
    expected = shale.pop("expected")
    spark = spark_merge_replay(bootstrap, bucket, work / "spark", shale["topic"], CHANGES, expected)
    progress(f"replay: Spark {spark['seconds']} s")
    return {"shale": shale, "spark": spark,
            "ratio": round((CHANGES / shale["seconds"]) / (CHANGES / spark["seconds"]), 2)}


