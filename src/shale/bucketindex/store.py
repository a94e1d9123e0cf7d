"""Reading and conditionally writing ``<tenant>/bucket-index.json.gz``, so two writers never silently overwrite
each other.

Every write is conditional on the version its writer read: put-if-absent when there was no index, put-if-match
with the read version's etag otherwise. A writer reads the etag (HEAD) *before* the contents (GET): if the
object changes in between, the etag is the older one and the write fails instead of overwriting a version the
writer never saw.

On a conflict the writer re-reads the current index and merges (``merge``): a writer's *change* is the
difference between the index it read (its base) and the index it wants to write, so the merge applies exactly
that difference to the current index. Blocks and marks the other writer added stay; those our writer removed go;
neither side's change is lost. It then retries, a bounded number of times, conditional on the version it just
read. Two writers with different sources (for example two metastore leaders during a change of leadership, or
the metastore and `shale bucket index`) therefore converge on an index holding both sides' changes.
"""

from __future__ import annotations

import gzip
import logging
import zlib
from dataclasses import dataclass

from shale.block import bucket_index_key
from shale.bucketindex.model import INDEX_VERSION, BucketIndex, IndexedMark, peek_version
from shale.errors import ConflictError, CorruptObjectError, NotFoundError, ShaleError
from shale.objstore import Bucket, BucketReader

log = logging.getLogger(__name__)
DEFAULT_ATTEMPTS = 5


@dataclass(frozen=True)
class StoredIndex:
    """An index as read from (or written to) the bucket, with the etag of that version."""

    index: BucketIndex
    etag: str


@dataclass(frozen=True)
class Published:
    """What a conditional write did: the version now stored, and how many conflicts it merged on the way."""

    stored: StoredIndex
    conflicts: int


def read_index(bucket: BucketReader, tenant: str, *, replace_corrupt: bool = False) -> StoredIndex | None:
    """The tenant's index and its etag (HEAD, then GET), or None if there is none.

    With ``replace_corrupt`` (writers), a malformed index comes back as an empty index with the corrupt
    object's etag, so the next write replaces it; an index of a newer version is never replaced (a newer
    Shale wrote it) and stays a ``CorruptObjectError``.
    """
    key = bucket_index_key(tenant)
    try:
        etag = bucket.head(key).etag
        data = bucket.get(key)
    except NotFoundError:
        return None
    if etag is None:
        raise ShaleError(f"{bucket.url} returned no entity tag for {key}; the bucket index needs a store with "
                         "conditional updates (S3, GCS, Azure, MinIO, local or memory)")
    try:
        return StoredIndex(BucketIndex.parse(data, tenant=tenant, key=key), etag)
    except CorruptObjectError:
        newer = _is_newer_version(data)
        if not replace_corrupt or newer:
            raise
        log.warning("replacing a corrupt bucket index", extra={"tenant": tenant, "key": key})
        return StoredIndex(BucketIndex.empty(tenant), etag)


def _is_newer_version(data: bytes) -> bool:
    try:
        version = peek_version(gzip.decompress(data))
    except (OSError, EOFError, zlib.error):
        return False
    return isinstance(version, int) and version > INDEX_VERSION


def merge(base: BucketIndex | None, ours: BucketIndex, theirs: BucketIndex) -> BucketIndex:
    """``theirs`` with our change applied: blocks and marks in ``ours`` but not in ``base`` are added, those in
    ``base`` but not in ``ours`` are removed. Upload times keep the earliest; ``updated_at`` and ``watermark``
    take the later of the two (the merged index holds both sides' changes); generation switches are ours when we
    know them (the metastore's writer), else theirs (a scan knows none). ``tenant_version`` is the later of the
    two when both sides know theirs, else unknown: a scan's blocks are the bucket's, which may lack a block the
    other side's version holds (one younger than the sync delay)."""
    base_blocks = base.block_ids() if base else set()
    base_marks = base.marked_ids() if base else set()
    our_blocks = {b.id: b for b in ours.blocks}
    our_marks = {m.id: m for m in ours.deletion_marks}
    blocks = {b.id: b for b in theirs.blocks}
    marks = {m.id: m for m in theirs.deletion_marks}
    for block_id in our_blocks.keys() - base_blocks:
        blocks.setdefault(block_id, our_blocks[block_id])
    for block_id in base_blocks - our_blocks.keys():
        blocks.pop(block_id, None)
    for block_id in our_marks.keys() - base_marks:
        marks[block_id] = _earlier(marks.get(block_id), our_marks[block_id])
    for block_id in base_marks - our_marks.keys():
        marks.pop(block_id, None)
    uploaded = {}
    for block_id in blocks:
        times = [t for t in (theirs.uploaded.get(block_id), ours.uploaded.get(block_id)) if t is not None]
        if times:
            uploaded[block_id] = min(times)
    generations = ours.generations if ours.generations is not None else theirs.generations
    return BucketIndex.build(theirs.tenant, max(ours.updated_at, theirs.updated_at), blocks.values(),
                             marks.values(), uploaded, watermark=max(ours.watermark, theirs.watermark),
                             generations=generations, tenant_version=_later(ours.tenant_version,
                                                                            theirs.tenant_version))


def _later(ours: int | None, theirs: int | None) -> int | None:
    return None if ours is None or theirs is None else max(ours, theirs)


def _earlier(current: IndexedMark | None, mine: IndexedMark) -> IndexedMark:
    return mine if current is None or mine.deletion_time < current.deletion_time else current


def publish(bucket: Bucket, desired: BucketIndex, base: StoredIndex | None,
            attempts: int = DEFAULT_ATTEMPTS) -> Published:
    """Write ``desired`` conditionally on ``base`` (the version it was built from; None if there was no index).
    On a conflict, re-read, merge our change into the current index, and retry up to ``attempts`` writes."""
    key = bucket_index_key(desired.tenant)
    ours, conflicts = desired, 0
    for _ in range(attempts):
        data = ours.to_bytes()
        try:
            result = bucket.put_if_absent(key, data) if base is None else bucket.put_if_match(key, data, base.etag)
        except (ConflictError, NotFoundError):
            # MinIO answers an If-Match on a missing object with 404, which obstore reports as a failed
            # precondition; a store may also report it as a missing object. Either way our base is gone.
            conflicts += 1
            current = read_index(bucket, desired.tenant, replace_corrupt=True)
            if current is not None:
                ours = merge(base.index if base else None, ours, current.index)
            # With no index at all now (an operator deleted it), our full view is written as it is.
            log.info("bucket index changed under its writer; merged and retrying",
                     extra={"tenant": desired.tenant, "conflicts": conflicts})
            base = current
            continue
        if result.etag is None:
            raise ShaleError(f"{bucket.url} returned no entity tag for {key}; the bucket index needs a store with "
                             "conditional updates (S3, GCS, Azure, MinIO, local or memory)")
        return Published(StoredIndex(ours, result.etag), conflicts)
    raise ConflictError(
        f"{key}: lost {attempts} conditional writes in a row against other writers of the bucket index of tenant "
        f"{desired.tenant}. Something rewrites it continuously: make sure only the metastore leader and no more "
        "than one `shale bucket index` run write it, then retry.")
