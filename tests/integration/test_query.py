"""The query path: `shale query`, the Python API, the Spark data source and DuckDB (reading the same Parquet
objects the index lists) return the same rows; and a repeated query returns the identical multiset of records
while a compaction runs and after it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import duckdb
import pyarrow as pa
from click.testing import CliRunner
from tests.factories import backup_table

from shale.block import block_file_key
from shale.cli import cli
from shale.compactor.worker import CompactionWorker
from shale.config import BucketConfig, CompactionConfig, IngestConfig, ParserRule, ShaleConfig
from shale.encoder.chunks import Chunk, GroupSpec, write_chunk
from shale.metastore import CommitIngestBatch, MetastoreService, OffsetRange, open_metastore
from shale.objstore import local_path, open_bucket
from shale.query import Query, run_query
from shale.query.datasource import register

HOUR = 3_600_000
START = 1_795_000_000_000 - 1_795_000_000_000 % HOUR  # 2026-11-18 09:00 UTC
PARSER = ParserRule(parser="json", options={"time_field": "t", "time_format": "epoch_ms", "label_fields": ["level"],
                                            "fields": ["msg"]})


def _ingest(service: MetastoreService, bucket_config: BucketConfig, batches: int = 12) -> None:
    """Twelve batches of 2 partitions, 500 records each, spread over three hours, written and committed as the
    partition group writes them."""
    spec = GroupSpec("partition", 1, bucket_config, IngestConfig(parsers=[PARSER]))
    bucket = open_bucket(bucket_config)
    for b in range(batches):
        blocks, ranges = [], []
        for partition in (0, 1):
            start = b * 500
            table = backup_table("app", partition, start, 500)
            values = [json.dumps({"t": START + (start + i) * 1800 + partition, "msg": f"m{start + i}",
                                  "level": ["INFO", "WARN", "ERROR"][(start + i) % 3]}).encode() for i in range(500)]
            table = table.set_column(table.schema.get_field_index("value"), "value", pa.array(values, pa.binary()))
            result = write_chunk(spec, bucket, table, Chunk("app", partition, "", start, start + 500,
                                                            START + 7 * 24 * HOUR))
            blocks += result.blocks
            ranges.append(OffsetRange(topic="app", partition=partition, start=result.start, end=result.end))
        assert service.submit(CommitIngestBatch(group="partition", ranges=ranges, blocks=blocks)).ok


def _keys(table: pa.Table) -> Counter[tuple[object, ...]]:
    cols = [table.column(c).to_pylist() for c in ("topic", "partition", "offset", "level", "msg")]
    return Counter(zip(*cols, strict=True))


def test_cli_api_spark_and_duckdb_agree_and_compaction_changes_nothing(spark, tmp_path: Path) -> None:
    bucket_config = BucketConfig(url=f"file://{tmp_path}/bucket")
    config = ShaleConfig(bucket=bucket_config, metastore={"data_dir": str(tmp_path / "ms")},  # type: ignore[arg-type]
                         compaction=CompactionConfig(blocks_per_job=[6, 4], max_level=2, poll_interval=0.2))
    service = open_metastore(config)
    assert isinstance(service, MetastoreService)
    _ingest(service, bucket_config)
    bucket = open_bucket(bucket_config)
    start, end = START + HOUR, START + 2 * HOUR - 1
    selector = '{topic="app", level="ERROR"}'

    query = Query("default", start, end, selector)
    api = run_query(query, service, bucket).read_all()
    expected = _keys(api)
    assert 0 < sum(expected.values()) < 12 * 1000 / 3
    assert set(api.column("level").to_pylist()) == {"ERROR"}

    file = tmp_path / "shale.toml"
    file.write_text(f'[bucket]\nurl = "{bucket_config.url}"\n[metastore]\ndata_dir = "{tmp_path / "ms"}"\n')
    out = CliRunner().invoke(cli, ["--config", str(file), "query", "--tenant", "default", "--from", str(start),
                                   "--to", str(end), selector, "--format", "json"])
    assert out.exit_code == 0, out.output
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert Counter((r["topic"], r["partition"], r["offset"], r["level"], r["msg"]) for r in rows) == expected

    # DuckDB reads the very objects the index lists for this query.
    metas = service.query_blocks(["default"], start, end, selector, group="partition")
    root = local_path(bucket_config.url)
    files = [str(root / block_file_key(m, d.file)) for m in metas for d in m.datasets]
    duck = duckdb.sql(
        f"SELECT topic, partition, \"offset\", level, msg FROM read_parquet({files!r}, union_by_name=true) "
        f"WHERE event_time BETWEEN epoch_ms({start}) AND epoch_ms({end}) AND level = 'ERROR'").arrow()
    assert _keys(duck.read_all() if hasattr(duck, "read_all") else duck) == expected

    # The one-line door: a configuration file to a table, times as datetimes.
    import datetime as dt

    import shale
    table = shale.read(file, tenant="default", selector=selector, start=dt.datetime.fromtimestamp(start / 1000, dt.UTC),
                       end=dt.datetime.fromtimestamp(end / 1000, dt.UTC))
    assert _keys(table) == expected

    # A plain PySpark session finds the data source with no registration call (pyspark_shale), as READING.md says.
    script = (f"from pyspark.sql import SparkSession\n"
              f"spark = SparkSession.builder.master('local[1]').config('spark.ui.enabled', 'false').getOrCreate()\n"
              f"df = spark.read.format('shale').option('config', {str(file)!r}).option('tenant', 'default')"
              f".option('from', '{start}').option('to', '{end}').option('selector', {selector!r}).load()\n"
              f"print('ROWS', df.count())\n")
    plain = subprocess.run([sys.executable, "-c", script], env={**os.environ, "PYSPARK_PYTHON": sys.executable},
                           capture_output=True, text=True, timeout=600, check=False)
    assert f"ROWS {sum(expected.values())}" in plain.stdout, plain.stderr[-3000:]

    register(spark)  # still accepted where the data source is already known
    df = (spark.read.format("shale").option("config", str(file)).option("tenant", "default")
          .option("from", str(start)).option("to", str(end)).option("selector", selector).load())
    spark_rows = df.select("topic", "partition", "offset", "level", "msg").collect()
    assert Counter(tuple(r) for r in spark_rows) == expected

    # Compaction runs; the same query keeps returning the same multiset, during and after.
    worker = CompactionWorker(service, bucket_config, spark, slots=2, poll_interval=0.2)
    done = threading.Event()
    thread = threading.Thread(target=lambda: (worker.run(until_idle=True), done.set()))
    thread.start()
    seen = 0
    while not done.is_set():
        assert _keys(run_query(Query("default", start, end, selector), service, bucket).read_all()) == expected
        seen += 1
    thread.join()
    assert len(worker.completed) >= 4
    after = Query("default", start, end, selector)
    assert _keys(run_query(after, service, bucket).read_all()) == expected
    assert after.stats.objects < query.stats.objects
    assert seen >= 1
