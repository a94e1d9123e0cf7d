"""Backup-group ingest of the same 1,000,000 records on a Spark standalone cluster and in local mode, in the same
run.

One topic of 4 partitions holds 1,000,000 records (real Loghub lines, cycled: about 110 bytes each, as in the
ingest benchmark). Shale's backup group ingests the whole topic into MinIO with
``IngestJob(config, "backup").run(available_now=True)`` (batches of at most 500,000 records, an embedded
metastore), once in local mode (``local[2]``: the driver's JVM runs two task threads) and once on a standalone
cluster started from the pyspark package (a master and two workers of one core each; each executor is its own JVM;
the driver stays in the benchmark process: client mode). Both have two task slots on this 2-core machine, so
the ratio is the cluster's overhead (executor JVMs beside the driver's, tasks and results over the network, the
connector jars served by the driver), not a speed-up. Each run is its own process and Spark application, timed
from the job's start to its end (session start-up and the executors' Python-worker warm-up are excluded from
both); the modes alternate over three rounds and the fastest run of each is reported.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from tests.integration.ingest_helpers import create_topic

from bench.common import ROOT, progress, timed, write_result
from bench.ingest import PARTITIONS, RECORDS, produce_records
from bench.services import kafka_broker, minio_bucket
from shale.config import BucketConfig, IngestConfig, ShaleConfig, SparkConfig
from shale.dev import SparkStandalone, connector_conf, driver_conf
from shale.ingest.job import IngestJob
from shale.metastore import open_metastore
from shale.spark import spark_session

BATCH = 500_000
ROUNDS = 3
WORKERS = 2


def measure(master: str, bootstrap: str, topic: str, bucket: BucketConfig, work: Path) -> float:
    """One ingest of the whole topic in this process; its seconds."""
    conf = connector_conf() if master.startswith("local") else {**connector_conf(), **driver_conf()}
    config = ShaleConfig(bucket=bucket, kafka={"bootstrap_servers": bootstrap},  # type: ignore[arg-type]
                         metastore={"data_dir": str(work / "metastore")},  # type: ignore[arg-type]
                         spark=SparkConfig(master=master, conf=conf),
                         ingest=IngestConfig(topics=[topic], checkpoint_dir=str(work / "checkpoints"),
                                             max_records_per_batch=BATCH))
    spark = spark_session("shale-bench-cluster", config.spark, bucket=bucket)
    spark.range(0, 4000, 1, 8).mapInArrow(lambda it: it, "id long").count()  # executors and Python workers up
    job = IngestJob(config, "backup", spark=spark, metastore=open_metastore(config))
    with timed() as t:
        job.run(available_now=True)
    committed = sum(o.committed_end for o in job.metastore.offsets("backup", 1))
    assert committed == RECORDS, committed
    spark.stop()
    return t[0]


def _run_measure(master: str, bootstrap: str, topic: str, bucket: BucketConfig, work: Path) -> float:
    command = [sys.executable, "-m", "bench.cluster", master, bootstrap, topic, bucket.model_dump_json(), str(work)]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:4])} failed:\n{(proc.stdout + proc.stderr)[-4000:]}")
    return float(json.loads(proc.stdout.strip().splitlines()[-1])["seconds"])


def run() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="shale-bench-cluster-") as tmp, kafka_broker() as broker:
        work = Path(tmp)
        topic = "bench"
        create_topic(broker.bootstrap_servers, topic, PARTITIONS)
        progress(f"producing {RECORDS:,} records")
        size = produce_records(broker.bootstrap_servers, topic)
        progress(f"starting a Spark standalone master and {WORKERS} one-core workers")
        cluster = SparkStandalone(work / "spark", workers=WORKERS).start()
        seconds: dict[str, list[float]] = {"cluster": [], "local": []}
        try:
            with minio_bucket() as bucket:
                for attempt in range(ROUNDS):
                    for mode, master in (("local", "local[2]"), ("cluster", cluster.master_url)):
                        progress(f"round {attempt + 1}/{ROUNDS}: backup group ingest, {mode} ({master})")
                        run_bucket = bucket.model_copy(update={"url": f"{bucket.url}/{mode}{attempt}"})
                        seconds[mode].append(_run_measure(master, broker.bootstrap_servers, topic, run_bucket,
                                                          work / f"{mode}{attempt}"))
        finally:
            cluster.stop()
    cluster_s, local_s = min(seconds["cluster"]), min(seconds["local"])
    return write_result(
        "cluster",
        figures={"records_per_s_cluster": round(RECORDS / cluster_s), "records_per_s_local": round(RECORDS / local_s),
                 "records": RECORDS, "value_mb": round(size / 1e6, 1), "workers": WORKERS},
        baseline={"records_per_s_local": round(RECORDS / local_s)},
        ratios={"cluster_vs_local": round(local_s / cluster_s, 2)},
        notes=__doc__ or "",
    )


if __name__ == "__main__":
    master_url, servers, name, bucket_json, folder = sys.argv[1:6]
    took = measure(master_url, servers, name, BucketConfig.model_validate_json(bucket_json), Path(folder))
    print(json.dumps({"seconds": took}))
