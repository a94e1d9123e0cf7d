"""Backup-group ingest of the same 1,000,000 records on a Spark standalone cluster and in local mode, in the same
run.

One topic of 4 partitions holds 1,000,000 records (real Loghub lines, cycled: about 110 bytes each, as in the
ingest benchmark). Shale's backup group ingests the whole topic into MinIO with
``IngestJob(config, "backup").run(available_now=True)`` (batches of at most 500,000 records, an embedded
metastore), once in local mode (``local[2]``: the driver's JVM runs two task threads) and once on a standalone
cluster started from the pyspark package (a master and two workers of one core each; each executor is its own JVM;
the driver stays in the benchmark process: client mode). Both have two task slots on this 2-core machine, so
the ratio is the cluster's overhead (executor JVMs beside the driver's, tasks and results over the network, the
connector jars served by the driver), not a speed-up.

Each run is its own process and Spark application. Before the timed ingest it ingests a 200,000-record warm-up
topic the same way, untimed for the ratio: fresh executor JVMs compile the Kafka-to-Arrow path on their first
batch (in a first version without it, the cluster's first 500,000-record batch took twice as long as local
mode's, its second 20 % longer), which a long-running ingest pays once. The warm-up ingests' rates are reported
too (``warmup_records_per_s_*``: cold JVMs, query start included). The modes alternate over three rounds and the
fastest run of each is reported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from tests.integration.ingest_helpers import create_topic

from bench.common import ROOT, progress, write_result
from bench.ingest import PARTITIONS, RECORDS, produce_records, timed_backup_ingest
from bench.services import kafka_broker, minio_bucket
from shale.config import BucketConfig, IngestConfig, ShaleConfig, SparkConfig
from shale.dev import SparkStandalone, connector_conf, driver_conf
from shale.spark import spark_session

BATCH = 500_000
WARMUP_RECORDS = 200_000
ROUNDS = 3
WORKERS = 2
TOPIC, WARMUP_TOPIC = "bench", "warmup"
BUCKET_ENV = "SHALE_BENCH_BUCKET"


def _ingest(spark: Any, config: ShaleConfig, topic: str, bucket: BucketConfig, work: Path, expected: int) -> float:
    config = config.model_copy(update={
        "bucket": bucket, "metastore": config.metastore.model_copy(update={"data_dir": str(work / "metastore")}),
        "ingest": config.ingest.model_copy(update={"topics": [topic]})})
    return timed_backup_ingest(spark, config, expected)


def measure(master: str, bootstrap: str, bucket: BucketConfig, work: Path) -> dict[str, float]:
    """The warm-up ingest, then the timed ingest of the whole topic, in this process; their seconds."""
    conf = connector_conf() if master.startswith("local") else {**connector_conf(), **driver_conf()}
    config = ShaleConfig(kafka={"bootstrap_servers": bootstrap},  # type: ignore[arg-type]
                         spark=SparkConfig(master=master, conf=conf), ingest=IngestConfig(max_records_per_batch=BATCH))
    spark = spark_session("shale-bench-cluster", config.spark, bucket=bucket)
    spark.range(0, 4000, 1, 8).mapInArrow(lambda it: it, "id long").count()  # executors and Python workers up
    warmup = _ingest(spark, config, WARMUP_TOPIC, bucket.model_copy(update={"url": f"{bucket.url}/warmup"}),
                     work / "warmup", WARMUP_RECORDS)
    seconds = _ingest(spark, config, TOPIC, bucket, work / "timed", RECORDS)
    spark.stop()
    return {"warmup_seconds": warmup, "seconds": seconds}


def _run_measure(master: str, bootstrap: str, bucket: BucketConfig, work: Path) -> dict[str, float]:
    # The bucket, secret key included, goes through the environment: never on a command line (or masked).
    secret = {**bucket.model_dump(mode="json"), "secret_access_key": bucket.secret_access_key.get_secret_value()}
    command = [sys.executable, "-m", "bench.cluster", master, bootstrap, str(work)]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False,
                          env={**os.environ, BUCKET_ENV: json.dumps(secret)})
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:4])} failed:\n{(proc.stdout + proc.stderr)[-4000:]}")
    result: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def run() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="shale-bench-cluster-") as tmp, kafka_broker() as broker:
        work = Path(tmp)
        for topic in (TOPIC, WARMUP_TOPIC):
            create_topic(broker.bootstrap_servers, topic, PARTITIONS)
        progress(f"producing {RECORDS:,} records (and {WARMUP_RECORDS:,} to warm up with)")
        size = produce_records(broker.bootstrap_servers, TOPIC)
        produce_records(broker.bootstrap_servers, WARMUP_TOPIC, WARMUP_RECORDS)
        progress(f"starting a Spark standalone master and {WORKERS} one-core workers")
        cluster = SparkStandalone(work / "spark", workers=WORKERS).start()
        runs: dict[str, list[dict[str, float]]] = {"cluster": [], "local": []}
        try:
            with minio_bucket() as bucket:
                for attempt in range(ROUNDS):
                    for mode, master in (("local", "local[2]"), ("cluster", cluster.master_url)):
                        progress(f"round {attempt + 1}/{ROUNDS}: backup group ingest, {mode} ({master})")
                        run_bucket = bucket.model_copy(update={"url": f"{bucket.url}/{mode}{attempt}"})
                        runs[mode].append(_run_measure(master, broker.bootstrap_servers, run_bucket,
                                                       work / f"{mode}{attempt}"))
        finally:
            cluster.stop()
    best = {mode: min(r["seconds"] for r in results) for mode, results in runs.items()}
    warm = {mode: min(r["warmup_seconds"] for r in results) for mode, results in runs.items()}
    return write_result(
        "cluster",
        figures={"records_per_s_cluster": round(RECORDS / best["cluster"]),
                 "records_per_s_local": round(RECORDS / best["local"]),
                 "warmup_records_per_s_cluster": round(WARMUP_RECORDS / warm["cluster"]),
                 "warmup_records_per_s_local": round(WARMUP_RECORDS / warm["local"]),
                 "records": RECORDS, "value_mb": round(size / 1e6, 1), "workers": WORKERS},
        baseline={"records_per_s_local": round(RECORDS / best["local"])},
        ratios={"cluster_vs_local": round(best["local"] / best["cluster"], 2)},
        notes=__doc__ or "",
    )


if __name__ == "__main__":
    master_url, servers, folder = sys.argv[1:4]
    print(json.dumps(measure(master_url, servers, BucketConfig.model_validate_json(os.environ[BUCKET_ENV]),
                             Path(folder))))
