"""Helpers of the tests on the Spark standalone cluster: Shale commands as their own processes (one SparkContext
per process, so every command is a separate Spark application, as in production), records read back from the
bucket alone, and the data source read in a separate process.

``python -m tests.integration.cluster_helpers CONFIG OUT TENANT SELECTOR`` reads through
``spark.read.format("shale")`` with the configuration's Spark master and writes the rows and what the executors
saw (interpreter, pids) to ``OUT`` as JSON.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from shale.block import BlockFetcher, BlockMeta, BlockState, read_dataset
from shale.config import BucketConfig
from shale.objstore import open_bucket
from shale.process import ManagedProcess

ROOT = Path(__file__).resolve().parents[2]
LOOPBACK_WARNING = "resolves to a loopback address"
Record = tuple[tuple[str, Any], ...]


def shale_process(config: Path, args: list[str], log: Path, failpoints: str = "",
                  failpoint_dir: Path | None = None) -> ManagedProcess:
    """Start ``shale --config CONFIG ARGS...`` with the failpoints given (and none inherited)."""
    env = dict(os.environ)
    for name in ("SHALE_FAILPOINTS", "SHALE_FAILPOINT_DIR", "SPARK_LOCAL_IP", "PYSPARK_PYTHON"):
        env.pop(name, None)  # this test process's own Spark settings must not leak into the command's
    if failpoints:
        env.update(SHALE_FAILPOINTS=failpoints, SHALE_FAILPOINT_DIR=str(failpoint_dir))
    process = ManagedProcess(args[0], [sys.executable, "-m", "shale.cli", "--config", str(config), *args], log,
                             env=env, cwd=ROOT)
    process.start()
    return process


def finished(process: ManagedProcess, timeout: float = 600, codes: tuple[int, ...] = (0,)) -> str:
    """Wait for the command to exit 0 (or one of ``codes``); return its log. Its Spark driver must not warn about a
    loopback hostname."""
    assert process.popen is not None
    code = process.popen.wait(timeout=timeout)
    text = process.log_path.read_text(errors="replace")
    assert code in codes, f"{process.name} failed ({code}):\n{text[-5000:]}"
    assert LOOPBACK_WARNING not in text
    return text


def run_shale(config: Path, args: list[str], log: Path, timeout: float = 600, codes: tuple[int, ...] = (0,)) -> str:
    return finished(shale_process(config, args, log), timeout, codes)


def executor_lost(log: str) -> bool:
    """Whether the driver saw an executor die under a running task (Spark then reruns the task elsewhere)."""
    return "ExecutorLostFailure" in log or "Lost executor" in log


def healthy_blocks(bucket_config: BucketConfig) -> list[BlockMeta]:
    """Every block a bucket scanner reads: complete, not marked, not overlapped by a compacted block."""
    bucket = open_bucket(bucket_config)
    fetcher = BlockFetcher(bucket, sync_delay=0)
    return [m for tenant in fetcher.tenants() for m in fetcher.sync(tenant).metas(BlockState.HEALTHY)]


def bucket_records(bucket_config: BucketConfig, group: str, generation: int = 1,
                   kind: str = "records") -> Counter[Record]:
    """The multiset of records of a group's healthy blocks, read from the bucket alone (every column but headers,
    which are lists; a record's identity and content are in the rest)."""
    bucket = open_bucket(bucket_config)
    out: Counter[Record] = Counter()
    for meta in healthy_blocks(bucket_config):
        if meta.group != group or meta.generation != generation:
            continue
        for dataset in meta.datasets:
            if dataset.kind == kind:
                table = read_dataset(bucket, meta, dataset)
                names = sorted(n for n in table.column_names if n != "headers")
                out.update(tuple(zip(names, values, strict=True))
                           for values in zip(*(table.column(n).to_pylist() for n in names), strict=True))
    return out


def offsets(records: Counter[Record]) -> Counter[tuple[object, object, object]]:
    """How many times each Kafka record (topic, partition, offset) is stored."""
    out: Counter[tuple[object, object, object]] = Counter()
    for record, count in records.items():
        fields = dict(record)
        out[(fields["topic"], fields["partition"], fields["offset"])] += count
    return out


def read_with_data_source(config: Path, tenant: str, selector: str, work: Path) -> dict[str, Any]:
    """Run this module in its own process (its own Spark application) and return what it wrote."""
    out = work.with_suffix(".json")
    process = ManagedProcess("read", [sys.executable, "-m", "tests.integration.cluster_helpers", str(config),
                                      str(out), tenant, selector], work.with_suffix(".log"), cwd=ROOT)
    process.start()
    finished(process)
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def _read_with_data_source(config: str, out: str, tenant: str, selector: str) -> None:
    from shale.config import load_config
    from shale.query.datasource import register
    from shale.spark import spark_session

    settings = load_config(config)
    spark = spark_session("shale-read", settings.spark, kafka=False, bucket=settings.bucket)
    register(spark)
    rows = (spark.read.format("shale").option("config", config).option("tenant", tenant)
            .option("selector", selector).option("from", "0").option("to", "now").load()
            .select("topic", "partition", "offset", "level", "msg").collect())

    def where(_: Any) -> Any:
        """This Python worker's interpreter and the host its executor JVM (an ancestor process) was started for."""
        pid, host = os.getppid(), ""
        while pid > 1 and not host:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if b"org.apache.spark.executor.CoarseGrainedExecutorBackend" in args:
                host = args[args.index(b"--hostname") + 1].decode()
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        yield (sys.executable, host)

    seen = spark.sparkContext.parallelize(range(8), 8).mapPartitions(where).collect()
    executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1  # the driver is listed too
    Path(out).write_text(json.dumps({"rows": [list(r) for r in rows], "python_workers": seen,
                                     "executors": executors, "master": spark.sparkContext.master}))
    spark.stop()


if __name__ == "__main__":
    _read_with_data_source(*sys.argv[1:5])
