"""The erasure's reach outside the index: the records the leftover scan finds in objects no erase job rewrites and
no deletion will ever remove, erased by the erasure itself before its receipt (docs/design/erasure.md 19.5).

* A **restore dead letter** (``<tenant>/restore-dead-letters/<job>/<partition>-<offset>.json``) holds one record
  whole, key and value: it is rewritten in place as a stub (``erased_stub``) that keeps the source position, the
  job and the reason and names the erasure, without the key, the value, the headers or the time. The object stays
  so that ``shale restore offsets`` still knows the restore did not send that record (an erased record was not
  in the target for that reason, not for the erasure).
* A **quarantined block** (``shale bucket repair``: damaged, its records found nowhere else, kept for ever) keeps its
  intact data objects: each one holding a record of the erasure is rewritten in place without those rows (same key;
  its other rows, schema and Shale footer kept). The block stays quarantined: its meta.json's size and CRC32 no
  longer match that object, which repair already treats as damage, and readers never read a quarantined block. A
  quarantined block recovered later enters the index through ``ReplaceBlocks``, where the erasure's positions give
  it an erase job (19.2).

Every other leftover (a block tombstoned, marked, or unknown to the index) is deleted by the metastore leader in
time, or needs an operator (a dead letter commit refused): the receipt waits or refuses, it never deletes a block
readers may still read.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterable
from functools import partial
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shale.block import encode_parquet
from shale.erase.leftover import Leftover, Needle, block_meta, dead_letter_hits, parquet_hits
from shale.errors import NotFoundError, ShaleError
from shale.objstore import Bucket


def erasable(leftover: Leftover) -> bool:
    """Whether the erasure erases this leftover itself (``erase_outside``)."""
    return leftover.kind == "restore-dead-letter" or leftover.state == "quarantined"


STUB_FIELDS = ("job", "topic", "incarnation", "target_topic", "partition", "offset", "block", "size",
               "max_message_bytes", "reason")
"""What a dead letter's stub keeps of it (``shale.restore.task``): the record's place, never its content."""


def erased_stub(dead_letter: bytes, erasure: str) -> bytes:
    """A dead letter without its record: its place and why it was dead-lettered, ``erased_by`` the erasure."""
    body = json.loads(dead_letter)
    stub = {k: body[k] for k in STUB_FIELDS if k in body}
    return json.dumps(stub | {"key": None, "value": None, "headers": [], "erased_by": erasure}).encode()


def erase_outside(bucket: Bucket, erasure: str, needle: Needle,
                  leftovers: Iterable[Leftover]) -> list[dict[str, Any]]:
    """Erase the records of ``needle`` (erasure ``erasure``'s) that ``leftovers`` found in dead letters and
    quarantined blocks; what was done per object (its key, the records removed, the SHA-256 before and after:
    never a key or a value). A rewritten object is read again: a record still there is an error. Idempotent."""
    done: list[dict[str, Any]] = []
    objects: dict[str, list[Leftover]] = {}
    for leftover in leftovers:
        if erasable(leftover):
            objects.setdefault(leftover.object, []).append(leftover)
    for key, found in sorted(objects.items()):
        kind, block = found[0].kind, found[0].block
        try:
            data = bucket.get(key)
        except NotFoundError:
            continue  # deleted meanwhile (a retried receipt): nothing left to erase
        entry: dict[str, Any] = {"object": key, "kind": kind, "block": block, "state": found[0].state,
                                 "sha256_before": hashlib.sha256(data).hexdigest()}
        if kind == "restore-dead-letter":
            if not dead_letter_hits(data, needle):
                continue
            stub = erased_stub(data, erasure)
            bucket.put(key, stub)
            entry |= {"records_removed": 1, "sha256_after": hashlib.sha256(stub).hexdigest()}
        else:
            meta = partial(block_meta, bucket, key)
            mask, hits = parquet_hits(pa.BufferReader(data), needle, meta)
            if not hits:
                continue
            kept = encode_parquet(pq.read_table(io.BytesIO(data)).filter(pc.invert(mask)))
            bucket.put(key, kept)
            if parquet_hits(pa.BufferReader(bucket.get(key)), needle, meta)[1]:
                raise ShaleError(f"{key}: rewritten without the erasure's records, it still holds some")
            entry |= {"records_removed": len(hits), "sha256_after": hashlib.sha256(kept).hexdigest(),
                      "bytes_before": len(data), "bytes_after": len(kept)}
        done.append(entry)
    return done
