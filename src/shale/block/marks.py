"""Marks on blocks, kept under ``<tenant>/markers/`` as in seed 001.

* Deletion marks (seed 000, rule 8): readers skip the block; the cleaner removes it after the delete delay.
* Quarantine marks: the block's objects are damaged and its records could not be recovered (``shale bucket
  repair``). Readers skip it, and nothing ever deletes it: the cleaner neither marks nor removes a quarantined
  block, even one that also carries a deletion mark. A quarantine mark is told apart from a deletion mark by its
  key (``-quarantine-mark.json``), by its ``kind`` field and by having no ``deletion_time`` (each model forbids the
  other's fields, so neither parses as the other).
"""

from __future__ import annotations

import json
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from shale.block.ids import check_block_id
from shale.block.layout import deletion_mark_key, quarantine_mark_key
from shale.errors import ConflictError, CorruptObjectError
from shale.objstore import Bucket

MARK_VERSION = 1


class DeletionMark(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = MARK_VERSION
    id: str
    tenant: str
    deletion_time: float
    """When the block was marked, in seconds since the epoch; the delete delay counts from here."""
    reason: str = ""

    def to_json(self) -> bytes:
        return self.model_dump_json().encode()


class QuarantineMark(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = MARK_VERSION
    kind: Literal["quarantine"] = "quarantine"
    id: str
    tenant: str
    quarantine_time: float
    """When the block was quarantined, in seconds since the epoch."""
    damage: list[str]
    """What is wrong with the block's objects, one finding per entry (missing object, size, checksum)."""
    reason: str = ""
    """Why its records could not be recovered from elsewhere."""

    def to_json(self) -> bytes:
        return self.model_dump_json().encode()


def write_deletion_mark(bucket: Bucket, tenant: str, block_id: str, now: float, reason: str) -> DeletionMark:
    """Mark a block for deletion. Idempotent: an existing mark is kept (the delay counts from the first)."""
    check_block_id(block_id)
    mark = DeletionMark(id=block_id, tenant=tenant, deletion_time=now, reason=reason)
    key = deletion_mark_key(tenant, block_id)
    try:
        bucket.put_if_absent(key, mark.to_json())
    except ConflictError:
        return parse_mark(bucket.get(key), key)
    return mark


def write_quarantine_mark(bucket: Bucket, tenant: str, block_id: str, now: float, damage: list[str],
                          reason: str) -> QuarantineMark:
    """Quarantine a block. Idempotent: an existing mark is kept."""
    check_block_id(block_id)
    mark = QuarantineMark(id=block_id, tenant=tenant, quarantine_time=now, damage=damage, reason=reason)
    key = quarantine_mark_key(tenant, block_id)
    try:
        bucket.put_if_absent(key, mark.to_json())
    except ConflictError:
        return parse_quarantine_mark(bucket.get(key), key)
    return mark


_M = TypeVar("_M", "DeletionMark", "QuarantineMark")


def _parse(model: type[_M], what: str, data: bytes, key: str) -> _M:
    try:
        mark = model.model_validate(json.loads(data))
    except (ValueError, ValidationError) as exc:
        raise CorruptObjectError(f"{key}: {what} is not valid: {exc}", key=key) from None
    if mark.version != MARK_VERSION:
        raise CorruptObjectError(f"{key}: {what} version {mark.version} is unknown; upgrade Shale", key=key)
    return mark


def parse_mark(data: bytes, key: str) -> DeletionMark:
    return _parse(DeletionMark, "deletion mark", data, key)


def parse_quarantine_mark(data: bytes, key: str) -> QuarantineMark:
    return _parse(QuarantineMark, "quarantine mark", data, key)
