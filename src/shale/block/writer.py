"""Writing a block: data objects first, meta.json last with put-if-absent (seed 000, rule 3).

The metadata is computed before any byte is written, so that it can ride in every Parquet footer too (seed 004:
a data object describes itself). A block id may be written again (a replayed ingest batch, a retried compaction
job): if a complete block with that id exists and holds the same records, the write is a no-op that returns the
existing metadata; if it holds different records, that is a ``ConflictError`` (two writers disagree on a
deterministic id, which is a bug to report, never to paper over).
"""

from __future__ import annotations

import dataclasses
import io
import itertools
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shale.block.bloom import KEY_COLUMN, key_bloom_options
from shale.block.layout import LAYOUT, block_file_key, meta_key
from shale.block.meta import BlockMeta, Compaction, Dataset, DatasetKind, FileInfo, KafkaRange, ParserInfo, parse_meta
from shale.block.names import RECORD_LABEL, cap_label_sets
from shale.block.schemas import BASE_COLUMNS, TIMESTAMP_MS, encode_column_types
from shale.errors import ConflictError, NotFoundError
from shale.failpoints import failpoint
from shale.objstore import Bucket

FOOTER_META_KEY = b"shale.meta"
FOOTER_CRC_KEY = b"shale.meta.crc32"
"""Seed 004's object footer: the block's metadata (as planned, without ``files``) and the CRC32 of its bytes, in
every data object's Parquet key-value metadata, so a block whose meta.json was lost can be recovered from its
objects (``shale.block.recover``)."""
DEFAULT_ROW_GROUP_ROWS = 65_536
_NO_DICTIONARY = frozenset({"key", "value", "headers", "offset", "timestamp", "event_time", "message"})
MAX_LABEL_SETS = 512


@dataclass
class DatasetInput:
    """Rows of one dataset, with the column that holds their time (a timestamp column)."""

    kind: DatasetKind
    topic: str
    table: pa.Table
    time_column: str
    labels: list[dict[str, str]] = field(default_factory=list)
    clamp: tuple[int, int] | None = None
    """Bounds (ms) for the data times recorded in metadata: rows keep their times as they are, but a time
    outside the bounds counts as the nearest bound (a Kafka timestamp of -1 or in the far future)."""
    schema_ids: list[int] = field(default_factory=list)
    """Schema Registry ids of the writer schemas of the rows (typed parsers), recorded in the metadata."""
    schema_fingerprint: str = ""
    record: str | None = None
    """The rows' record type when the topic's parser groups records by type (``Dataset.record``)."""
    by_partition: bool = False
    """The rows are runs of Kafka partitions (each run in offset order): every row group holds one partition's
    rows, named in the table of contents (``Dataset.row_group_partitions``)."""

    def slices(self, row_group_rows: int) -> list[tuple[int, int]]:
        """(first row, rows) of each row group."""
        n = self.table.num_rows
        runs = [(0, n)] if not self.by_partition or not n else _partition_runs(self.table.column("partition"))
        return [(start + o, min(row_group_rows, length - o)) for start, length in runs
                for o in range(0, length, row_group_rows)]


def _partition_runs(partitions: pa.ChunkedArray) -> list[tuple[int, int]]:
    values = partitions.to_numpy()
    cuts = [0, *(int(i) + 1 for i in (values[1:] != values[:-1]).nonzero()[0]), len(values)]
    return [(a, b - a) for a, b in itertools.pairwise(cuts)]


@dataclass
class BlockSpec:
    """Everything about a block except what is computed from its rows and files."""

    id: str
    tenant: str
    group: str
    generation: int = 1
    shard: int = 0
    level: int = 0
    kafka: list[KafkaRange] = field(default_factory=list)
    partition_values: dict[str, str] = field(default_factory=dict)
    sources: list[str] | None = None
    parents: list[str] = field(default_factory=list)
    parser: ParserInfo | None = None
    derived_from: list[str] = field(default_factory=list)
    ignore_delay: bool = False
    erased: list[str] | None = None
    layout: int = LAYOUT


def _times_ms(column: pa.ChunkedArray | pa.Array, clamp: tuple[int, int] | None) -> pa.ChunkedArray | pa.Array:
    times = column.cast(TIMESTAMP_MS, safe=False).cast(pa.int64())
    if clamp is not None:
        times = pc.min_element_wise(pc.max_element_wise(times, clamp[0]), clamp[1])
    return times


def _time_bounds(times: pa.ChunkedArray | pa.Array) -> tuple[int, int]:
    bounds = pc.min_max(times)
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    if low is None or high is None:
        return 0, 0
    return int(low), int(high)


def _parquet_options(schema: pa.Schema, rows: int = DEFAULT_ROW_GROUP_ROWS) -> dict[str, object]:
    """zstd, statistics and page checksums (checked by ranged readers). Dictionaries pay off for repeated short
    strings (topic, labels); for record keys, values and headers they are tried and thrown away, so they are not
    tried. A bloom filter on the record key (``shale.block.bloom``, sized for ``rows`` distinct keys per row
    group) lets an erasure skip the objects that cannot hold a key."""
    options: dict[str, object] = {"compression": "zstd", "write_statistics": True, "write_page_checksum": True,
                                  "use_dictionary": [f.name for f in schema if f.name not in _NO_DICTIONARY]}
    if KEY_COLUMN in schema.names:
        options["bloom_filter_options"] = key_bloom_options(rows)
    return options


def footer_entries(footer: bytes) -> dict[bytes, bytes]:
    return {FOOTER_META_KEY: footer, FOOTER_CRC_KEY: crc32_hex(footer).encode()}


def encode_parquet(table: pa.Table, footer: bytes | None = None, row_group_rows: int = DEFAULT_ROW_GROUP_ROWS,
                   slices: list[tuple[int, int]] | None = None) -> bytes:
    """One Parquet object holding ``table`` (with ``footer`` as its Shale metadata), in row groups of
    ``row_group_rows`` or, when given, one per slice (first row, rows)."""
    if footer is not None:
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), **footer_entries(footer)})
    sink = io.BytesIO()
    if slices is None or not table.num_rows:
        pq.write_table(table, sink, row_group_size=row_group_rows,
                       **_parquet_options(table.schema, min(table.num_rows, row_group_rows)))
    else:
        options = _parquet_options(table.schema, max(rows for _, rows in slices))
        with pq.ParquetWriter(sink, table.schema, **options) as writer:
            for start, rows in slices:
                writer.write_table(table.slice(start, rows), row_group_size=rows)
    return sink.getvalue()


def contiguous(table: pa.Table) -> pa.Table:
    """``table`` with one chunk per column. Slicing a table costs a walk over its chunks: a block of one row group
    per partition, from a table of one chunk per partition (as a batch reads them), sliced once per row group, was
    quadratic in the partitions (27 s to write a block of 10,000 against 0.5 s for 1,000). Combining copies the
    table, so only a table of many chunks is combined: a few chunks of large records would double the task's
    memory (test_large_records_stay_within_the_task_memory_bound)."""
    return table.combine_chunks() if any(c.num_chunks > MANY_CHUNKS for c in table.columns) else table


MANY_CHUNKS = 64
"""Chunks past which slicing a table costs more than copying it once."""


def micros_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with every timestamp column in UTC microseconds."""
    # A timestamp without a time zone (Avro's local-timestamp) stays one: only its unit changes.
    fields = [f.with_type(pa.timestamp("us", tz=f.type.tz)) if pa.types.is_timestamp(f.type) else f for f in schema]
    return pa.schema(fields, metadata=schema.metadata)


def in_micros(table: pa.Table) -> pa.Table:
    """Every timestamp column as UTC microseconds (Spark's and Iceberg's unit), whatever unit it came in."""
    if not any(pa.types.is_timestamp(f.type) and f.type.unit != "us" for f in table.schema):
        return table
    return table.cast(micros_schema(table.schema))


def crc32_hex(data: bytes) -> str:
    return f"{zlib.crc32(data) & 0xFFFFFFFF:08x}"


def _entry(index: int, kind: DatasetKind, topic: str, labels: list[dict[str, str]], schema: pa.Schema, rows: int,
           size: int, groups: list[tuple[int, int, int]], schema_ids: list[int] | None = None,
           fingerprint: str = "", record: str | None = None, partitions: list[int] | None = None) -> Dataset:
    extra = [f for f in schema if f.name not in BASE_COLUMNS]
    typed = any(f.type != pa.string() for f in extra)
    if record is not None:  # every label set of a record type's dataset names it: the index prunes by it
        labels = [{**ls, RECORD_LABEL: record} for ls in labels] or [{RECORD_LABEL: record}]
    return Dataset(name=dataset_name(kind, topic, record), kind=kind, topic=topic, record=record,
                   file=f"{kind}-{index}.parquet", rows=rows,
                   bytes=size, min_time=min((g[1] for g in groups), default=0),
                   max_time=max((g[2] for g in groups), default=0), labels=cap_label_sets(labels, MAX_LABEL_SETS),
                   row_groups=groups, row_group_partitions=partitions, columns=[f.name for f in extra],
                   column_types=encode_column_types(extra) if typed else None,
                   schema_ids=schema_ids or None, schema_fingerprint=fingerprint or None)


def dataset_name(kind: DatasetKind, topic: str, record: str | None = None) -> str:
    """A dataset's name, unique in its block: one per (kind, topic), and per record type when there are several."""
    return f"{kind}/{topic}" if record is None else f"{kind}/{topic}/{record}"


def _group_bounds(table: pa.Table, time_column: str, clamp: tuple[int, int] | None) -> tuple[int, int, int]:
    return (table.num_rows, *_time_bounds(_times_ms(table.column(time_column), clamp)))


def plan_block(spec: BlockSpec, datasets: list[DatasetInput],
               row_group_rows: int = DEFAULT_ROW_GROUP_ROWS) -> BlockMeta:
    """The block's metadata before its files are written (``files`` is empty)."""
    entries = []
    datasets = [dataclasses.replace(d, table=contiguous(d.table)) for d in datasets]
    for index, ds in enumerate(datasets):
        slices = ds.slices(row_group_rows)
        partitions = ([int(ds.table.column("partition")[start].as_py()) for start, _ in slices]
                      if ds.by_partition else None)
        entries.append(_entry(index, ds.kind, ds.topic, ds.labels, ds.table.schema, ds.table.num_rows,
                              ds.table.nbytes, [_group_bounds(ds.table.slice(start, rows), ds.time_column, ds.clamp)
                                                for start, rows in slices], ds.schema_ids, ds.schema_fingerprint,
                              ds.record, partitions))
    return _block_meta(spec, entries)


def _block_meta(spec: BlockSpec, entries: list[Dataset]) -> BlockMeta:
    nonempty = [d for d in entries if d.rows]
    return BlockMeta(
        id=spec.id, tenant=spec.tenant, shard=spec.shard, level=spec.level, group=spec.group,
        generation=spec.generation,
        min_time=min((d.min_time for d in nonempty), default=0),
        max_time=max((d.max_time for d in nonempty), default=0),
        kafka=spec.kafka, partition_values=spec.partition_values, datasets=entries,
        compaction=Compaction(sources=spec.sources if spec.sources is not None else [spec.id], parents=spec.parents),
        parser=spec.parser, derived_from=spec.derived_from, ignore_delay=spec.ignore_delay, erased=spec.erased,
        layout=spec.layout,
    )


def existing_block(bucket: Bucket, planned: BlockMeta) -> BlockMeta | None:
    key = meta_key(planned)
    try:
        return parse_meta(bucket.get(key), where=key, block_id=planned.id)
    except NotFoundError:
        return None


def _same_or_conflict(existing: BlockMeta, planned: BlockMeta) -> BlockMeta:
    if existing.logical_key() != planned.logical_key():
        raise ConflictError(
            f"block {planned.tenant}/{planned.id} already exists with different contents "
            f"({existing.rows} rows in {[d.name for d in existing.datasets]}, this write has {planned.rows} in "
            f"{[d.name for d in planned.datasets]}); deterministic ids must not collide: report this as a bug"
        )
    return existing


def write_block(bucket: Bucket, spec: BlockSpec, datasets: list[DatasetInput],
                row_group_rows: int = DEFAULT_ROW_GROUP_ROWS) -> BlockMeta:
    """Upload the data objects, then meta.json (put-if-absent). Returns the block's metadata.

    Data objects are overwritten freely while meta.json is absent: nobody trusts a block without it, and a
    repeated write of a deterministic id carries the same rows.
    """
    datasets = [dataclasses.replace(d, table=contiguous(in_micros(d.table))) for d in datasets]
    planned = plan_block(spec, datasets, row_group_rows)
    done = existing_block(bucket, planned)
    if done is not None:
        return _same_or_conflict(done, planned)
    footer = planned.to_json()
    return _upload(bucket, planned, [encode_parquet(ds.table, footer, row_group_rows,
                                                    ds.slices(row_group_rows) if ds.by_partition else None)
                                     for ds in datasets])


def _upload(bucket: Bucket, planned: BlockMeta, objects: list[bytes]) -> BlockMeta:
    """Put the data objects, then meta.json, each with put-if-absent: an object is never replaced (Thanos rule 1).
    A data object already there (an earlier attempt, or a concurrent writer of this deterministic id) is adopted
    when its footer says it holds this block's contents: meta.json then names its bytes, whatever the encoder
    wrote this time, so a meta.json can never describe bytes other than those in the bucket."""
    files: list[FileInfo] = []
    for entry, encoded in zip(planned.datasets, objects, strict=True):
        key = block_file_key(planned, entry.file)
        try:
            bucket.put_if_absent(key, encoded)
            data = encoded
        except ConflictError:
            data = _adopt(bucket, key, planned)
        files.append(FileInfo(name=entry.file, size=len(data), crc32=crc32_hex(data)))
    meta = planned.model_copy(update={"files": files})
    failpoint("block.before-meta")
    key = meta_key(planned)
    try:
        bucket.put_if_absent(key, meta.to_json())
    except ConflictError:
        existing = parse_meta(bucket.get(key), where=key, block_id=planned.id)
        return _same_or_conflict(existing, meta)
    return meta


def _adopt(bucket: Bucket, key: str, planned: BlockMeta) -> bytes:
    """The bytes of a data object already at ``key``, once its footer shows the same block contents."""
    data = bucket.get(key)
    try:
        raw = (pq.read_metadata(pa.BufferReader(data)).metadata or {}).get(FOOTER_META_KEY)
    except (pa.ArrowException, OSError):
        raw = None
    if raw is None:
        raise ConflictError(f"{key} exists and is not a Shale data object of block {planned.id}; it is never "
                            "overwritten: move it aside and retry")
    _same_or_conflict(parse_meta(raw, where=key, block_id=planned.id), planned)
    return data


@dataclass
class DatasetStream:
    """Rows of one dataset as a stream of row groups (each at most ``row_group_rows``, all but the last exactly
    that many), for writers that must not hold the whole dataset in memory. Every table has ``schema``."""

    kind: DatasetKind
    topic: str
    schema: pa.Schema
    row_groups: Iterable[pa.Table]
    time_column: str
    labels: list[dict[str, str]] = field(default_factory=list)
    clamp: tuple[int, int] | None = None
    schema_ids: list[int] = field(default_factory=list)
    schema_fingerprint: str = ""
    record: str | None = None


def write_block_streamed(bucket: Bucket, spec: BlockSpec, datasets: list[DatasetStream],
                         row_group_rows: int = DEFAULT_ROW_GROUP_ROWS) -> BlockMeta:
    """``write_block`` for datasets given as streams of row groups: memory holds one row group and the encoded
    (compressed) objects, never a whole dataset. The metadata is known only once every row group is encoded, so
    each object gets its footer when it is closed; the objects are uploaded (data, then meta.json) after that,
    and a complete block with this id already in the bucket makes the write a no-op as in ``write_block``."""
    writers: list[tuple[pq.ParquetWriter, pa.BufferOutputStream]] = []
    entries: list[Dataset] = []
    for index, ds in enumerate(datasets):
        schema = micros_schema(ds.schema)
        sink = pa.BufferOutputStream()
        writer = pq.ParquetWriter(sink, schema, **_parquet_options(schema))
        rows = size = 0
        groups: list[tuple[int, int, int]] = []
        for group in ds.row_groups:
            table = in_micros(group)
            if table.num_rows > row_group_rows:
                raise ValueError(f"a row group of {table.num_rows} rows; at most {row_group_rows}")
            writer.write_table(table, row_group_size=row_group_rows)
            groups.append(_group_bounds(table, ds.time_column, ds.clamp))
            rows += table.num_rows
            size += table.nbytes
        writers.append((writer, sink))
        entries.append(_entry(index, ds.kind, ds.topic, ds.labels, schema, rows, size, groups, ds.schema_ids,
                              ds.schema_fingerprint, ds.record))
    planned = _block_meta(spec, entries)
    footer = planned.to_json()
    objects = []
    for writer, sink in writers:
        writer.add_key_value_metadata(footer_entries(footer))
        writer.close()
        objects.append(sink.getvalue().to_pybytes())
    done = existing_block(bucket, planned)
    if done is not None:
        return _same_or_conflict(done, planned)
    return _upload(bucket, planned, objects)
