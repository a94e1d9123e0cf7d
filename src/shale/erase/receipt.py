"""An erasure's receipt: what was done, checked again, kept in the bucket as an immutable object.

Written once every erase job is done and every replaced block's objects are gone from the bucket (the leader's
maintenance deletes them after the delete delay, which protects readers still reading them): the request (who,
when, tenant, topics, the key's SHA-256, the high watermarks), each block rewritten (old and new ids, the new data
objects' SHA-256, the records removed), each replaced block's objects confirmed gone, and a final scan: every live
backup block of the erasure's topics read for the key (by its SHA-256) and every live block of either group whose
ranges hold an erased position read at those positions, all finding nothing; then the leftover scan
(``shale.erase.leftover``): every object under the tenant's prefixes, whatever the index says, read for the key or
the positions. What it finds in restore dead letters and quarantined blocks the erasure erases itself
(``shale.erase.outside``, named in ``<tenant>/erasures/<id>/outside.json`` first); anything else makes the receipt
wait (a block the leader will delete) or refuse. It also names what was searched and what Shale cannot reach. The
object is written put-if-absent under ``<tenant>/erasures/<id>/receipt.json``; then ``RecordErasureReceipt`` marks
the erasure ``done``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa

from shale.block import META_FILENAME, BlockMeta, check_file_name, erasure_receipt_key, row_incarnation_names
from shale.compactor import erased_rows
from shale.config import KafkaConfig
from shale.erase.column import column_values, matching
from shale.erase.leftover import Leftover, LeftoverScan, Needle, scan_leftovers
from shale.erase.outside import erasable, erase_outside
from shale.erase.scan import column_datasets, holds, read_rows
from shale.erase.times import iso_ms
from shale.errors import ConflictError, NotFoundError, ShaleError
from shale.metastore import Commands, ErasureReads, RecordErasureReceipt, RestoreReads, TenantBlocks, Watermarks
from shale.objstore import Bucket


class ReceiptMetastore(TenantBlocks, ErasureReads, RestoreReads, Commands, Protocol):
    """What a receipt reads from the metastore, and records in it."""


IcebergCheck = Callable[[dict[str, Any], list[BlockMeta]], tuple[dict[str, Any], list[str]]]
"""What the tenant's Iceberg tables show of an erasure (its row, the tenant's live blocks): the evidence (tables,
snapshots expired, the retained snapshots' files scanned and their ``matches``) and what is still pending
(``shale.iceberg.erasure.receipt_check`` of the configuration)."""


class ReceiptNotReadyError(ShaleError):
    """The erasure is not finished yet (jobs left, or replaced objects still in the bucket)."""


@dataclass
class FinalScan:
    blocks: list[str] = field(default_factory=list)
    rows_read: int = 0
    matches: list[dict[str, Any]] = field(default_factory=list)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def final_scan(bucket: Bucket, blocks: list[BlockMeta], topics: list[str], key_sha256: str,
               positions: list[tuple[str, int, int, str]], marks: Watermarks | None = None,
               column: str = "") -> FinalScan:
    """Read every live block that could hold the key: backup blocks of ``topics`` (empty: any) for a key whose
    SHA-256 is ``key_sha256`` not produced after the request (``marks``, per incarnation: ``Watermarks``),
    and blocks of either group whose ranges hold a position, at the positions. With ``column`` (an erasure by a
    typed column's value), partition blocks' records datasets having the column are read for a value whose
    canonical form's SHA-256 is ``key_sha256`` instead of backup blocks for a key."""
    marks = marks or Watermarks([])
    scan = FinalScan()
    for block in blocks:
        if column:
            hashed = ({d.name for d, _ in column_datasets(block, column, set(topics))}
                      if block.group == "partition" else set())
        elif block.group == "backup":
            hashed = {d.name for d in block.datasets if not topics or d.topic in topics}
        else:
            hashed = set()
        at = positions and holds(block, positions)
        if not (hashed or at):
            continue
        scan.blocks.append(block.id)
        for dataset in block.datasets:
            extra = (column.split(".", 1)[0] if column else "key") if dataset.name in hashed else None
            table = read_rows(bucket, block, dataset, ["topic", "partition", "offset"] + ([extra] if extra else []))
            scan.rows_read += table.num_rows
            if extra:
                if column:
                    found = matching(column_values(table, column), key_sha256).to_pylist()
                else:
                    found = [k is not None and _sha256(k) == key_sha256 for k in table.column("key").to_pylist()]
                names = row_incarnation_names(block, dataset.topic, table).to_pylist()
                for partition, offset, name, hit in zip(table.column("partition").to_pylist(),
                                                        table.column("offset").to_pylist(), names, found, strict=True):
                    if hit and not marks.produced_later(dataset.topic, partition, offset, name or ""):
                        scan.matches.append({"block": block.id, "dataset": dataset.name,
                                             "why": "value" if column else "key",
                                             "partition": partition, "offset": offset})
            if at:
                hit = erased_rows(block, dataset.topic, table, positions)
                for offset in table.filter(pa.array(hit)).column("offset").to_pylist():
                    scan.matches.append({"block": block.id, "dataset": dataset.name, "why": "position",
                                         "offset": offset})
    return scan


def _gone(bucket: Bucket, prefix: str, files: list[dict[str, Any]]) -> tuple[bool, list[str]]:
    """Whether a block's objects under ``prefix`` (its folder, ``block_prefix``) are all gone, and their keys."""
    keys = [prefix + META_FILENAME, *(prefix + check_file_name(f["name"]) for f in files)]
    left = []
    for key in keys:
        try:
            bucket.head(key)
            left.append(key)
        except NotFoundError:
            pass
    return not left, keys


def kafka_retention(kafka: KafkaConfig, topics: list[str], requested_at: int) -> list[dict[str, Any]]:
    """Per topic, until when Kafka itself may still hold the erased records (Shale cannot delete them there)."""
    from confluent_kafka.admin import ConfigResource

    from shale.kafka import admin

    client = admin(kafka)
    out: list[dict[str, Any]] = []
    for topic in topics:
        try:
            (future,) = client.describe_configs([ConfigResource("topic", topic)]).values()
            entries = future.result(timeout=30)
        except Exception as exc:  # a deleted topic: Kafka holds nothing of it
            out.append({"topic": topic, "holds_until_ms": None, "note": f"not described by Kafka: {exc}"})
            continue
        policy = str(entries["cleanup.policy"].value) if "cleanup.policy" in entries else "delete"
        retention = int(entries["retention.ms"].value) if "retention.ms" in entries else -1
        segment = int(entries["segment.ms"].value) if "segment.ms" in entries else 0
        if "delete" in policy and retention >= 0:
            out.append({"topic": topic, "holds_until_ms": requested_at + retention + segment,
                        "holds_until_iso": iso_ms(requested_at + retention + segment),
                        "note": f"retention.ms {retention} and segment.ms {segment}: Kafka deletes whole segments, "
                                "so the records requested before the erasure are gone by then at the latest"})
        else:
            out.append({"topic": topic, "holds_until_ms": None,
                        "note": f"cleanup.policy {policy}, retention.ms {retention}: Kafka keeps the records until "
                                "a tombstone for the key is produced (compacted) or the records are deleted "
                                "(kafka-delete-records)"})
    return out


def write_receipt(metastore: ReceiptMetastore, bucket: Bucket, erasure: str, *,
                  kafka: KafkaConfig | None = None, iceberg: IcebergCheck | None = None) -> dict[str, Any]:
    """Check the erasure once more and write its receipt (once); the receipt. An erasure already ``done``
    returns the receipt in the bucket. With ``iceberg``, the tenant's Iceberg tables must no longer name a
    replaced block's file, the snapshots the erasure expired must be gone, and a scan of every file a retained
    snapshot names must find nothing."""
    rows = metastore.erasures(erasure)
    if not rows:
        raise NotFoundError(f"no erasure {erasure}")
    row = rows[0]
    key = erasure_receipt_key(row["tenant"], erasure)
    if row["state"] == "done":
        return dict(json.loads(bucket.get(key)))
    if row["state"] != "rewritten":
        raise ReceiptNotReadyError(f"erasure {erasure} is {row['state']}: {len(row['pending_jobs'])} erase jobs "
                                   "left for the compaction workers")
    tenant = row["tenant"]
    positions = [(t, int(p), int(o), i) for t, p, o, i in row["positions"]]
    rewritten: list[dict[str, Any]] = []
    deleted: list[dict[str, Any]] = []
    pending: list[dict[str, Any]] = []
    for b in row["blocks"]:
        hashes = {f["name"]: _sha256(bucket.get(b["new_prefix"] + check_file_name(f["name"])))
                  for f in b["new_files"]} if _alive(bucket, b["new_prefix"]) else {}
        rewritten.append({"old": b["old"], "new": b["new"], "group": b["group"], "generation": b["generation"],
                          "records_removed": b["rows_removed"], "old_files": b["old_files"],
                          "new_files": b["new_files"], "new_sha256": hashes})
        gone, keys = _gone(bucket, b["old_prefix"], b["old_files"])
        (deleted if gone else pending).append({"block": b["old"], "objects": keys, "gone": gone})
    if pending:
        raise ReceiptNotReadyError(
            f"erasure {erasure}: {len(pending)} replaced blocks still have objects in the bucket (marked for "
            "deletion; the metastore leader removes them after "
            + (f"the {row['delete_delay_ms'] / 1000:g} s asked for" if row["delete_delay_ms"] else "block.delete_delay")
            + "): "
            + ", ".join(p["block"] for p in pending[:5]))
    topics = list(row["topics"])
    marks = Watermarks(row["watermarks"])
    live = metastore.tenant_blocks(tenant)
    tables: dict[str, Any] | None = None
    if iceberg is not None:
        tables, waiting = iceberg(row, live)
        if waiting:
            raise ReceiptNotReadyError(f"erasure {erasure}: " + "; ".join(waiting))
    column = row["matched_by"].removeprefix("column:") if row["matched_by"] != "key" else ""
    scan = final_scan(bucket, live, topics, row["key_sha256"], positions, marks, column=column)
    found = scan.matches + (tables["matches"] if tables else [])
    if found:
        raise ShaleError(f"erasure {erasure}: the final scan found {len(found)} records still stored: "
                         f"{found[:5]}; no receipt is written")
    needle = Needle.of(row)
    leftovers = scan_leftovers(bucket, tenant, needle, indexed={b.id for b in live})
    check_leftovers(erasure, leftovers)
    outside = _erase_outside(bucket, erasure, key, needle, leftovers.leftovers)
    seen = sorted({t for t, _, _, _ in positions} | set(topics))
    receipt = {
        "erasure": erasure, "tenant": tenant, "topics": topics or "all", "key_sha256": row["key_sha256"],
        "matched_by": row["matched_by"],
        "requested_by": row["by"], "requested_at_ms": row["requested_at"],
        "requested_at_iso": iso_ms(row["requested_at"]), "watermarks": row["watermarks"],
        "delete_delay_ms": row["delete_delay_ms"] or "block.delete_delay",
        "records": len(positions), "positions": row["positions"], "rewritten_at_ms": row["ended_at"],
        "rewritten_at_iso": iso_ms(row["ended_at"]),
        "blocks_rewritten": rewritten, "objects_deleted": deleted,
        "records_removed_by_group": {g: sum(b["records_removed"] for b in rewritten if b["group"] == g)
                                     for g in ("backup", "partition")},
        "final_scan": {"blocks": len(scan.blocks), "block_ids": scan.blocks, "rows_read": scan.rows_read,
                       "iceberg_files": tables["files_read"] if tables else 0,
                       "iceberg_rows_read": tables["rows_read"] if tables else 0, "matches": 0},
        "leftover_scan": leftovers.summary() | {"erased_outside_index": outside},
        "iceberg": {"tables": tables["tables"]} if tables else "not checked (Iceberg is not enabled)",
        "not_reachable": {
            "kafka": kafka_retention(kafka, seen, row["requested_at"]) if kafka is not None else
            [{"topic": t, "holds_until_ms": None, "note": "Kafka was not asked"} for t in seen],
            "restores": [{"job": r["job"], "target": r["target"], "topic": r["topic"], "started_at": r["started_at"],
                          "started_at_iso": iso_ms(r["started_at"])}
                         for r in metastore.restores(1000) if r["tenant"] == tenant
                         and (not topics or r["topic"] in topics) and r["started_at"] < row["requested_at"]],
            "exports": "copies made outside Shale (query results written elsewhere, tables or files copied out of "
                       "Shale's Iceberg tables, backups of the bucket"
                       + ("" if tables else ", Shale's Iceberg tables themselves: not checked") +
                       ") are not covered by this receipt",
        },
    }
    # An earlier attempt that wrote it and did not record it: that receipt stands (it is never replaced).
    with contextlib.suppress(ConflictError):
        bucket.put_if_absent(key, json.dumps(receipt, indent=1, sort_keys=True).encode())
    metastore.submit(RecordErasureReceipt(id=erasure, key=key)).raise_for_rejection()
    return dict(json.loads(bucket.get(key)))


WHAT_NEXT = {
    "marked": "marked for deletion: the metastore leader deletes them after the delete delay",
    "unindexed": "not in the index and not marked yet (tombstoned shortly before, or an orphan of a lost lease or "
                 "a refused dead letter commit): the leader marks and deletes them (a tombstoned block once "
                 "block.sync_delay old, an orphan after its bucket scan), unless a commit in _shale/dlq-rejected/ "
                 "holds one (replay it, after which the erasure rewrites the block, or acknowledge the loss with "
                 "`shale offsets acknowledge-loss`)",
    "iceberg-copy": "in Iceberg copies: the publisher's copy sweep deletes them once no snapshot names them",
    "indexed": "in a block the index serves: run the same `shale erase` again",
    "stray": "where Shale's layout names none (copied there by hand, or by another writer): delete them or move "
             "them out of the tenant's prefixes",
}


def check_leftovers(erasure: str, scan: LeftoverScan) -> None:
    """Nothing left that the erasure does not erase itself (``shale.erase.outside``), or why not: a
    ``ReceiptNotReadyError`` while every leftover will be deleted in time, a ``ShaleError`` otherwise. Names the
    objects, never the key."""
    if scan.unreadable:
        raise ShaleError(f"erasure {erasure}: {len(scan.unreadable)} objects under the tenant's prefixes cannot be "
                         "read, so they cannot be shown free of the key (`shale bucket verify`, then repair or "
                         f"delete them): {', '.join(scan.unreadable[:10])}; no receipt is written")
    left = [f for f in scan.leftovers if not erasable(f)]
    if not left:
        return
    groups: dict[str, set[str]] = {}
    for f in left:
        groups.setdefault(f.kind if f.kind in ("iceberg-copy", "stray") else f.state, set()).add(f.object)
    said = "; ".join(f"{len(objects)} objects {WHAT_NEXT[why]}: {', '.join(sorted(objects)[:5])}"
                     for why, objects in sorted(groups.items()))
    error = ReceiptNotReadyError if set(groups) <= {"marked", "unindexed", "iceberg-copy"} else ShaleError
    raise error(f"erasure {erasure}: the leftover scan found {len(left)} records of the erasure in the bucket "
                f"outside the index's live blocks; {said}")


def _erase_outside(bucket: Bucket, erasure: str, receipt_key: str, needle: Needle,
                   leftovers: list[Leftover]) -> list[dict[str, Any]]:
    """Erase the dead letters and quarantined objects holding records of the erasure (``erase_outside``), named
    first in ``<tenant>/erasures/<id>/outside.json`` so that a receipt written after a crash still names them."""
    journal = receipt_key.removesuffix("receipt.json") + "outside.json"
    try:
        named: list[dict[str, Any]] = json.loads(bucket.get(journal))
    except NotFoundError:
        named = []
    known = {n["object"] for n in named}
    planned = [{"object": f.object, "kind": f.kind, "block": f.block, "state": f.state}
               for f in leftovers if erasable(f) and f.object not in known]
    if planned:
        named += list({p["object"]: p for p in planned}.values())
        bucket.put(journal, json.dumps(named, indent=1, sort_keys=True).encode())
    done = {d["object"]: d for d in erase_outside(bucket, erasure, needle, leftovers)}
    out = [n | done.get(n["object"], {}) for n in named]
    for entry in out:
        if "sha256_after" not in entry:  # erased by an attempt that stopped before its receipt: as it is now
            with contextlib.suppress(NotFoundError):
                entry["sha256_after"] = _sha256(bucket.get(entry["object"]))
    return out


def _alive(bucket: Bucket, prefix: str) -> bool:
    try:
        bucket.head(prefix + META_FILENAME)
        return True
    except NotFoundError:
        return False
