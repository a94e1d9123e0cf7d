"""Building partition-group blocks and metastore changes for the Iceberg tests, through public APIs only
(``write_block`` and metastore commands), and comparing an Iceberg table with ``shale query``."""

from __future__ import annotations

import datetime as dt
import decimal
import io
import itertools
import json
import subprocess
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import fastavro
import pyarrow as pa

from shale.block import BlockMeta, BlockSpec, DatasetInput, KafkaRange, deterministic_block_id, write_block
from shale.block.schemas import TIMESTAMP, partition_schema
from shale.config import BucketConfig, IngestConfig, ParserRule, SchemaRegistryConfig, ShaleConfig
from shale.encoder.chunks import Chunk, GroupSpec, write_chunk
from shale.iceberg import IcebergPublisher
from shale.metastore import (
    CommitIngestBatch,
    MetastoreService,
    OffsetRange,
    ReplaceBlocks,
    Result,
    SingleNodeLog,
    StateMachine,
)
from shale.objstore import Bucket, open_bucket
from shale.query import Query, run_query
from shale.schemas.registry import RegisteredSchema, RegistryClient
from shale.schemas.wire import frame
from tests.factories import backup_table

HOUR = 3_600_000
T0 = 1_795_000_000_000 - 1_795_000_000_000 % HOUR  # 2026-11-18 09:00 UTC
KEY = ("topic", "partition", "offset", "event_time", "level", "msg")


class Setup(NamedTuple):
    config: ShaleConfig
    service: MetastoreService
    publisher: IcebergPublisher
    bucket: Bucket


def publisher_setup(tmp_path: Path) -> Setup:
    """A publisher on an embedded metastore, a folder bucket and a SQLite catalog, in ``tmp_path``; blocks deleted
    and synced at once."""
    config = ShaleConfig.model_validate({
        "bucket": {"url": f"file://{tmp_path}/bucket"}, "metastore": {"data_dir": str(tmp_path / "ms")},
        "iceberg": {"enabled": True, "catalog_uri": f"sqlite:///{tmp_path}/catalog.db"},
        "block": {"delete_delay": 0, "sync_delay": 0}, "bucket_index": {"max_stale_period": 0}})
    state = StateMachine(tmp_path / "ms" / "state.db")
    service = MetastoreService(state, SingleNodeLog(state))
    bucket = open_bucket(config.bucket)
    return Setup(config, service, IcebergPublisher(config, state.reader, service.submit, bucket), bucket)


def records(topic: str, partition: int, start: int, count: int, base_ms: int, step_ms: int,
            columns: Sequence[str] = ("level", "msg"), generation: int = 1) -> pa.Table:
    """Parsed records of offsets [start, start+count), event times base_ms + i*step_ms."""
    offsets = list(range(start, start + count))
    times = [(base_ms + (o - start) * step_ms) * 1000 for o in offsets]
    data: dict[str, object] = {
        "topic": [topic] * count, "partition": pa.array([partition] * count, pa.int32()),
        "offset": pa.array(offsets, pa.int64()), "timestamp": pa.array(times, TIMESTAMP),
        "timestamp_type": pa.array([0] * count, pa.int8()), "key": [f"k{o}".encode() for o in offsets],
        "value": [f"v{o}".encode() for o in offsets],
        "headers": pa.array([None] * count, partition_schema([]).field("headers").type),
        "event_time": pa.array(times, TIMESTAMP),
        "dt": [dt.datetime.fromtimestamp(t / 1e6, dt.UTC).strftime("%Y-%m-%d") for t in times],
        "hour": pa.array([None] * count, pa.int8())}
    for c in columns:
        data[c] = [f"{c}-g{generation}-{o % 3}" if c == "level" else f"{c}-g{generation}-{o}" for o in offsets]
    return pa.table(data, schema=partition_schema(list(columns)))


def write_records_block(bucket: Bucket, tenant: str, topic: str, partition: int, start: int, count: int,
                        base_ms: int, step_ms: int = 1000, *, generation: int = 1,
                        columns: Sequence[str] = ("level", "msg"), block_time_ms: int | None = None) -> BlockMeta:
    table = records(topic, partition, start, count, base_ms, step_ms, columns, generation)
    day = table.column("dt")[0].as_py()
    block_id = deterministic_block_id(block_time_ms or base_ms,
                                      f"partition/{generation}/{topic}/{partition}/{start}/{start + count}")
    spec = BlockSpec(id=block_id, tenant=tenant, group="partition", generation=generation,
                     kafka=[KafkaRange(topic=topic, partition=partition, start=start, end=start + count)],
                     partition_values={"dt": day})
    return write_block(bucket, spec, [DatasetInput("records", topic, table, "event_time",
                                                   labels=[{"topic": topic, "dt": day}])])


def commit(service: MetastoreService, blocks: list[BlockMeta], generation: int = 1) -> Result:
    ranges: dict[tuple[str, int], list[int]] = {}
    for b in blocks:
        for r in b.kafka:
            span = ranges.setdefault((r.topic, r.partition), [r.start, r.end])
            span[0], span[1] = min(span[0], r.start), max(span[1], r.end)
    result = service.submit(CommitIngestBatch(
        group="partition", generation=generation, writer="ingest" if generation == 1 else "reprocess",
        ranges=[OffsetRange(topic=t, partition=p, start=s, end=e) for (t, p), (s, e) in sorted(ranges.items())],
        blocks=blocks))
    return result.raise_for_rejection()


def compact(service: MetastoreService, bucket: Bucket, sources: list[BlockMeta]) -> BlockMeta:
    """Merge ``sources`` (one tenant, topic and generation) into one level-1 block and replace them."""
    from shale.block import read_dataset

    first = sources[0]
    tables = [read_dataset(bucket, m, m.datasets[0]) for m in sources]
    columns = sorted({c for m in sources for c in m.datasets[0].columns})
    merged = pa.concat_tables([t.select(partition_schema(columns).names) for t in tables], promote_options="default")
    merged = merged.sort_by([("event_time", "ascending"), ("offset", "ascending")])
    topic = first.datasets[0].topic
    block_id = deterministic_block_id(min(m.time_ms for m in sources),
                                      "compact/" + ",".join(sorted(m.id for m in sources)))
    kafka = [KafkaRange(topic=topic, partition=r.partition, start=min(x.start for m in sources for x in m.kafka
                                                                       if x.partition == r.partition),
                        end=max(x.end for m in sources for x in m.kafka if x.partition == r.partition))
             for r in {r.partition: r for m in sources for r in m.kafka}.values()]
    spec = BlockSpec(id=block_id, tenant=first.tenant, group="partition", generation=first.generation, level=1,
                     kafka=kafka, sources=sorted({s for m in sources for s in m.compaction.sources}),
                     parents=[m.id for m in sources])
    meta = write_block(bucket, spec, [DatasetInput("records", topic, merged, "event_time",
                                                   labels=[{"topic": topic}])])
    service.submit(ReplaceBlocks(tenant=first.tenant, sources=[m.id for m in sources], blocks=[meta])
                   ).raise_for_rejection()
    return meta


def rows(table: pa.Table) -> Counter[tuple[object, ...]]:
    """The multiset of records, compared on identity, time and parsed columns (timestamps as microseconds)."""
    cols = []
    for name in KEY:
        column = table.column(name)
        if pa.types.is_timestamp(column.type):
            column = column.cast(TIMESTAMP).cast(pa.int64())
        cols.append(column.to_pylist())
    return Counter(zip(*cols, strict=True))


def query_rows(service: MetastoreService, bucket: Bucket, tenant: str, topic: str, start: int, end: int) -> Counter[
        tuple[object, ...]]:
    reader = run_query(Query(tenant, start, end, f'{{topic="{topic}"}}'), service, bucket)
    return rows(reader.read_all())


SPARK_COLUMNS = "topic, partition, offset, unix_micros(event_time) AS event_time, level, msg"
"""What a Spark SQL query selects to compare with ``rows`` (times as microseconds, computed by Spark)."""


def spark_rows(collected: Iterable[object]) -> Counter[tuple[object, ...]]:
    """Rows collected from Spark with ``SPARK_COLUMNS``."""
    return Counter(tuple(getattr(row, name) for name in KEY) for row in collected)


# Typed parser columns (issue 31): an order schema, version 1 and a compatible version 2.
ADDRESS_V1 = pa.struct([pa.field("city", pa.string()), pa.field("zip", pa.int32())])
ADDRESS_V2 = pa.struct([pa.field("city", pa.string()), pa.field("zip", pa.int64()), pa.field("country", pa.string())])


def typed_block(bucket: Bucket, tenant: str, topic: str, start: int, count: int, columns: dict[str, pa.Array],
                ) -> BlockMeta:
    """A partition-group block of ``count`` records from offset ``start`` with these typed parser columns (the
    writer records their types, as a typed parser's block does)."""
    table = records(topic, 0, start, count, T0 + start * 1000, 1000, columns=())
    for name, array in columns.items():
        table = table.append_column(pa.field(name, array.type), array)
    day = table.column("dt")[0].as_py()
    spec = BlockSpec(id=deterministic_block_id(T0 + start * 1000, f"typed/{start}"), tenant=tenant,
                     group="partition", generation=1, partition_values={"dt": day},
                     kafka=[KafkaRange(topic=topic, partition=0, start=start, end=start + count)])
    return write_block(bucket, spec, [DatasetInput("records", topic, table, "event_time",
                                                   labels=[{"topic": topic, "dt": day}])])


def v1_columns(start: int, count: int) -> dict[str, pa.Array]:
    offsets = range(start, start + count)
    return {
        "amount": pa.array([decimal.Decimal(f"{o}.25") for o in offsets], pa.decimal128(10, 2)),
        "placed": pa.array([dt.datetime(2026, 1, 1, 12, 0, 0, o, tzinfo=dt.UTC) for o in offsets],
                           pa.timestamp("us", tz="UTC")),
        "address": pa.array([{"city": f"c{o}", "zip": o} for o in offsets], ADDRESS_V1),
        "qty": pa.array(list(offsets), pa.int32()),
        "ratio": pa.array([o / 4 for o in offsets], pa.float32()),
        "big": pa.array([2**64 - 1 - o for o in offsets], pa.uint64()),
        "tags": pa.array([[f"t{o}"] for o in offsets], pa.list_(pa.string())),
        "attrs": pa.array([[("k", o)] for o in offsets], pa.map_(pa.string(), pa.int64())),
    }


def v2_columns(start: int, count: int) -> dict[str, pa.Array]:
    """Version 2: ``amount`` dropped, ``qty`` int -> long, ``ratio`` float -> double, ``address`` gains a field and
    its zip widens, and a new column ``note``."""
    offsets = range(start, start + count)
    return {
        "placed": pa.array([dt.datetime(2026, 1, 2, tzinfo=dt.UTC)] * count, pa.timestamp("us", tz="UTC")),
        "address": pa.array([{"city": f"c{o}", "zip": 2**40 + o, "country": "NZ"} for o in offsets], ADDRESS_V2),
        "qty": pa.array([2**40 + o for o in offsets], pa.int64()),
        "ratio": pa.array([o / 3 for o in offsets], pa.float64()),
        "big": pa.array(list(offsets), pa.uint64()),
        "tags": pa.array([[f"t{o}"] for o in offsets], pa.list_(pa.string())),
        "attrs": pa.array([[("k", o)] for o in offsets], pa.map_(pa.string(), pa.int64())),
        "note": pa.array([f"n{o}" for o in offsets], pa.string()),
    }


# A topic of several record types (subject_name_strategy record), its schemas known to the registry client.
REGISTRY = SchemaRegistryConfig(url="http://127.0.0.1:1/apis/ccompat/v7", timeout=2.0)
_ids = itertools.count(99_000)
ORDER: dict[str, Any] = {"type": "record", "name": "Order", "namespace": "shop",
                         "fields": [{"name": "id", "type": "long"}, {"name": "amount", "type": "double"}]}
REFUND: dict[str, Any] = {"type": "record", "name": "Refund", "namespace": "shop",
                          "fields": [{"name": "id", "type": "long"}, {"name": "why", "type": "string"}]}
IDS: dict[str, int] = {}
for _name, _schema in (("shop.Order", ORDER), ("shop.Refund", REFUND)):
    IDS[_name] = next(_ids)
    RegistryClient(REGISTRY).remember(RegisteredSchema(IDS[_name], "AVRO", json.dumps(_schema)))
KINDS = ["shop.Order", "shop.Refund", "shop.Order", "shop.Order", "shop.Refund", "shop.Order"]


def record_value(kind: str, n: int) -> bytes:
    schema, datum = (ORDER, {"id": n, "amount": n / 2}) if kind == "shop.Order" else (REFUND, {"id": n, "why": f"w{n}"})
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), datum)
    return frame(IDS[kind], out.getvalue())


def record_type_blocks(config: ShaleConfig, bucket: Bucket, start: int, end: int, generation: int = 1,
            shift: int = 0) -> list[BlockMeta]:
    """Records of offsets [start, end) of topic ``shop`` in the KINDS order, Avro with the record strategy, written
    by the ingest's chunk writer: one block, a dataset per record type."""
    spec = GroupSpec("partition", generation, config.bucket,
                     IngestConfig(parsers=[ParserRule(parser="avro", options={"subject_name_strategy": "record"})],
                                  schema_registry=REGISTRY))
    table = backup_table("shop", 0, start, end - start, base_ms=T0 + start * 1000)
    table = table.set_column(table.schema.get_field_index("value"), "value",
                             pa.array([record_value(KINDS[n], n + shift) for n in range(start, end)]))
    written = write_chunk(spec, bucket, table, Chunk("shop", 0, "", start, end, T0 + 86_400_000))
    assert written.quarantined == 0
    return [m for m in written.blocks if m.datasets]


DUCKDB_SCRIPT = Path(__file__).resolve().parents[1] / "src" / "shale" / "dev" / "duckdb_iceberg.py"


def run_duckdb(spec: dict[str, Any], secret: str = "") -> str:
    """Shale's DuckDB script (``shale.dev.duckdb_iceberg``) in DuckDB's own environment, ``spec`` on its stdin (no
    credential on a command line): its stdout. The test fails on an error, or when ``secret`` is in its stderr."""
    from shale.dev.fetch import fetch_duckdb

    done = subprocess.run([str(fetch_duckdb()), str(DUCKDB_SCRIPT)], input=json.dumps(spec), capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    assert not secret or secret not in done.stderr
    return done.stdout


def duckdb_catalog_queries(bucket: BucketConfig, catalog_url: str, credential: str,
                           queries: dict[str, str]) -> dict[str, list[list[Any]]]:
    """DuckDB's rows for ``queries``, the REST catalog at ``catalog_url`` attached as ``shale`` with
    ``credential`` (``client-id:secret``) and the bucket's keys."""
    client_id, client_secret = credential.split(":", 1)
    secret = bucket.secret_access_key.get_secret_value()
    spec = {"catalog": catalog_url, "client_id": client_id, "client_secret": client_secret,
            "s3": {"endpoint": bucket.endpoint.removeprefix("http://"), "key_id": bucket.access_key_id,
                   "secret": secret, "region": bucket.region},
            "queries": queries}
    result: dict[str, list[list[Any]]] = json.loads(run_duckdb(spec, secret))
    return result
