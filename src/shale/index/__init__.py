"""The metadata index as state (seed 004): one store per table family (its DDL, reads and writes; ``schema`` joins
them), the writes the metastore's command handlers call, and queries. No networking and no clock: the metastore
drives it."""

from shale.index.changes import BlockChange
from shale.index.compaction_state import CompactionState
from shale.index.leases import Key, ShardMap, placement, shard_map, shard_maps
from shale.index.matchers import Matcher, match_label_sets, matching_datasets, parse_matchers
from shale.index.reader import IndexReader
from shale.index.records import (
    IncarnationRow,
    LossRow,
    OffsetRow,
    PartitionRow,
    SchemaVersionRow,
    TombstoneRow,
    decode_meta,
    encode_meta,
)
from shale.index.restores import restore_rows
from shale.index.schema import PARTITION_WINDOW_MS, begin, checkpoint, commit, connect, copy_state, create, rollback
from shale.index.writer import IndexWriter

__all__ = [
    "PARTITION_WINDOW_MS",
    "BlockChange",
    "CompactionState",
    "IncarnationRow",
    "IndexReader",
    "IndexWriter",
    "Key",
    "LossRow",
    "Matcher",
    "OffsetRow",
    "PartitionRow",
    "SchemaVersionRow",
    "ShardMap",
    "TombstoneRow",
    "begin",
    "checkpoint",
    "commit",
    "connect",
    "copy_state",
    "create",
    "decode_meta",
    "encode_meta",
    "match_label_sets",
    "matching_datasets",
    "parse_matchers",
    "placement",
    "restore_rows",
    "rollback",
    "shard_map",
    "shard_maps",
]
