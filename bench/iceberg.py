"""Iceberg publishing lag under ingest load, and Spark SQL reading one hour through Iceberg against the ``shale``
data source, in the same run.

One topic of 4 partitions holds 500,000 JSON records (a Loghub line, a level, and an event time spread over three
hours). The partition group ingests it with ``availableNow`` in batches of 25,000 records (20 commits, each with
a block per partition and day) into MinIO with the embedded metastore, while the Iceberg publisher runs beside it
as on the metastore leader (every 0.2 s). Publish lag = from ``CommitIngestBatch`` returning (the change is in the
metastore) to the Iceberg snapshot holding its blocks being committed to the catalog (visible to every engine).
Then Spark SQL reads every column of one hour of the topic through Iceberg's own Spark runtime (JDBC catalog on
the SQLite file, S3FileIO at MinIO) and through ``spark.read.format("shale")``, three interleaved rounds, the
faster of each reported; both return the same row count (checked).
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from tests.integration.ingest_helpers import create_topic, toml_value

from bench.common import progress, timed, write_result
from bench.services import kafka_broker, minio_bucket
from shale.config import ShaleConfig, SparkConfig
from shale.demo import LOGHUB_FORMATS, loghub_lines
from shale.iceberg import IcebergPublisher, spark_catalog_conf
from shale.ingest.job import IngestJob
from shale.metastore import MetastoreService, SingleNodeLog, StateMachine
from shale.objstore import open_bucket
from shale.query.datasource import register
from shale.spark import spark_session

RECORDS = 500_000
PARTITIONS = 4
BATCH = 25_000
ROUNDS = 3
HOUR = 3_600_000
T0 = 1_795_000_000_000 - 1_795_000_000_000 % HOUR


def _produce(bootstrap: str, topic: str) -> None:
    lines = [line.decode() if isinstance(line, bytes) else line for f in LOGHUB_FORMATS for line in loghub_lines(f)]
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.size": 1_000_000,
                         "compression.type": "lz4", "queue.buffering.max.messages": 500_000})
    for i in range(RECORDS):
        value = json.dumps({"ts": T0 + i * (3 * HOUR) // RECORDS, "level": ["INFO", "WARN", "ERROR"][i % 3],
                            "msg": lines[i % len(lines)]})
        while True:
            try:
                producer.produce(topic, value.encode(), partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.1)
    producer.flush()


class _Timed(MetastoreService):
    """The embedded metastore, noting when each block's commit returned."""

    committed: dict[str, float]

    def submit(self, command: Any) -> Any:
        result = super().submit(command)
        for block in getattr(command, "blocks", []):
            self.committed.setdefault(block.id, time.monotonic())
        return result


class _Publisher(IcebergPublisher):
    """The publisher, noting when each block's snapshot was committed to the catalog."""

    visible: dict[str, float]

    def _commit(self, key: Any, state: Any, index: int, remove: list[str], add: list[Any]) -> int:
        done = super()._commit(key, state, index, remove, add)
        now = time.monotonic()
        for spec in add:
            self.visible.setdefault(spec.block_id, now)
        return done


def _percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p * (len(ordered) - 1)))]


def run() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="shale-bench-iceberg-") as tmp, kafka_broker() as broker, \
            minio_bucket() as bucket:
        work = Path(tmp)
        topic = "bench"
        create_topic(broker.bootstrap_servers, topic, PARTITIONS)
        progress(f"producing {RECORDS:,} records")
        _produce(broker.bootstrap_servers, topic)
        config = ShaleConfig.model_validate({
            "bucket": bucket.model_dump(), "kafka": {"bootstrap_servers": broker.bootstrap_servers},
            "metastore": {"data_dir": str(work / "metastore")},
            "ingest": {"topics": [topic], "max_records_per_batch": BATCH,
                       "parsers": [{"parser": "json", "options": {"time_field": "ts", "time_format": "epoch_ms",
                                                                  "label_fields": ["level"], "fields": ["msg"]}}]},
            "iceberg": {"enabled": True, "catalog_uri": f"sqlite:///{work}/catalog.db", "interval": 0.2}})
        config_file = work / "shale.toml"
        _write_toml(config, config_file)
        from shale.dev.fetch import iceberg_jars, spark_connector_jars

        jars = ",".join(str(p) for p in [*spark_connector_jars(), *iceberg_jars()])
        spark = spark_session("shale-bench-iceberg", SparkConfig(master="local[2]"), kafka=False,
                              extra_conf={"spark.jars": jars, **spark_catalog_conf(config)})
        register(spark)
        state = StateMachine(work / "metastore" / "state.db")
        service = _Timed(state, SingleNodeLog(state))
        service.committed = {}
        publisher = _Publisher(config, state.reader, service.submit, open_bucket(config.bucket))
        publisher.visible = {}
        stop = threading.Event()
        thread = threading.Thread(target=publisher.loop, args=(stop,), daemon=True)
        thread.start()
        progress("ingesting (partition group) with the publisher running beside it")
        job = IngestJob(config, "partition", spark=spark, metastore=service)
        with timed() as ingest_time:
            job.run(available_now=True)
        deadline = time.monotonic() + 120
        while set(service.committed) - set(publisher.visible) and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.set()
        thread.join()
        lags = [publisher.visible[b] - t for b, t in service.committed.items() if b in publisher.visible]
        assert len(lags) == len(service.committed), "some committed blocks never became visible"
        start, end = T0 + HOUR, T0 + 2 * HOUR - 1
        iceberg_sql = (f"SELECT * FROM {config.iceberg.catalog_name}.default.{topic} "
                       f"WHERE event_time >= timestamp_millis({start}) AND event_time <= timestamp_millis({end})")
        through_iceberg, through_shale = [], []
        for attempt in range(ROUNDS):
            progress(f"round {attempt + 1}/{ROUNDS}: one hour through Iceberg, then through the shale source")
            with timed() as t:
                rows_iceberg = spark.sql(iceberg_sql).count()
                spark.sql(iceberg_sql).write.format("noop").mode("overwrite").save()
            through_iceberg.append(t[0])
            with timed() as t:
                df = (spark.read.format("shale").option("tenant", "default").option("from", str(start))
                      .option("to", str(end)).option("config", str(config_file)).load())
                rows_shale = df.count()
                df.write.format("noop").mode("overwrite").save()
            through_shale.append(t[0])
            assert rows_iceberg == rows_shale > 0, (rows_iceberg, rows_shale)
        spark.stop()
    figures = {"publish_lag_p50_s": round(_percentile(lags, 0.5), 3), "publish_lag_p99_s": round(
        _percentile(lags, 0.99), 3), "commits": float(len({round(t, 3) for t in service.committed.values()})),
        "ingest_s": round(ingest_time[0], 1), "hour_via_iceberg_s": round(min(through_iceberg), 2)}
    baseline = {"hour_via_shale_source_s": round(min(through_shale), 2)}
    ratios = {"iceberg_vs_shale_source": round(min(through_iceberg) / min(through_shale), 2)}
    return write_result("iceberg", figures, baseline, ratios, __doc__ or "")


def _write_toml(config: ShaleConfig, path: Path) -> None:
    data = config.model_dump(mode="json", include={"bucket", "metastore", "iceberg", "ingest"})
    data["bucket"].pop("retry")
    data["bucket"]["secret_access_key"] = config.bucket.secret_access_key.get_secret_value()  # dumped masked
    lines = []
    for section, values in data.items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {toml_value(v)}" for k, v in values.items()
                  if v not in ({}, [], None) and k not in ("parsers", "tenants")]
    path.write_text("\n".join(lines) + "\n")

