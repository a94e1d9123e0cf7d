"""A one-hour query on a tenant with 10,000 level-0 blocks, against the same data after compaction: objects
fetched, bytes read and seconds, in one run on MinIO.

10,000 partition-group blocks (a day of parsed log records over 4 Kafka partitions, 30 records each, labels
``level``) are committed to an embedded metastore. The query — one tenant, one hour, ``{level="ERROR"}``,
through the metastore, streamed with row filters and column projection — runs before compaction and again after
the blocks were compacted with Shale's Spark worker (jobs of 50, then of 10: 10,000 → 200 → 20 blocks). Both runs
must return the same multiset of records.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
from tests.factories import backup_table

from bench.common import progress, timed, write_result
from bench.services import minio_bucket
from shale.compactor.worker import CompactionWorker
from shale.config import CompactionConfig, IngestConfig, ParserRule, ShaleConfig, SparkConfig
from shale.encoder.chunks import Chunk, GroupSpec, write_chunk
from shale.metastore import AddBlocks, MetastoreService, open_metastore
from shale.objstore import ObstoreBucket, open_bucket
from shale.query import Query, run_query
from shale.spark import spark_session

BLOCKS, PER_BLOCK, PARTITIONS = 10_000, 30, 4
DAY = 86_400_000
T0 = 1_795_000_000_000 - 1_795_000_000_000 % DAY
PARSER = ParserRule(parser="json", options={"time_field": "t", "time_format": "epoch_ms", "label_fields": ["level"],
                                            "fields": ["msg"]})


def _write(bucket: ObstoreBucket, spec: GroupSpec, i: int) -> list[Any]:
    partition, start = i % PARTITIONS, (i // PARTITIONS) * PER_BLOCK
    table = backup_table("logs", partition, start, PER_BLOCK)
    step = DAY // (BLOCKS * PER_BLOCK // PARTITIONS)
    values = [json.dumps({"t": T0 + (start + j) * step + partition, "msg": f"event {start + j}",
                          "level": ["INFO", "WARN", "ERROR"][(start + j) % 3]}).encode() for j in range(PER_BLOCK)]
    table = table.set_column(table.schema.get_field_index("value"), "value", pa.array(values, pa.binary()))
    result = write_chunk(spec, bucket, table, Chunk("logs", partition, "", start, start + PER_BLOCK, T0 + 7 * DAY))
    return list(result.blocks)


def _query(service: MetastoreService, bucket: ObstoreBucket) -> tuple[Query, Counter[tuple[object, ...]], float]:
    query = Query("default", T0 + 10 * 3_600_000, T0 + 11 * 3_600_000 - 1, '{level="ERROR"}',
                  columns=["partition", "offset", "event_time", "level", "msg"])
    with timed() as t:
        table = run_query(query, service, bucket).read_all()
    rows = Counter(zip(*(table.column(c).to_pylist() for c in ("partition", "offset", "msg")), strict=True))
    return query, rows, t[0]


def run() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="shale-bench-query-") as tmp, minio_bucket() as bucket_config:
        bucket = open_bucket(bucket_config)
        spec = GroupSpec("partition", 1, bucket_config, IngestConfig(parsers=[PARSER]))
        progress(f"writing {BLOCKS:,} level-0 blocks")
        with ThreadPoolExecutor(16) as pool:
            metas = [m for batch in pool.map(lambda i: _write(bucket, spec, i), range(BLOCKS)) for m in batch]
        config = ShaleConfig(bucket=bucket_config, metastore={"data_dir": str(Path(tmp) / "ms")},  # type: ignore[arg-type]
                             compaction=CompactionConfig(blocks_per_job=[50, 10], max_level=2, poll_interval=0.1))
        service = open_metastore(config)
        assert isinstance(service, MetastoreService)
        for i in range(0, len(metas), 1000):
            service.submit(AddBlocks(blocks=metas[i:i + 1000]))

        progress("one-hour query before compaction")
        _query(service, bucket)  # warm the metastore's caches; the measured run follows
        before, rows_before, seconds_before = _query(service, bucket)
        progress("compacting with the Spark worker")
        spark = spark_session("shale-bench-query", SparkConfig(master="local[2]"), kafka=False)
        CompactionWorker(service, bucket_config, spark, slots=2, poll_interval=0.1).run(until_idle=True)
        spark.stop()
        progress("one-hour query after compaction")
        _query(service, bucket)
        after, rows_after, seconds_after = _query(service, bucket)
        assert rows_after == rows_before, "compaction changed the query's answer"
    return write_result(
        "query",
        figures={"objects_after": after.stats.objects, "bytes_after": after.stats.bytes_read,
                 "seconds_after": round(seconds_after, 3), "rows": sum(rows_after.values()),
                 "blocks_after": after.stats.blocks},
        baseline={"objects_before": before.stats.objects, "bytes_before": before.stats.bytes_read,
                  "seconds_before": round(seconds_before, 3), "blocks_before": before.stats.blocks},
        ratios={"seconds": round(seconds_before / seconds_after, 2),
                "objects": round(before.stats.objects / max(1, after.stats.objects), 1)},
        notes=__doc__ or "",
    )
