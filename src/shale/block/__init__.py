"""Blocks and the object-storage contract (seed 000; metadata as in seed 004).

A block is immutable once its meta.json exists. Writers upload data objects first and meta.json last
(``write_block``); readers trust a block only when meta.json is loadable and, for bucket scanners, older than the
sync delay (``BlockFetcher``); deletion is a mark, a delay, then removal in reverse order (``Cleaner``).
"""

from shale.block.cleaner import Action, Cleaner, CleanupReport, MetastoreView, delete_block
from shale.block.fetcher import BlockFetcher, BlockState, BlockView, FetchResult
from shale.block.ids import check_block_id, deterministic_block_id, new_block_id, ulid_time_ms
from shale.block.layout import (
    Place,
    block_file_key,
    block_prefix,
    blocks_prefixes,
    bucket_index_key,
    deletion_mark_key,
    markers_prefix,
    meta_key,
    quarantine_mark_key,
    tenant_group_prefix,
)
from shale.block.marks import DeletionMark, QuarantineMark, write_deletion_mark, write_quarantine_mark
from shale.block.meta import BlockMeta, Compaction, Dataset, FileInfo, KafkaRange, ParserInfo, parse_meta
from shale.block.names import check_label_name, check_tenant, check_topic
from shale.block.reader import BucketFile, backup_rows, read_dataset, read_footer_meta, read_meta
from shale.block.writer import (
    BlockSpec,
    DatasetInput,
    DatasetStream,
    encode_parquet,
    plan_block,
    write_block,
    write_block_streamed,
)

__all__ = [
    "Action",
    "BlockFetcher",
    "BlockMeta",
    "BlockSpec",
    "BlockState",
    "BlockView",
    "BucketFile",
    "Cleaner",
    "CleanupReport",
    "Compaction",
    "Dataset",
    "DatasetInput",
    "DatasetStream",
    "DeletionMark",
    "FetchResult",
    "FileInfo",
    "KafkaRange",
    "MetastoreView",
    "ParserInfo",
    "Place",
    "QuarantineMark",
    "backup_rows",
    "block_file_key",
    "block_prefix",
    "blocks_prefixes",
    "bucket_index_key",
    "check_block_id",
    "check_label_name",
    "check_tenant",
    "check_topic",
    "delete_block",
    "deletion_mark_key",
    "deterministic_block_id",
    "encode_parquet",
    "markers_prefix",
    "meta_key",
    "new_block_id",
    "parse_meta",
    "plan_block",
    "quarantine_mark_key",
    "read_dataset",
    "read_footer_meta",
    "read_meta",
    "tenant_group_prefix",
    "ulid_time_ms",
    "write_block",
    "write_block_streamed",
    "write_deletion_mark",
    "write_quarantine_mark",
]
