"""The bucket layout, written where it is enforced. Every key Shale writes is built here.

::

    <tenant>/blocks/<ULID>/<dataset files>.parquet   data objects, named in meta.json
    <tenant>/blocks/<ULID>/meta.json                 written last, put-if-absent: its presence means complete
    <tenant>/markers/<ULID>-deletion-mark.json       deletion marks, all in one prefix (seed 001)
    <tenant>/bucket-index.json.gz                    the tenant's bucket index (seed 001)
    <tenant>/bucket-index-deltas/<ms>-<seq>-<writer>.json   stale-tolerant index deltas, sorted by time
    _shale/dlq/<group>/<ms>-<seq>.json               commands that could not reach the metastore
"""

from __future__ import annotations

from dataclasses import dataclass

from shale.block.ids import check_block_id
from shale.block.names import check_tenant

BLOCKS_DIR = "blocks"
MARKERS_DIR = "markers"
META_FILENAME = "meta.json"
DELETION_MARK_SUFFIX = "-deletion-mark.json"
BUCKET_INDEX_FILENAME = "bucket-index.json.gz"
BUCKET_INDEX_DELTAS_DIR = "bucket-index-deltas"
DLQ_PREFIX = "_shale/dlq/"


def blocks_prefix(tenant: str) -> str:
    return f"{check_tenant(tenant)}/{BLOCKS_DIR}/"


def block_prefix(tenant: str, block_id: str) -> str:
    return f"{blocks_prefix(tenant)}{check_block_id(block_id)}/"


def meta_key(tenant: str, block_id: str) -> str:
    return block_prefix(tenant, block_id) + META_FILENAME


def block_file_key(tenant: str, block_id: str, name: str) -> str:
    if "/" in name or name in ("", ".", "..", META_FILENAME):
        raise ValueError(f"{name!r} is not a block data file name")
    return block_prefix(tenant, block_id) + name


def markers_prefix(tenant: str) -> str:
    return f"{check_tenant(tenant)}/{MARKERS_DIR}/"


def deletion_mark_key(tenant: str, block_id: str) -> str:
    return markers_prefix(tenant) + check_block_id(block_id) + DELETION_MARK_SUFFIX


def bucket_index_key(tenant: str) -> str:
    return f"{check_tenant(tenant)}/{BUCKET_INDEX_FILENAME}"


def bucket_index_deltas_prefix(tenant: str) -> str:
    return f"{check_tenant(tenant)}/{BUCKET_INDEX_DELTAS_DIR}/"


@dataclass(frozen=True)
class BlockKey:
    tenant: str
    block_id: str
    name: str


def parse_block_key(key: str) -> BlockKey | None:
    """``<tenant>/blocks/<ULID>/<name>`` as its parts, or None for any other key."""
    parts = key.split("/")
    if len(parts) != 4 or parts[1] != BLOCKS_DIR:
        return None
    try:
        return BlockKey(check_tenant(parts[0]), check_block_id(parts[2]), parts[3])
    except ValueError:
        return None


def parse_mark_key(key: str) -> tuple[str, str] | None:
    """``<tenant>/markers/<ULID>-deletion-mark.json`` as (tenant, block id), or None."""
    parts = key.split("/")
    if len(parts) != 3 or parts[1] != MARKERS_DIR or not parts[2].endswith(DELETION_MARK_SUFFIX):
        return None
    try:
        return check_tenant(parts[0]), check_block_id(parts[2].removesuffix(DELETION_MARK_SUFFIX))
    except ValueError:
        return None
