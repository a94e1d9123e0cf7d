"""Every Spark application of Shale on a real standalone cluster (a master and two one-core workers, each its own
JVM, on loopback): both ingest groups, reprocessing, compaction and the ``shale`` data source, run as ``shale``
commands in their own processes from a configuration that sets nothing but ``spark.master``, the connector jars on
``spark.jars`` and a loopback driver. Results are read back from the bucket alone and compared record by record
with the topic itself, read from Kafka: the same records, each stored exactly once.

(An earlier version ran the whole pipeline a second time in local mode and compared the two buckets; comparing with
the topic is stricter, since both modes could agree on a wrong answer, and costs half the time.)"""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from tests.integration.cluster_helpers import (
    Record,
    bucket_records,
    healthy_blocks,
    offsets,
    read_with_data_source,
    run_shale,
)
from tests.integration.ingest_helpers import config_of, create_topic, produce_json, write_config
from tests.waiting import eventually

from shale.config import BucketConfig
from shale.dev import MinioServer, SparkStandalone, driver_conf
from shale.metastore import open_metastore
from shale.objstore import open_bucket
from shale.query import Query, run_query

COMPACTION = '\n[compaction]\nblocks_per_job = [4]\nmax_level = 1\npoll_interval = "0.5s"\n'
JSON_OPTIONS = ['time_field="ts"', 'time_format="epoch_s"', 'label_fields=["level"]', 'fields=["msg"]']
KAFKA_KEYS = ("topic", "partition", "offset", "key", "value")
Row = tuple[Any, ...]


def _bucket(minio: MinioServer) -> BucketConfig:
    name = f"t-{uuid.uuid4().hex[:12]}"
    minio.create_bucket(name)
    return BucketConfig(url=f"s3://{name}", endpoint=minio.endpoint, access_key_id=minio.access_key,
                        secret_access_key=minio.secret_key, allow_http=True)


def _pipeline(config: Path, work: Path, topic: str) -> None:
    """Both ingest groups, then a reprocess of ``topic`` into generation 2."""
    for group in ("backup", "partition"):
        run_shale(config, ["ingest", "--group", group, "--available-now"], work / f"ingest-{group}.log")
    options = [a for option in JSON_OPTIONS for a in ("--parser-option", option)]
    run_shale(config, ["reprocess", "--tenant", "default", "--topic", topic, "--from", "0", "--to", "now",
                       "--parser", "json", "--generation", "2", *options], work / "reprocess.log")


def _topic_rows(bootstrap: str, topic: str, partitions: int) -> list[Row]:
    """Every record of ``topic`` as Kafka holds it: (topic, partition, offset, key, value)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    try:
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(partitions)}
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        rows: list[Row] = []

        def read_all() -> bool:
            for message in consumer.consume(1000, timeout=1):
                assert message.error() is None, message.error()
                rows.append((topic, message.partition(), message.offset(), message.key(), message.value()))
            return len(rows) >= sum(ends.values())

        eventually(read_all, 120, lambda: f"all {sum(ends.values())} records of {topic} (read {len(rows)})")
        return rows
    finally:
        consumer.close()


def _parsed(row: Row) -> dict[str, Any] | None:
    try:
        value = json.loads(row[4])
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _projection(records: Counter[Record], keys: tuple[str, ...]) -> Counter[Row]:
    out: Counter[Row] = Counter()
    for record, count in records.items():
        fields = dict(record)
        out[tuple(fields[k] for k in keys)] += count
    return out


def test_every_application_gives_the_topic_s_records_exactly_once_on_the_cluster(
        kafka, minio, spark_cluster: SparkStandalone, tmp_path: Path) -> None:
    run = uuid.uuid4().hex[:6]
    orders, clicks = f"orders-{run}", f"clicks-{run}"
    create_topic(kafka.bootstrap_servers, orders, 4)
    create_topic(kafka.bootstrap_servers, clicks, 2)
    counts = {orders: produce_json(kafka.bootstrap_servers, orders, 6_000, invalid_every=40, seed=1),
              clicks: produce_json(kafka.bootstrap_servers, clicks, 2_000, invalid_every=25, seed=2)}
    topic_rows = {orders: _topic_rows(kafka.bootstrap_servers, orders, 4),
                  clicks: _topic_rows(kafka.bootstrap_servers, clicks, 2)}
    everything = [row for rows in topic_rows.values() for row in rows]
    valid = [(row, value) for row in everything if (value := _parsed(row)) is not None]
    expected = {
        "backup": Counter(everything),
        "parsed": Counter((*row[:3], value["level"], value["msg"]) for row, value in valid),
        "quarantine": Counter(row for row in everything if _parsed(row) is None),
        "reprocessed": Counter((*row[:3], value["level"], value["msg"]) for row, value in valid if row[0] == orders),
    }
    assert sum(expected["parsed"].values()) == sum(c["valid"] for c in counts.values())
    assert sum(expected["quarantine"].values()) == sum(c["invalid"] for c in counts.values())

    bucket = _bucket(minio)
    config = write_config(tmp_path, kafka.bootstrap_servers, bucket, [orders, clicks],
                          spark={"master": spark_cluster.master_url, "conf": driver_conf()},
                          max_records_per_batch=2_500)
    with config.open("a") as f:
        f.write(COMPACTION)
    assert config_of(config).spark.master.startswith("spark://")

    _pipeline(config, tmp_path, orders)
    datasets = {"backup": ("backup", 1, "records", KAFKA_KEYS),
                "parsed": ("partition", 1, "records", ("topic", "partition", "offset", "level", "msg")),
                "quarantine": ("partition", 1, "quarantine", KAFKA_KEYS),
                "reprocessed": ("partition", 2, "records", ("topic", "partition", "offset", "level", "msg"))}
    before: dict[str, Counter[Record]] = {}
    for name, (group, generation, kind, keys) in datasets.items():
        before[name] = bucket_records(bucket, group, generation, kind)
        assert _projection(before[name], keys) == expected[name], name  # the topic's records, field by field
        stored = offsets(before[name])
        assert set(stored.values()) == {1}, name  # each exactly once

    run_shale(config, ["compact", "--until-idle"], tmp_path / "compact.log")
    for name, (group, generation, kind, _) in datasets.items():
        if generation == 1:
            assert bucket_records(bucket, group, generation, kind) == before[name], name  # unchanged by compaction
    for topic in (orders, clicks):
        for group in ("backup", "partition"):
            run_shale(config, ["verify", "--group", group, "--topic", topic],
                      tmp_path / f"verify-{group}-{topic}.log",
                      codes=(0, 4) if group == "partition" else (0,))  # 4: complete, invalid records quarantined
    levels = Counter((m.group, m.level) for m in healthy_blocks(bucket))
    assert sum(n for (_, level), n in levels.items() if level == 1) >= 4  # compaction did run

    # The data source on the cluster returns what the Python API (no Spark) returns from the same bucket.
    selector = f'{{topic="{orders}", level="ERROR"}}'
    read = read_with_data_source(config, "default", selector, tmp_path / "read")
    assert read["master"] == spark_cluster.master_url
    assert read["executors"] == 2  # two executor JVMs, one per worker
    assert {python for python, _ in read["python_workers"]} == {sys.executable}
    assert {host for _, host in read["python_workers"]} <= {"127.0.0.2", "127.0.0.3"}
    settings = config_of(config)
    local = run_query(Query("default", 0, int(time.time() * 1000), selector), open_metastore(settings),
                      open_bucket(settings.bucket)).read_all()
    keys = ("topic", "partition", "offset", "level", "msg")
    assert Counter(tuple(r) for r in read["rows"]) == Counter(zip(*(local.column(k).to_pylist() for k in keys),
                                                                  strict=True))
    errors = Counter(r for r in expected["parsed"] if r[0] == orders and r[3] == "ERROR")
    assert Counter(tuple(r) for r in read["rows"]) == errors  # and that is the topic's ERROR records
