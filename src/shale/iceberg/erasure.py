"""Erasures in Shale's Iceberg tables (DESIGN 19.6): which snapshots still name a data file holding an erased
record, their expiry, and what a receipt shows of each table.

The publisher gives each table one snapshot for an erasure (``publisher``): it removes the replaced blocks' files
and adds the rewritten blocks', and its summary names the erasures (``shale.erasures``) and every older snapshot
that names a file which may hold one of their records (``shale.erasure-expires``): a replaced block's object or
copy, a block that holds an erased position and was not written without the erasure (merged away but not yet
deleted), or a block Shale no longer knows (its objects are deleted: the snapshot cannot be read and cannot be
shown free of the records). Those snapshots are expired right after the commit, and again at every round until
they are gone, so a crash between the two commits leaves nothing behind. Copies those snapshots released and
the sweep has not deleted yet are released again by the erasure's snapshot, so the sweep still deletes them.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from shale.block import INCARNATION_COLUMN, BlockMeta, row_incarnation_names
from shale.compactor import erased_rows
from shale.config import BucketConfig, ShaleConfig
from shale.errors import NotFoundError
from shale.iceberg.catalog import (
    SUMMARY_ERASURES,
    SUMMARY_EXPIRES,
    TABLE_OWNER,
    TABLE_PROPERTIES,
    TABLE_TOPIC,
    open_catalog,
)
from shale.iceberg.files import COPIES_DIR, block_of, copy_key, key_of
from shale.metastore import Watermarks
from shale.objstore import Bucket

log = logging.getLogger(__name__)
Position = tuple[str, int, int, str]


def summary(snapshot: Any, key: str) -> str | None:
    props = snapshot.summary
    return None if props is None else props.additional_properties.get(key)


def snapshot_files(table: Any, snapshot: Any, manifests: dict[str, list[str]]) -> set[str]:
    """The data files ``snapshot`` names (``manifests`` caches each manifest's, shared by later snapshots)."""
    out: set[str] = set()
    for manifest in snapshot.manifests(table.io):
        if manifest.manifest_path not in manifests:
            manifests[manifest.manifest_path] = [
                e.data_file.file_path for e in manifest.fetch_manifest_entry(table.io, discard_deleted=True)]
        out.update(manifests[manifest.manifest_path])
    return out


def holds(block: BlockMeta, positions: Iterable[Position]) -> bool:
    """Whether ``block``'s Kafka ranges hold one of ``positions``."""
    return any(r.topic == t and r.partition == p and r.start <= o < r.end
               and (not i or not r.incarnation or r.incarnation == i)
               for t, p, o, i in positions for r in block.kafka)


def suspect(erasures: set[str], replaced: Mapping[str, str], metas: Callable[[str], BlockMeta | None],
            positions: list[Position]) -> Callable[[str], bool]:
    """Whether a block's files may hold a record of ``erasures``: a block they replaced (``replaced``: block id ->
    erasure), a block unknown to the index, or one holding an erased position not written without its erasure."""
    seen: dict[str, bool] = {}

    def check(block_id: str) -> bool:
        if block_id not in seen:
            meta = metas(block_id)
            seen[block_id] = replaced.get(block_id) in erasures or meta is None or (
                holds(meta, positions) and not erasures <= set(meta.erased or ()))
        return seen[block_id]

    return check


def tainted(table: Any, is_suspect: Callable[[str], bool]) -> list[int]:
    """The snapshots of ``table`` naming a file whose block is suspect."""
    manifests: dict[str, list[str]] = {}
    return sorted(s.snapshot_id for s in table.metadata.snapshots
                  if any(is_suspect(block_of(u)) for u in snapshot_files(table, s, manifests)))


def pending_expiry(table: Any) -> list[int]:
    """Snapshots an erasure's snapshot lists for expiry that the table still holds."""
    held = {s.snapshot_id for s in table.metadata.snapshots}
    listed = {int(i) for s in table.metadata.snapshots for i in json.loads(summary(s, SUMMARY_EXPIRES) or "[]")}
    return sorted(held & listed)


def expire_listed(table: Any) -> list[int]:
    """Expire the snapshots erasures listed; the ids expired."""
    return expire(table, pending_expiry(table))


def expire(table: Any, doomed: list[int]) -> list[int]:
    """Expire ``doomed`` (tags and branches other than main that point at one are removed first: an erasure
    outranks a bookmark); the ids expired."""
    if not doomed:
        return []
    refs = [(name, ref) for name, ref in table.metadata.refs.items()
            if ref.snapshot_id in doomed and name != "main"]
    if refs:
        with table.manage_snapshots() as manage:
            for name, ref in refs:
                if str(ref.snapshot_ref_type).lower().endswith("tag"):
                    manage.remove_tag(name)
                else:
                    manage.remove_branch(name)
        log.warning("iceberg refs removed for an erasure", extra={"refs": [name for name, _ in refs]})
    table.maintenance.expire_snapshots().by_ids(doomed).commit()
    return doomed


def shale_tables(catalog: Any, tenant: str) -> list[tuple[str, Any]]:
    """The tenant's tables Shale owns: (``namespace.name``, table)."""
    from pyiceberg.exceptions import NoSuchNamespaceError

    try:
        names = catalog.list_tables(tenant)
    except NoSuchNamespaceError:
        return []
    out = []
    for namespace, name in names:
        table = catalog.load_table((namespace, name))
        if table.properties.get(TABLE_OWNER) == TABLE_PROPERTIES[TABLE_OWNER]:
            out.append((f"{namespace}.{name}", table))
    return out


def _matches(data: bytes, topic: str, meta: BlockMeta | None, positions: list[Position],
             key_sha256: str, marks: Watermarks | None = None) -> list[int]:
    """Offsets of the rows of a data file at an erased position, or with the erased key and not produced after the
    request (``marks``, each bounding its own incarnation: ``Watermarks``; a row whose incarnation neither its
    column nor its block tells is bounded like the watermark's, as the scan and the leftover scan bound it)."""
    names = pq.read_schema(io.BytesIO(data)).names
    columns = [c for c in ("topic", "partition", "offset", "key", INCARNATION_COLUMN) if c in names]
    table = pq.read_table(io.BytesIO(data), columns=columns)
    if meta is not None:
        hit = erased_rows(meta, topic, table, positions)
    else:  # no metadata to tell incarnations apart: any incarnation's record at the position
        wanted = {(p, o) for t, p, o, _ in positions if t == topic}
        hit = np.array([(p, o) in wanted for p, o in zip(table.column("partition").to_pylist(),
                                                         table.column("offset").to_pylist(), strict=True)], dtype=bool)
    if "key" in columns:
        marks = marks or Watermarks([])
        if meta is not None:
            incarnations = row_incarnation_names(meta, topic, table).to_pylist()
        elif INCARNATION_COLUMN in columns:
            incarnations = table.column(INCARNATION_COLUMN).to_pylist()
        else:
            incarnations = [None] * table.num_rows
        rows = zip(table.column("key").to_pylist(), table.column("partition").to_pylist(),
                   table.column("offset").to_pylist(), incarnations, strict=True)
        hit |= np.array([k is not None and hashlib.sha256(k).hexdigest() == key_sha256
                         and not marks.produced_later(topic, p, o, i or "") for k, p, o, i in rows], dtype=bool)
    return [int(o) for o in table.filter(pa.array(hit)).column("offset").to_pylist()]


def evidence(catalog: Any, bucket: Bucket, bucket_config: BucketConfig, row: dict[str, Any],
             metas: Mapping[str, BlockMeta]) -> tuple[dict[str, Any], list[str]]:
    """What a receipt shows of the tenant's Iceberg tables for erasure ``row`` (``erasure_rows``' shape), and
    what is still pending (empty: ready). For each table: the erasure's snapshot and the snapshots it expired
    (each confirmed gone from the table's metadata), and a scan of every data file every retained snapshot
    names, at the erased positions and for the key's SHA-256 (``metas``: the tenant's live blocks)."""
    erasure, tenant = row["id"], row["tenant"]
    replaced = {b["old"] for b in row["blocks"]}
    positions = [(t, int(p), int(o), i) for t, p, o, i in row["positions"]]
    marks = Watermarks(row["watermarks"])  # the key's records produced after the request are not the erasure's
    pending: list[str] = []
    tables: list[dict[str, Any]] = []
    scanned = rows = 0
    matches: list[dict[str, Any]] = []
    for name, table in shale_tables(catalog, tenant):
        topic = table.properties.get(TABLE_TOPIC, name.split(".", 1)[1])
        if row["topics"] and topic not in row["topics"]:
            continue  # a table of a topic the erasure does not name
        manifests: dict[str, list[str]] = {}
        files: set[str] = set()
        for snapshot in table.metadata.snapshots:
            files |= snapshot_files(table, snapshot, manifests)
        old = sorted(u for u in files if block_of(u) in replaced)
        if old:
            pending.append(f"Iceberg table {name} still names {len(old)} files of replaced blocks (the leader's "
                           "publisher has not published the erasure yet)")
        mine = [s for s in table.metadata.snapshots if erasure in json.loads(summary(s, SUMMARY_ERASURES) or "[]")]
        held = {s.snapshot_id for s in table.metadata.snapshots}
        expired = sorted({int(i) for s in mine for i in json.loads(summary(s, SUMMARY_EXPIRES) or "[]")})
        if held & set(expired):
            pending.append(f"Iceberg table {name}: snapshots {sorted(held & set(expired))} are not expired yet")
        for uri in sorted(files):
            try:
                data = bucket.get(key_of(bucket_config, uri))
            except NotFoundError:
                continue  # deleted: it holds nothing (the snapshot naming it is unreadable)
            scanned += 1
            found = _matches(data, topic, metas.get(block_of(uri)), positions, row["key_sha256"], marks)
            rows += pq.read_metadata(io.BytesIO(data)).num_rows
            matches += [{"table": name, "file": uri, "offset": o} for o in found]
        if mine or expired:
            tables.append({"table": name, "erasure_snapshots": [s.snapshot_id for s in mine],
                           "snapshots_expired": [{"snapshot": i, "gone": i not in held} for i in expired],
                           "retained_snapshots": len(held), "files": len(files)})
    copies = [o.key for o in bucket.list(copy_key(tenant, "")) if o.key.rsplit("/", 1)[-1][:26] in replaced]
    if copies:
        pending.append(f"{len(copies)} Iceberg copies of replaced blocks are still in the bucket ({COPIES_DIR}/; "
                       "the publisher deletes them block.delete_delay, or the shorter delay the erasure asked for, "
                       "after the erasure's snapshot)")
    return {"tables": tables, "files_read": scanned, "rows_read": rows, "matches": matches}, pending


def receipt_check(config: ShaleConfig, bucket: Bucket) -> Callable[[dict[str, Any], list[BlockMeta]],
                                                                   tuple[dict[str, Any], list[str]]]:
    """``write_receipt``'s check of the configured catalog's tables (``shale.erase.receipt.IcebergCheck``)."""
    catalog = open_catalog(config)
    return lambda row, blocks: evidence(catalog, bucket, config.bucket, row, {b.id: b for b in blocks})
