"""Iceberg data files from Shale's objects: registered as they are, or copied when a table must show only some of
their rows (a generation switch cuts them) or when they hold types Iceberg does not read as they are: millisecond
timestamps (blocks written before Shale's timestamps became microseconds), unsigned integers and times of day
(``shale.iceberg.types``).

The data file entries are built by pyiceberg from the Parquet footer (column sizes, counts, bounds), exactly as
its ``add_files`` does; the footer is read through Shale's bucket with one ranged GET of the object's last 1 MiB
block or two (``BucketFile``), a second only when the footer reaches further back.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from shale.block import BucketFile, block_file_key, encode_parquet, read_dataset
from shale.config import BucketConfig
from shale.iceberg.catalog import object_uri
from shale.iceberg.plan import FileSpec
from shale.iceberg.types import needs_copy, to_iceberg
from shale.objstore import Bucket
from shale.query import Part, QueryPlan, row_filter

COPIES_DIR = "iceberg-copies"


def copy_key(tenant: str, name: str) -> str:
    """Where copies of a tenant's rows live: beside its blocks, never under ``blocks/`` (no fetcher sees them)."""
    return f"{tenant}/{COPIES_DIR}/{name}"


@dataclass(frozen=True)
class Registered:
    """A file ready for a snapshot: its URI, its bucket key, whether it is a copy, and the pyiceberg entry."""

    uri: str
    key: str
    copy: bool
    data_file: Any


def data_file(table_metadata: Any, uri: str, metadata: pq.FileMetaData, size: int) -> Any:
    """pyiceberg's data file entry for a Parquet object, from its footer (as ``add_files`` builds it)."""
    from pyiceberg.io.pyarrow import (
        _check_pyarrow_schema_compatible,
        compute_statistics_plan,
        data_file_statistics_from_parquet_metadata,
        parquet_path_to_id_mapping,
    )
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat

    schema = table_metadata.schema()
    _check_pyarrow_schema_compatible(schema, metadata.schema.to_arrow_schema(),
                                     format_version=table_metadata.format_version)
    statistics = data_file_statistics_from_parquet_metadata(
        parquet_metadata=metadata, stats_columns=compute_statistics_plan(schema, table_metadata.properties),
        parquet_column_mapping=parquet_path_to_id_mapping(schema))
    entry = DataFile.from_args(
        content=DataFileContent.DATA, file_path=uri, file_format=FileFormat.PARQUET,
        partition=statistics.partition(table_metadata.spec(), schema), file_size_in_bytes=size,
        sort_order_id=None, equality_ids=None, key_metadata=None, **statistics.to_serialized_dict())
    entry.spec_id = table_metadata.default_spec_id  # from_args does not set it; removing the file later needs it
    return entry


def _copy(bucket: Bucket, spec: FileSpec) -> tuple[str, bytes]:
    """The rows of ``spec`` that its table shows, in their Iceberg types (``shale.iceberg.types``: timestamps in
    microseconds, unsigned integers widened), as a Parquet object. The row filter
    is the query path's own (``shale.query.plan.row_filter``), so the copy holds exactly the rows a query reads."""
    d = spec.dataset
    plan = QueryPlan([], pa.schema([]), "event_time", set(), [])
    expression = row_filter(plan, Part(spec.block, d, spec.intervals), d.min_time, d.max_time, [])
    table = read_dataset(bucket, spec.block, d, filters=expression, whole_object=None)
    return copy_key(spec.block.tenant, spec.copy_name()), encode_parquet(to_iceberg(table))


def register(bucket: Bucket, bucket_config: BucketConfig, table_metadata: Any, spec: FileSpec) -> Registered:
    """The data file for ``spec``: the block's own object when it can be shown whole and holds only types Iceberg
    reads as they are, else a copy (written here; the same spec always writes the same key, so a retry rewrites it)."""
    if spec.intervals is None:
        key = block_file_key(spec.block, spec.dataset.file)
        size = spec.block.file(spec.dataset.file).size
        metadata = pq.read_metadata(BucketFile(bucket, key, size))
        if not needs_copy(metadata.schema.to_arrow_schema()):
            uri = object_uri(bucket_config, key)
            return Registered(uri, key, False, data_file(table_metadata, uri, metadata, size))
    key, data = _copy(bucket, spec)
    bucket.put(key, data)
    uri = object_uri(bucket_config, key)
    return Registered(uri, key, True, data_file(table_metadata, uri, pq.read_metadata(io.BytesIO(data)), len(data)))


def block_of(uri: str) -> str:
    """The block a data file URI belongs to: ``.../<id>/<file>`` (any layout) or ``.../iceberg-copies/<id>-...``."""
    parts = uri.rsplit("/", 2)
    if len(parts) == 3 and parts[1] != COPIES_DIR and len(parts[1]) == 26:
        return parts[1]
    return parts[-1][:26]


def is_copy(uri: str) -> bool:
    """Whether a data file URI is a copy (``.../<tenant>/iceberg-copies/<name>``), not a block's own object."""
    parts = uri.rsplit("/", 2)
    return len(parts) == 3 and parts[1] == COPIES_DIR


def key_of(bucket_config: BucketConfig, uri: str) -> str:
    return uri.removeprefix(object_uri(bucket_config, ""))

