"""``spark.read.format("shale")``: a Spark data source over stored blocks (Spark's Python Data Source API).

Options: ``tenant`` (required), ``from`` and ``to`` (as in ``shale query``), ``selector`` (label matchers),
``group`` (partition or backup), ``quarantine`` (true/false), ``config`` (a Shale TOML file; default: the
usual lookup) and ``source`` (metastore or bucket-index). Tenant, time range and labels are applied where the
blocks are chosen (the index) and as Parquet row filters (row-group statistics), so Spark only receives
matching rows. **This source takes no pushed-down filters from ``.where()``** (Spark 4.1's ``pushFilters`` is
off by default, ``spark.sql.python.filterPushdown.enabled``, and not used), so those are options; a ``.where()``
still works, applied by Spark after the read.

One Spark partition per group of blocks (about 128 MB of objects). Blocks that might share records (their Kafka
ranges intersect, see plan.py) go to the same partition, where duplicates are dropped.

``latest`` (true/false) reads the latest row per key of change tables (docs/design/change-tables.md), as of
``as_of`` (a time; default: now); ``from`` and ``to`` are then not used. The view is computed on the driver from
the topics' whole history (``shale.query.latest``) and handed to Spark as one partition: a first slice, bounded by
the driver's memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from shale.config import ShaleConfig, load_config
from shale.objstore import open_bucket, task_bucket
from shale.query.latest import PROCESS_READS, history_query, read_latest, store_name
from shale.query.plan import Part, QueryPlan
from shale.query.reader import Query, execute
from shale.query.sources import open_source
from shale.query.times import parse_time

PARTITION_BYTES = 128 * 2**20
SPARK_TIMESTAMP = pa.timestamp("us", tz="UTC")
SPARK_LOCAL_TIMESTAMP = pa.timestamp("us")
SPARK_MAX_DECIMAL_DIGITS = 38


def _spark_arrow(t: pa.DataType) -> pa.DataType:
    """The Arrow type Spark 4.1 takes for ``t``, holding the same values with the same meaning:

    * a timestamp with a zone: microseconds, UTC (Spark's ``timestamp``, an instant); one without a zone (Avro's
      ``local-timestamp-*``): microseconds, no zone (``timestamp_ntz``, a wall-clock time that no session time zone
      moves);
    * a time of day (Avro's ``time-millis``/``-micros``; Spark 4.1's time type is off by default): microseconds
      since midnight, ``bigint`` (as in Shale's Iceberg tables);
    * a decimal of more than 38 digits (Spark's most): its exact text, ``string``;
    * unsigned integers, which Spark has not, as the next signed type, uint64 as decimal(20,0);
    * a null column (Avro ``null``): ``void``;
    nested types converted inside."""
    if pa.types.is_timestamp(t):
        return SPARK_TIMESTAMP if t.tz else SPARK_LOCAL_TIMESTAMP
    if pa.types.is_time(t):
        return pa.int64()
    if pa.types.is_decimal(t) and t.precision > SPARK_MAX_DECIMAL_DIGITS:
        return pa.string()
    if pa.types.is_uint64(t):
        return pa.decimal128(20, 0)
    if pa.types.is_uint32(t):
        return pa.int64()
    if pa.types.is_uint16(t):
        return pa.int32()
    if pa.types.is_uint8(t):
        return pa.int16()
    if pa.types.is_map(t):
        return pa.map_(_spark_arrow(t.key_type), _spark_arrow(t.item_type))
    if pa.types.is_list(t):
        return pa.list_(_spark_arrow(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _spark_arrow(f.type)) for f in t])
    return t


def _micros_of_day(t: pa.DataType) -> pa.DataType:
    """``t`` with every time of day as time64(us): a cast to it scales milliseconds, the cast to int64 then keeps
    the count (a direct cast of time32(ms) to int64 would keep milliseconds)."""
    if pa.types.is_time(t):
        return pa.time64("us")
    if pa.types.is_map(t):
        return pa.map_(t.key_type, _micros_of_day(t.item_type))
    if pa.types.is_list(t):
        return pa.list_(_micros_of_day(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _micros_of_day(f.type)) for f in t])
    return t


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _spark_type(t: pa.DataType) -> str:
    t = _spark_arrow(t)
    if pa.types.is_string(t):
        return "string"
    if pa.types.is_binary(t):
        return "binary"
    if pa.types.is_timestamp(t):
        return "timestamp" if t.tz else "timestamp_ntz"
    if pa.types.is_int8(t):
        return "tinyint"
    if pa.types.is_int16(t):
        return "smallint"
    if pa.types.is_int32(t):
        return "int"
    if pa.types.is_int64(t):
        return "bigint"
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_float32(t):
        return "float"
    if pa.types.is_float64(t):
        return "double"
    if pa.types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    if pa.types.is_date32(t):
        return "date"
    if pa.types.is_null(t):
        return "void"
    if pa.types.is_map(t):
        return f"map<{_spark_type(t.key_type)},{_spark_type(t.item_type)}>"
    if pa.types.is_list(t):
        return f"array<{_spark_type(t.value_type)}>"
    if pa.types.is_struct(t):
        return "struct<" + ",".join(f"{_quoted(f.name)}:{_spark_type(f.type)}" for f in t) + ">"
    raise TypeError(f"no Spark type for {t}")


def spark_ddl(schema: pa.Schema) -> str:
    return ", ".join(f"{_quoted(f.name)} {_spark_type(f.type)}" for f in schema)


def _for_spark(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The batch in the Arrow types Spark takes (``_spark_arrow``), every value the same."""
    arrays = []
    for column in batch.columns:
        wanted = _spark_arrow(column.type)
        scaled = _micros_of_day(column.type)
        arrays.append(column if wanted == column.type else
                      (column if scaled == column.type else column.cast(scaled)).cast(wanted))
    return pa.RecordBatch.from_arrays(arrays, names=batch.schema.names)


def _groups(plan: QueryPlan) -> list[list[Part]]:
    """Parts in groups of about PARTITION_BYTES; parts on topic-partitions needing dedup stay together."""
    shared = [p for p in plan.parts
              if any((r.topic, r.partition, r.incarnation) in plan.dedup_partitions for r in p.block.kafka)]
    alone = [p for p in plan.parts if p not in shared]
    groups: list[list[Part]] = [shared] if shared else []
    current: list[Part] = []
    size = 0
    for part in alone:
        file_size = part.block.file(part.dataset.file).size
        if current and size + file_size > PARTITION_BYTES:
            groups.append(current)
            current, size = [], 0
        current.append(part)
        size += file_size
    if current:
        groups.append(current)
    return groups


class ShaleDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "shale"

    def _setup(self) -> tuple[ShaleConfig, Query, QueryPlan]:
        options: dict[str, str] = dict(self.options)
        if "tenant" not in options:
            raise ValueError('spark.read.format("shale") needs .option("tenant", ...)')
        config = load_config(options.get("config") or None)
        query = Query(options["tenant"], parse_time(options.get("from", "0")), parse_time(options.get("to", "now")),
                      options.get("selector", ""), group=options.get("group", "partition"),
                      kind="quarantine" if options.get("quarantine", "false").lower() == "true" else "records",
                      default_generation=config.ingest.generation)
        bucket = open_bucket(config.bucket)
        planned = history_query(query) if options.get("latest", "false").lower() == "true" else query
        plan = planned.plan(open_source(config, options.get("source", "metastore"), bucket))
        return config, query, plan

    def schema(self) -> str:
        _, _, plan = self._setup()
        return spark_ddl(plan.schema)

    def reader(self, schema: Any) -> ShaleReader | LatestReader:
        config, query, plan = self._setup()
        if self.options.get("latest", "false").lower() != "true":
            if "as_of" in self.options:
                raise ValueError('the option "as_of" is the time of a latest view: add .option("latest", "true")')
            return ShaleReader(config, query, plan)
        bucket = open_bucket(config.bucket)
        as_of = self.options.get("as_of")
        view, _ = read_latest(query, open_source(config, self.options.get("source", "metastore"), bucket), bucket,
                              config.ingest.parsers, None if as_of is None else parse_time(as_of), PROCESS_READS,
                              store_name(config))
        return LatestReader(view)


class LatestReader(DataSourceReader):
    """A change table's latest rows, computed on the driver, as one partition."""

    def __init__(self, view: pa.Table) -> None:
        self.view = view

    def partitions(self) -> list[Any]:
        return [InputPartition(0)]

    def read(self, partition: Any) -> Iterator[pa.RecordBatch]:
        for batch in self.view.to_batches():
            yield _for_spark(batch)


class ShaleReader(DataSourceReader):
    def __init__(self, config: ShaleConfig, query: Query, plan: QueryPlan) -> None:
        self.config = config
        self.query = query
        self.plan = plan

    def partitions(self) -> list[Any]:
        return [InputPartition(i) for i in range(len(_groups(self.plan)))] or [InputPartition(-1)]

    def read(self, partition: Any) -> Iterator[pa.RecordBatch]:
        if partition.value < 0:
            return
        parts = _groups(self.plan)[partition.value]
        sub = QueryPlan(parts, self.plan.schema, self.plan.time_column, self.plan.dedup_partitions,
                        self.plan.base_columns)  # parts keep their generation intervals
        for batch in execute(self.query, sub, task_bucket(self.config.bucket)):
            yield _for_spark(batch)


def register(spark: Any) -> None:
    """Make ``spark.read.format("shale")`` available in this session. Not needed where Shale is installed in the
    Python that Spark runs (``PYSPARK_PYTHON``): Spark registers it by itself through the ``pyspark_shale`` module;
    then this does nothing."""
    try:
        spark.dataSource.register(ShaleDataSource)
    except Exception as exc:  # pyspark's AnalysisException, imported from the session's flavour (classic or connect)
        if "DATA_SOURCE_ALREADY_EXISTS" not in str(exc):
            raise
