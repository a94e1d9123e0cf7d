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

Each run is its own process and Spark application. It ingests the topic four times, each time into a prefix and
metastore of its own: the first two untimed (warm-up), the last two timed. The JVMs keep compiling long after
their first batch: measured per thread, the JIT compiler threads spent 2.6-3.4 CPU s of a first ingest of the
topic in local mode, 1.2-1.8 s of a third (as much as the task threads, whose rate it sets), and a cluster's two
executor JVMs each compile the same code, so a short warm-up measured the cluster's JIT rather than its
overhead (0.64x with a 200,000-record warm-up; the same runs reached 0.85x by their third ingest). A long-running
ingest pays it once. The first ingest's rate is reported too (``first_records_per_s_*``: cold JVMs, query start
included). The modes alternate over three rounds and the fastest timed ingest of each is reported.
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
from bench.ingest import PARTITIONS, RECORDS, produce_records, timed_ingest
from bench.services import kafka_broker, minio_bucket
from shale.config import BucketConfig, IngestConfig, ShaleConfig, SparkConfig
from shale.dev import SparkStandalone, connector_conf, driver_conf
from shale.spark import spark_session

BATCH = 500_000
WARMUP_INGESTS = 2
TIMED_INGESTS = 2
ROUNDS = 3
WORKERS = 2
TOPIC = "bench"
BUCKET_ENV = "SHALE_BENCH_BUCKET"


def _ingest(spark: Any, config: ShaleConfig, topic: str, bucket: BucketConfig, work: Path, expected: int) -> float:
    config = config.model_copy(update={
        "bucket": bucket, "metastore": config.metastore.model_copy(update={"data_dir": str(work / "metastore")}),
        "ingest": config.ingest.model_copy(update={"topics": [topic]})})
    return timed_ingest(spark, config, expected)


def measure(master: str, bootstrap: str, bucket: BucketConfig, work: Path) -> dict[str, Any]:
    """The untimed then the timed ingests of the whole topic, in this process; their seconds."""
    conf = connector_conf() if master.startswith("local") else {**connector_conf(), **driver_conf()}
    config = ShaleConfig(kafka={"bootstrap_servers": bootstrap},  # type: ignore[arg-type]
                         spark=SparkConfig(master=master, conf=conf), ingest=IngestConfig(max_records_per_batch=BATCH))
    spark = spark_session("shale-bench-cluster", config.spark, bucket=bucket)
    spark.range(0, 4000, 1, 8).mapInArrow(lambda it: it, "id long").count()  # executors and Python workers up
    seconds = [_ingest(spark, config, TOPIC, bucket.model_copy(update={"url": f"{bucket.url}/{i}"}), work / str(i),
                       RECORDS) for i in range(WARMUP_INGESTS + TIMED_INGESTS)]
    spark.stop()
    return {"first_seconds": seconds[0], "seconds": seconds[WARMUP_INGESTS:]}


def _run_measure(master: str, bootstrap: str, bucket: BucketConfig, work: Path) -> dict[str, Any]:
    # The bucket, secret key included, goes through the environment: never on a command line (or masked).
    secret = {**bucket.model_dump(mode="json"), "secret_access_key": bucket.secret_access_key.get_secret_value()}
    command = [sys.executable, "-m", "bench.cluster", master, bootstrap, str(work)]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False,
                          env={**os.environ, BUCKET_ENV: json.dumps(secret)})
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:4])} failed:\n{(proc.stdout + proc.stderr)[-4000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def run() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="shale-bench-cluster-") as tmp, kafka_broker() as broker:
        work = Path(tmp)
        create_topic(broker.bootstrap_servers, TOPIC, PARTITIONS)
        progress(f"producing {RECORDS:,} records")
        size = produce_records(broker.bootstrap_servers, TOPIC)
        progress(f"starting a Spark standalone master and {WORKERS} one-core workers")
        cluster = SparkStandalone(work / "spark", workers=WORKERS).start()
        runs: dict[str, list[dict[str, Any]]] = {"cluster": [], "local": []}
        try:
            with minio_bucket() as bucket:
                for attempt in range(ROUNDS):
                    for mode, master in (("local", "local[2]"), ("cluster", cluster.master_url)):
                        progress(f"round {attempt + 1}/{ROUNDS}: backup group ingest, {mode} ({master}), "
                                 f"{WARMUP_INGESTS} untimed and {TIMED_INGESTS} timed")
                        run_bucket = bucket.model_copy(update={"url": f"{bucket.url}/{mode}{attempt}"})
                        runs[mode].append(_run_measure(master, broker.bootstrap_servers, run_bucket,
                                                       work / f"{mode}{attempt}"))
        finally:
            cluster.stop()
    best = {mode: min(s for r in results for s in r["seconds"]) for mode, results in runs.items()}
    first = {mode: min(r["first_seconds"] for r in results) for mode, results in runs.items()}
    return write_result(
        "cluster",
        figures={"records_per_s_cluster": round(RECORDS / best["cluster"]),
                 "records_per_s_local": round(RECORDS / best["local"]),
                 "first_records_per_s_cluster": round(RECORDS / first["cluster"]),
                 "first_records_per_s_local": round(RECORDS / first["local"]),
                 "records": RECORDS, "value_mb": round(size / 1e6, 1), "workers": WORKERS},
        baseline={"records_per_s_local": round(RECORDS / best["local"])},
        ratios={"cluster_vs_local": round(best["local"] / best["cluster"], 2)},
        notes=__doc__ or "",
    )


if __name__ == "__main__":
    master_url, servers, folder = sys.argv[1:4]
    print(json.dumps(measure(master_url, servers, BucketConfig.model_validate_json(os.environ[BUCKET_ENV]),
                             Path(folder))))
