"""The per-tenant bucket index (seed 001): ``<tenant>/bucket-index.json.gz`` lists a tenant's complete blocks
(full ``BlockMeta``) and deletion marks, so a reader learns the whole tenant with one GET and no LIST.

Modules: ``model`` (the versioned record and the live-block rule), ``store`` (conditional writes that merge
instead of overwriting), ``writer`` (the metastore leader's writer), ``scan`` (the coordination-free writer
from a bucket scan), ``reader`` (lazy loading, background refresh, staleness), ``deltas`` (stale-tolerant mode).
The sequence is in README.md.

Errors::

    ShaleError
    ├── NotFoundError          the tenant has no index yet (build it, or start the metastore)
    ├── ConflictError          a writer lost every conditional write of its bounded retries
    ├── CorruptObjectError     a malformed index or delta, or an index of an unknown version
    └── StaleIndexError        the index (and its deltas) is older than max_stale_period
"""

from shale.bucketindex.deltas import (
    DELTA_MARGIN,
    UNREFLECTED_DELTA_LIMIT,
    DeltaLink,
    DeltaWriter,
    IndexDelta,
    apply_delta,
)
from shale.bucketindex.model import (
    INDEX_VERSION,
    SET_HASH_MODULUS,
    BucketIndex,
    IndexedMark,
    block_id_hash,
    digest_of_set,
    legacy_state_digest,
    live_blocks,
    set_hash,
    state_digest,
)
from shale.bucketindex.reader import BucketIndexReader, StaleIndexError
from shale.bucketindex.scan import scan_index, write_scanned_index
from shale.bucketindex.store import Published, StoredIndex, merge, publish, read_index
from shale.bucketindex.writer import BucketIndexWriter, IndexSource, TenantWrite, Tombstone

__all__ = [
    "DELTA_MARGIN",
    "INDEX_VERSION",
    "SET_HASH_MODULUS",
    "UNREFLECTED_DELTA_LIMIT",
    "BucketIndex",
    "BucketIndexReader",
    "BucketIndexWriter",
    "DeltaLink",
    "DeltaWriter",
    "IndexDelta",
    "IndexSource",
    "IndexedMark",
    "Published",
    "StaleIndexError",
    "StoredIndex",
    "TenantWrite",
    "Tombstone",
    "apply_delta",
    "block_id_hash",
    "digest_of_set",
    "legacy_state_digest",
    "live_blocks",
    "merge",
    "publish",
    "read_index",
    "scan_index",
    "set_hash",
    "state_digest",
    "write_scanned_index",
]
