"""Deletion marks (seed 000, rule 8; kept under ``<tenant>/markers/`` as in seed 001)."""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict, ValidationError

from shale.block.ids import check_block_id
from shale.block.layout import deletion_mark_key
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


def parse_mark(data: bytes, key: str) -> DeletionMark:
    try:
        mark = DeletionMark.model_validate(json.loads(data))
    except (ValueError, ValidationError) as exc:
        raise CorruptObjectError(f"{key}: deletion mark is not valid: {exc}", key=key) from None
    if mark.version != MARK_VERSION:
        raise CorruptObjectError(f"{key}: deletion mark version {mark.version} is unknown; upgrade Shale", key=key)
    return mark
