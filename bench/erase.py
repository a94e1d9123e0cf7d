"""A one-key erasure over a month of a topic, against a full rewrite of the topic by Spark, in one run on MinIO.

720 compacted backup blocks (30 days of hourly blocks, 2,000 records each, 1.44 million records, keys drawn from
200,000 customers) are committed to an embedded metastore; one customer's key appears in three records, in three
blocks. Shale's erasure (``shale.erase.erase`` then a compaction worker on Spark, ``local[2]``) commits the request,
scans the backup blocks (each data object's key bloom filter first, the key column only of those it does not rule
out), plans the erase jobs and rewrites the blocks that hold the key under the compaction service's leases; timed
until the erasure is ``rewritten`` in the index. The baseline, what an erasure without an index or filters has to
do, is a Spark job (the same ``local[2]`` session) whose tasks read every block's data object, drop the key's rows
and write every block again (zstd Parquet), without any metadata or commit. ``blocks_opened`` counts the blocks
whose data (not only the footer and filters) was read. Then the leftover scan every receipt runs
(``shale.erase.leftover``): every object under the tenant's prefixes, by the key's hash (no bloom filter).
"""

from __future__ import annotations

import hashlib
import io
import json
import random
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bench.common import progress, timed, write_result
from bench.services import minio_bucket
from shale.block import (
    BlockMeta,
    BlockSpec,
    DatasetInput,
    KafkaRange,
    deterministic_block_id,
    read_dataset,
    write_block,
)
from shale.block.schemas import BACKUP_SCHEMA
from shale.compactor.worker import CompactionWorker
from shale.config import BucketConfig, CompactionConfig, ShaleConfig, SparkConfig
from shale.erase import ErasureRequest, Needle, erase, erasure_status, scan_leftovers
from shale.metastore import AddBlocks, MetastoreService, open_metastore
from shale.objstore import ObstoreBucket, open_bucket, task_bucket
from shale.spark import spark_session

DAYS, BLOCKS_PER_DAY, RECORDS = 30, 24, 2000
BLOCKS = DAYS * BLOCKS_PER_DAY
CUSTOMERS = 200_000
KEY = b"customer-erase-me"
HOLDERS = (3 * BLOCKS_PER_DAY + 5, 14 * BLOCKS_PER_DAY + 11, 27 * BLOCKS_PER_DAY + 20)
START_MS = 1_795_000_000_000 - 1_795_000_000_000 % 86_400_000
HOUR_MS = 3_600_000


def _block(bucket: ObstoreBucket, i: int) -> BlockMeta:
    rng = random.Random(i)
    partition, start = i % 4, (i // 4) * RECORDS
    keys = [f"customer-{rng.randrange(CUSTOMERS)}".encode() for _ in range(RECORDS)]
    if i in HOLDERS:
        keys[RECORDS // 2] = KEY
    times = [START_MS + i * HOUR_MS + j * (HOUR_MS // RECORDS) for j in range(RECORDS)]
    table = pa.table({
        "topic": ["billing"] * RECORDS,
        "partition": pa.array([partition] * RECORDS, pa.int32()),
        "offset": pa.array(range(start, start + RECORDS), pa.int64()),
        "timestamp": pa.array(times, pa.timestamp("ms", tz="UTC")),
        "timestamp_type": pa.array([0] * RECORDS, pa.int8()),
        "key": pa.array(keys, pa.binary()),
        "value": [json.dumps({"customer": k.decode(), "amount": rng.randrange(10_000), "n": start + j}).encode()
                  for j, k in enumerate(keys)],
        "headers": pa.nulls(RECORDS, BACKUP_SCHEMA.field("headers").type),
    }, schema=BACKUP_SCHEMA)
    spec = BlockSpec(id=deterministic_block_id(times[-1], f"bench-erase/{i}"), tenant="bench", group="backup",
                     level=1,
                     kafka=[KafkaRange(topic="billing", partition=partition, start=start, end=start + RECORDS)])
    return write_block(bucket, spec, [DatasetInput("records", "billing", table, "timestamp", [{"topic": "billing"}])])


def _rewrite(payload: str, bucket_config: BucketConfig) -> int:
    """The baseline's task: one block read whole, the key's rows dropped, the block written again."""
    bucket = task_bucket(bucket_config)
    meta = BlockMeta.model_validate_json(payload)
    table = read_dataset(bucket, meta, meta.datasets[0])
    kept = table.filter(pc.invert(pc.fill_null(pc.equal(table.column("key"), pa.scalar(KEY, pa.binary())), False)))
    sink = io.BytesIO()
    pq.write_table(kept, sink, compression="zstd")
    bucket.put(f"rewrite/{meta.id}.parquet", sink.getvalue())
    return int(table.num_rows - kept.num_rows)


def _warm_up(bucket_config: BucketConfig) -> str:
    import shale.compactor.erase  # noqa: F401

    return task_bucket(bucket_config).url


def leftover_cost(bucket: ObstoreBucket) -> dict[str, float]:
    """The leftover scan (``shale.erase.leftover``, what every receipt runs) over the bench tenant: objects and
    bytes listed and read, the seconds it took, and the records it found (after the erasure, the replaced blocks
    still in the bucket hold them until the delete delay)."""
    needle = Needle(sha256=hashlib.sha256(KEY).hexdigest(), topics=frozenset(["billing"]))
    with timed() as took:
        scan = scan_leftovers(bucket, "bench", needle)
    return {"leftover_scan_seconds": round(took[0], 2), "leftover_scan_objects_listed": scan.objects,
            "leftover_scan_bytes_listed": scan.bytes, "leftover_scan_objects_read": scan.objects_read,
            "leftover_scan_bytes_read": scan.bytes_read, "leftover_scan_records_found": len(scan.leftovers)}


def leftover_only() -> dict[str, float]:
    """The leftover scan alone over the month of blocks on MinIO, without Spark (``python -c 'from bench.erase
    import leftover_only; print(leftover_only())'``): the key is in the three blocks that hold it."""
    with minio_bucket() as bucket_config:
        bucket = open_bucket(bucket_config)
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: _block(bucket, i), range(BLOCKS)))
        return leftover_cost(bucket)


def run() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="shale-bench-erase-") as tmp, minio_bucket() as bucket_config:
        bucket = open_bucket(bucket_config)
        progress(f"writing {BLOCKS} blocks ({BLOCKS * RECORDS:,} records)")
        with ThreadPoolExecutor(8) as pool:
            metas = list(pool.map(lambda i: _block(bucket, i), range(BLOCKS)))
        config = ShaleConfig(bucket=bucket_config, metastore={"data_dir": str(Path(tmp) / "ms")},  # type: ignore[arg-type]
                             compaction=CompactionConfig(max_level=1, poll_interval=0.1))
        service = open_metastore(config)
        assert isinstance(service, MetastoreService)
        service.submit(AddBlocks(blocks=metas))
        spark = spark_session("shale-bench-erase", SparkConfig(master="local[2]"), kafka=False)
        spark.sparkContext.parallelize(range(2), 2).map(lambda _: _warm_up(bucket_config)).collect()

        progress("baseline: a Spark job rewriting every block of the topic without the key")
        payloads = [m.model_dump_json() for m in metas]
        with timed() as base:
            removed = sum(spark.sparkContext.parallelize(payloads, 16)
                          .map(lambda p: _rewrite(p, bucket_config)).collect())
        assert removed == len(HOLDERS), removed

        progress("Shale: erase the key (request, scan, erase jobs on the compaction worker)")
        worker = CompactionWorker(service, bucket_config, spark, poll_interval=0.1)
        stop = threading.Event()
        runner = threading.Thread(target=worker.run, args=(stop,))
        with timed() as ours:
            report = erase(service, bucket_config, ErasureRequest("bench", KEY, ["billing"]), dry_run=False,
                           by="bench")
            runner.start()
            while erasure_status(service, report.id).state != "rewritten" and runner.is_alive():
                time.sleep(0.01)
        stop.set()
        runner.join()
        status = erasure_status(service, report.id)
        assert status.state == "rewritten", status
        assert sum(b["rows_removed"] for b in status.blocks) == len(HOLDERS)
        spark.stop()
        progress("the leftover scan of every object under the tenant's prefixes (what a receipt runs)")
        leftover = leftover_cost(bucket)  # it finds the key in the replaced blocks, not deleted yet
    return write_result(
        "erase",
        figures={"seconds": round(ours[0], 2), "blocks_total": BLOCKS, "blocks_opened": report.blocks_opened,
                 "blocks_rewritten": len(status.blocks), "records_erased": report.matches,
                 "records_total": BLOCKS * RECORDS, **leftover},
        baseline={"seconds": round(base[0], 2), "blocks_opened": BLOCKS, "blocks_rewritten": BLOCKS},
        ratios={"speedup_vs_full_rewrite": round(base[0] / ours[0], 2),
                "blocks_opened_share": round(report.blocks_opened / BLOCKS, 4),
                "blocks_rewritten_share": round(len(status.blocks) / BLOCKS, 4)},
        notes=__doc__ or "",
    )
