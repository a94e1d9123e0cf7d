"""Iceberg publishing lag under ingest load, through the SQL catalog and through a REST catalog in the same run, and
Spark SQL reading one hour through Iceberg against the ``shale`` data source, in the same run.

One topic of 4 partitions holds 500,000 JSON records (a Loghub line, a level, and an event time spread over three
hours). The partition group ingests it with ``availableNow`` in batches of 25,000 records (20 commits, each with
a block per partition and day) into MinIO with the embedded metastore, while two Iceberg publishers run beside it
as on the metastore leader (every 0.2 s each): one into the SQL catalog (a SQLite file), one into Apache Iceberg
1.11's REST catalog server (``shale.dev.iceberg_rest``, on loopback, its warehouse in the same bucket, an OAuth2
client credential). Both read the one change feed, which is trimmed only through what both have published.
Publish lag = from ``CommitIngestBatch`` returning (the change is in the metastore) to the Iceberg snapshot holding
its blocks being committed to the catalog (visible to every engine); the REST lag is reported against the SQL
catalog's (the baseline's ratio). Then Spark SQL reads every column of one hour of the topic through Iceberg's own
Spark runtime (JDBC catalog on the SQLite file, S3FileIO at MinIO) and through ``spark.read.format("shale")``,
three interleaved rounds, the faster of each reported; both return the same row count (checked), and the REST
catalog's table holds the same rows (checked with pyiceberg).
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from tests.integration.ingest_helpers import create_topic, toml_value

from bench.common import progress, timed, write_result
from bench.services import iceberg_rest_catalog, kafka_broker, minio_bucket
from shale.config import ShaleConfig, SparkConfig
from shale.demo import LOGHUB_FORMATS, loghub_lines
from shale.iceberg import IcebergPublisher, open_catalog, spark_catalog_conf
from shale.ingest.job import IngestJob
from shale.metastore import MetastoreService, SingleNodeLog, StateMachine
from shale.metastore.rules.commands import Result, TrimBlockChanges
from shale.objstore import open_bucket
from shale.query.datasource import register
from shale.spark import spark_session

RECORDS = 500_000
PARTITIONS = 4
BATCH = 25_000
ROUNDS = 3
HOUR = 3_600_000
CREDENTIAL = "shale-bench:rest-bench-secret"
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

    def _commit(self, key: Any, state: Any, index: int, remove: list[str], add: list[Any],
                erased: Any = None) -> int:
        done = super()._commit(key, state, index, remove, add, erased)
        now = time.monotonic()
        for spec in add:
            self.visible.setdefault(spec.block_id, now)
        return done


class _Trims:
    """The two publishers share one change feed: it is trimmed only through what both have published (a publisher
    reading entries again skips those its table already records)."""

    def __init__(self, service: MetastoreService, names: tuple[str, ...]) -> None:
        self.service = service
        self.through = dict.fromkeys(names, 0)
        self.lock = threading.Lock()

    def submit(self, name: str) -> Any:
        def submit(command: Any) -> Result:
            if not isinstance(command, TrimBlockChanges):
                return self.service.submit(command)
            with self.lock:
                low = min(self.through.values())
                self.through[name] = command.through
                if min(self.through.values()) <= low:
                    return Result(ok=True, data={"trimmed": 0})
                return self.service.submit(TrimBlockChanges(through=min(self.through.values())))
        return submit


def _percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p * (len(ordered) - 1)))]


def run() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="shale-bench-iceberg-") as tmp, kafka_broker() as broker, \
            minio_bucket() as bucket, contextlib.ExitStack() as stack:
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
        catalog = stack.enter_context(iceberg_rest_catalog(bucket, work / "rest"))
        rest = config.model_copy(update={"iceberg": type(config.iceberg).model_validate({
            **config.iceberg.model_dump(), "catalog": "rest", "catalog_uri": catalog.url, "credential": CREDENTIAL,
            "oauth2_server_uri": f"{catalog.url}/v1/oauth/tokens"})})
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
        trims = _Trims(service, ("sql", "rest"))
        publishers = {name: _Publisher(c, state.reader, trims.submit(name), open_bucket(c.bucket))
                      for name, c in (("sql", config), ("rest", rest))}
        stop = threading.Event()
        threads = []
        for publisher in publishers.values():
            publisher.visible = {}
            threads.append(threading.Thread(target=publisher.loop, args=(stop,), daemon=True))
            threads[-1].start()
        progress("ingesting (partition group) with the SQL and REST catalogs' publishers running beside it")
        job = IngestJob(config, "partition", spark=spark, metastore=service)
        with timed() as ingest_time:
            job.run(available_now=True)
        deadline = time.monotonic() + 120
        while any(set(service.committed) - set(p.visible) for p in publishers.values()) and \
                time.monotonic() < deadline:
            time.sleep(0.05)
        stop.set()
        for thread in threads:
            thread.join()
        lags = {name: [p.visible[b] - t for b, t in service.committed.items() if b in p.visible]
                for name, p in publishers.items()}
        for name, values in lags.items():
            assert len(values) == len(service.committed), f"{name}: some committed blocks never became visible"
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
        sql_rows, rest_rows = (open_catalog(c).load_table(("default", topic)).scan().count() for c in (config, rest))
        assert sql_rows == rest_rows == RECORDS, (sql_rows, rest_rows)
    p = {(name, q): round(_percentile(values, q), 3) for name, values in lags.items() for q in (0.5, 0.99)}
    figures = {"publish_lag_p50_s": p["sql", 0.5], "publish_lag_p99_s": p["sql", 0.99],
               "rest_publish_lag_p50_s": p["rest", 0.5], "rest_publish_lag_p99_s": p["rest", 0.99],
               "commits": float(len({round(t, 3) for t in service.committed.values()})),
               "ingest_s": round(ingest_time[0], 1), "hour_via_iceberg_s": round(min(through_iceberg), 2)}
    baseline = {"hour_via_shale_source_s": round(min(through_shale), 2), "sql_publish_lag_p50_s": p["sql", 0.5],
                "sql_publish_lag_p99_s": p["sql", 0.99]}
    ratios = {"iceberg_vs_shale_source": round(min(through_iceberg) / min(through_shale), 2),
              "rest_vs_sql_publish_lag_p50": round(p["rest", 0.5] / p["sql", 0.5], 2),
              "rest_vs_sql_publish_lag_p99": round(p["rest", 0.99] / p["sql", 0.99], 2)}
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

