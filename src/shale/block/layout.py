"""The bucket layout, written where it is enforced. Every key Shale writes is built here.

::

    <tenant>/blocks/<ULID>/<dataset files>.parquet   data objects, named in meta.json
    <tenant>/blocks/<ULID>/meta.json                 written last, put-if-absent: its presence means complete
    <tenant>/markers/<ULID>-deletion-mark.json       deletion marks, all in one prefix (seed 001)
    <tenant>/markers/<ULID>-quarantine-mark.json     quarantine marks: damaged blocks kept, never deleted
    <tenant>/bucket-index.json.gz                    the tenant's bucket index (seed 001)
    <tenant>/bucket-index-deltas/<ms>-<seq>-<writer>.json   stale-tolerant index deltas, sorted by time
    _shale/dlq/<group>/<ms>-<seq>.json               commands that could not reach the metastore
    <tenant>/restore-dead-letters/<job>/<partition>-<offset>.json   a record a restore's target refused by size
    <tenant>/erasures/<id>/receipt.json              an erasure's receipt (``shale erase``), written once
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from shale.block.ids import check_block_id
from shale.block.names import check_tenant
from shale.errors import InvalidNameError

BLOCKS_DIR = "blocks"
MARKERS_DIR = "markers"
META_FILENAME = "meta.json"
DELETION_MARK_SUFFIX = "-deletion-mark.json"
QUARANTINE_MARK_SUFFIX = "-quarantine-mark.json"
BUCKET_INDEX_FILENAME = "bucket-index.json.gz"
BUCKET_INDEX_DELTAS_DIR = "bucket-index-deltas"
DLQ_PREFIX = "_shale/dlq/"
RESTORE_DEAD_LETTERS_DIR = "restore-dead-letters"
ERASURES_DIR = "erasures"
RESTORE_JOB_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
RESTORE_JOB = re.compile(RESTORE_JOB_PATTERN)


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


def quarantine_mark_key(tenant: str, block_id: str) -> str:
    return markers_prefix(tenant) + check_block_id(block_id) + QUARANTINE_MARK_SUFFIX


def bucket_index_key(tenant: str) -> str:
    return f"{check_tenant(tenant)}/{BUCKET_INDEX_FILENAME}"


def bucket_index_deltas_prefix(tenant: str) -> str:
    return f"{check_tenant(tenant)}/{BUCKET_INDEX_DELTAS_DIR}/"


def erasure_receipt_key(tenant: str, erasure: str) -> str:
    """An erasure's receipt (``shale erase``), written once, put-if-absent."""
    if not re.fullmatch(r"[0-9a-f]{16}", erasure):
        raise InvalidNameError(f"erasure id {erasure!r} is not 16 hex digits")
    return f"{check_tenant(tenant)}/{ERASURES_DIR}/{erasure}/receipt.json"


def restore_dead_letters_prefix(tenant: str, job: str) -> str:
    if not RESTORE_JOB.fullmatch(job):
        raise ValueError(f"restore job name {job!r}: use 1 to 64 letters, digits, '-' or '_'")
    return f"{check_tenant(tenant)}/{RESTORE_DEAD_LETTERS_DIR}/{job}/"


def restore_dead_letter_key(tenant: str, job: str, partition: int, offset: int) -> str:
    """Where a restore puts a record its target refuses by size (the record itself, base64, with why): one object
    per record, named by its source position, so a retried task writes the same key."""
    return f"{restore_dead_letters_prefix(tenant, job)}{partition}-{offset:020d}.json"


def parse_restore_dead_letter_key(key: str) -> tuple[int, int] | None:
    """(source partition, source offset) of a dead-letter key, else None."""
    partition, _, offset = key.rsplit("/", 1)[-1].removesuffix(".json").partition("-")
    return (int(partition), int(offset)) if partition.isdigit() and offset.isdigit() else None


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


def parse_mark_key(key: str, suffix: str = DELETION_MARK_SUFFIX) -> tuple[str, str] | None:
    """``<tenant>/markers/<ULID><suffix>`` (a deletion mark unless ``suffix`` says otherwise) as (tenant, block id),
    or None."""
    parts = key.split("/")
    if len(parts) != 3 or parts[1] != MARKERS_DIR or not parts[2].endswith(suffix):
        return None
    try:
        return check_tenant(parts[0]), check_block_id(parts[2].removesuffix(suffix))
    except ValueError:
        return None
