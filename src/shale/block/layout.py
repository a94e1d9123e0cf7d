"""The bucket layout, written where it is enforced. Every key Shale writes is built here.

::

    group=backup/tenant=<tenant>/<ULID>/<dataset files>.parquet      a backup block's data objects
    group=backup/tenant=<tenant>/<ULID>/meta.json                    written last, put-if-absent: complete
    group=partition/tenant=<tenant>/dt=<YYYY-MM-DD>/<ULID>/...       a partition block of one day
    group=partition/tenant=<tenant>/dt=__HIVE_DEFAULT_PARTITION__/<ULID>/...   of no single day
    <tenant>/blocks/<ULID>/...                       blocks of both groups written before groups had their own
                                                     prefixes (``BlockMeta.layout`` 1): read, never written
    <tenant>/markers/<ULID>-deletion-mark.json       deletion marks, all in one prefix (seed 001)
    <tenant>/markers/<ULID>-quarantine-mark.json     quarantine marks: damaged blocks kept, never deleted
    <tenant>/bucket-index.json.gz                    the tenant's bucket index (seed 001)
    <tenant>/bucket-index-deltas/<ms>-<seq>-<writer>.json   stale-tolerant index deltas, sorted by time
    _shale/dlq/<group>/<ms>-<seq>.json               commands that could not reach the metastore
    <tenant>/restore-dead-letters/<job>/<partition>-<offset>.json   a record a restore's target refused by size
    <tenant>/erasures/<id>/receipt.json              an erasure's receipt (``shale erase``), written once

Each group has one top-level prefix, so one lifecycle rule (``group=backup/``) archives the backup group of every
tenant, present and future, and a prefix (``group=partition/tenant=acme/``) scopes an access policy. A tenant name
cannot hold ``=``, so no tenant's keys ever start there. A block's key is a fixed function of its metadata
(``block_prefix``): tenant, group, day and id, and ``layout`` for the blocks of before; whoever holds a block's
metadata (the index, the bucket index, a tombstone) holds its keys.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Protocol

from shale.block.ids import check_block_id
from shale.block.names import check_tenant
from shale.errors import InvalidNameError

LEGACY_BLOCKS_DIR = "blocks"
LEGACY_LAYOUT = 1
LAYOUT = 2
"""``BlockMeta.layout`` of every block written now: under its group's prefix."""
GROUP_NAMES = ("backup", "partition")
GROUP_KEY = "group="
TENANT_KEY = "tenant="
DAY_KEY = "dt="
NO_DAY = "__HIVE_DEFAULT_PARTITION__"
"""The day folder of a partition-group block of no single day: Hive's name for a null partition value."""
DAY = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
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


class Placed(Protocol):
    """What a block's keys are made of: ``BlockMeta`` has it all."""

    @property
    def id(self) -> str: ...
    @property
    def tenant(self) -> str: ...
    @property
    def group(self) -> str: ...
    @property
    def layout(self) -> int: ...
    @property
    def partition_values(self) -> dict[str, str]: ...


@dataclass(frozen=True)
class Place:
    """A block's place without its metadata (a block whose meta.json is not written yet, or lost)."""

    tenant: str
    id: str
    group: str = "backup"
    partition_values: dict[str, str] = field(default_factory=dict)
    layout: int = LAYOUT


def group_prefix(group: str) -> str:
    if group not in GROUP_NAMES:
        raise ValueError(f"group {group!r} is not one of {GROUP_NAMES}")
    return f"{GROUP_KEY}{group}/"


def tenant_group_prefix(tenant: str, group: str) -> str:
    """Where a tenant's blocks of one group are (a partition-group prefix for an access policy)."""
    return f"{group_prefix(group)}{TENANT_KEY}{check_tenant(tenant)}/"


def legacy_blocks_prefix(tenant: str) -> str:
    """Where blocks of both groups were before each group had its own prefix (``BlockMeta.layout`` 1)."""
    return f"{check_tenant(tenant)}/{LEGACY_BLOCKS_DIR}/"


def blocks_prefixes(tenant: str) -> tuple[str, ...]:
    """Every prefix a tenant's blocks may be under: listing these finds each of its blocks."""
    return (*(tenant_group_prefix(tenant, g) for g in GROUP_NAMES), legacy_blocks_prefix(tenant))


def day_folder(partition_values: dict[str, str]) -> str:
    """The ``dt=`` folder of a partition-group block: its day, or ``NO_DAY`` for a block of no single day (one
    that spans days after compaction, or holds no dated rows)."""
    day = partition_values.get("dt", "")
    return f"{DAY_KEY}{day if DAY.fullmatch(day) else NO_DAY}/"


def legacy_block_prefix(tenant: str, block_id: str) -> str:
    return f"{legacy_blocks_prefix(tenant)}{check_block_id(block_id)}/"


def check_block_folder(prefix: str, tenant: str, block_id: str) -> str:
    """``prefix`` if it is the folder of ``tenant``'s block ``block_id`` in some layout, else ``ValueError``."""
    parsed = parse_block_key(prefix + META_FILENAME)
    if parsed is None or (parsed.tenant, parsed.block_id) != (tenant, block_id):
        raise ValueError(f"{prefix!r} is not the folder of block {tenant}/{block_id}")
    return prefix


def check_file_name(name: str) -> str:
    if "/" in name or name in ("", ".", "..", META_FILENAME):
        raise ValueError(f"{name!r} is not a block data file name")
    return name


def block_prefix(block: Placed) -> str:
    """The folder of a block's objects, from its metadata."""
    block_id = check_block_id(block.id)
    if block.layout == LEGACY_LAYOUT:
        return legacy_block_prefix(block.tenant, block_id)
    if block.layout != LAYOUT:
        raise ValueError(f"block {block_id}: layout {block.layout} is unknown")
    day = day_folder(block.partition_values) if block.group == "partition" else ""
    return f"{tenant_group_prefix(block.tenant, block.group)}{day}{block_id}/"


def meta_key(block: Placed) -> str:
    return block_prefix(block) + META_FILENAME


def block_file_key(block: Placed, name: str) -> str:
    return block_prefix(block) + check_file_name(name)


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
    prefix: str
    """The block's folder: the key without ``name``."""


def parse_block_key(key: str) -> BlockKey | None:
    """A block object's key (any layout, ``blocks_prefixes``) as its parts, or None for any other key."""
    parts = key.split("/")
    try:
        if len(parts) == 4 and parts[1] == LEGACY_BLOCKS_DIR:
            tenant, block_id = parts[0], parts[2]
        elif len(parts) in (4, 5) and parts[0].removeprefix(GROUP_KEY) in GROUP_NAMES \
                and parts[1].startswith(TENANT_KEY):
            group, tenant, block_id = parts[0].removeprefix(GROUP_KEY), parts[1].removeprefix(TENANT_KEY), parts[-2]
            if (len(parts) == 5) != (group == "partition") or \
                    (len(parts) == 5 and parts[2] + "/" != day_folder({"dt": parts[2].removeprefix(DAY_KEY)})):
                return None
        else:
            return None
        return BlockKey(check_tenant(tenant), check_block_id(block_id), parts[-1], key[: -len(parts[-1])])
    except ValueError:
        return None


def tenant_of_dir(folder: str) -> str | None:
    """The tenant a top-level folder (``acme/``) or a group's tenant folder (``group=backup/tenant=acme/``)
    names, or None."""
    name = folder.rstrip("/").rsplit("/", 1)[-1].removeprefix(TENANT_KEY)
    try:
        return check_tenant(name)
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
