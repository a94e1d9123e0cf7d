"""The leftover scan: every object under a tenant's prefixes in the bucket, read for an erasure's records, whatever
the index says (docs/design/erasure.md 19.5).

The index-driven scans (``shale.erase.scan``, the receipt's final scan) read the blocks the metastore serves. The
bucket holds more: blocks tombstoned or marked for deletion and not deleted yet, orphans (a lost lease's output, the
blocks of a dead letter commit the metastore refused), quarantined damaged blocks, the Iceberg copies, the restore
dead letters. This scan lists every object under ``scan_prefixes(tenant)`` and reads each one that can hold a
record:

* a Parquet object (a block's data object in any layout and state, an Iceberg copy): its position columns
  (``topic``, ``partition``, ``offset``, and ``incarnation`` where a merged dataset has it) and ``key`` (a key
  erasure: the SHA-256 of each distinct key) or the erased column's top-level field (a column erasure: the
  canonical form's SHA-256, ``shale.erase.column``); an object up to 1 MiB in one GET, a larger one by ranged
  reads of those columns only;
* a restore dead letter (``<tenant>/restore-dead-letters/``, the record whole as JSON): its key and position.

A row is a leftover when its key (or column value) is the erasure's and the record is part of the request
(``requested``: the erasure's topics, below its high watermarks; a record of the key produced later is new data),
or when it sits at one of the positions the erasure recorded (either group: a partition row's key is whatever its
parser made of it). The other objects (meta.json, marks, the bucket index and its deltas, receipts) hold no record
and are listed and counted, not read. An object that cannot be read as what its name says cannot be shown free of
the key: it is ``unreadable``, unless its block's meta.json gives it to a topic the erasure does not name.

The scan needs no key: it compares hashes, so an auditor holding only the receipt runs the same scan
(``shale erase audit``). It never writes; ``Metered`` counts what it reads.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shale.block import (
    DELETION_MARK_SUFFIX,
    INCARNATION_COLUMN,
    META_FILENAME,
    QUARANTINE_MARK_SUFFIX,
    RESTORE_DEAD_LETTERS_DIR,
    BlockMeta,
    BucketFile,
    blocks_prefixes,
    markers_prefix,
    parse_block_key,
    parse_mark_key,
    parse_meta,
    row_incarnation_names,
)
from shale.erase.column import column_values, matching
from shale.errors import NotFoundError
from shale.metastore import Watermarks
from shale.objstore import BucketReader, ObjectInfo

Position = tuple[str, int, int, str]
"""(topic, partition, offset, incarnation); incarnation '' where it could not be told (matches any)."""

POSITION_COLUMNS = ("topic", "partition", "offset")
WHOLE_OBJECT_BYTES = 1 << 20
"""An object up to this size is fetched whole (``shale.block.reader``'s ``SMALL_OBJECT_BYTES`` too)."""
ICEBERG_COPIES_DIR = "iceberg-copies"
"""``shale.iceberg.files.COPIES_DIR``: the erase package cannot import the Iceberg one (layering)."""
NOT_SEARCHED = (
    "Iceberg metadata under the catalog's warehouse of files registered before 2026-12-04 (manifests then kept "
    "each data file's column bounds, a value's first 16 bytes, also in the DELETED entry of the snapshot that "
    "removes the file: a key or value of the erased records may remain there; tables keep no bounds of record "
    "contents since)",
    "the metastore's Raft journal until its next snapshot, for requests made before 2026-12-04 (their log "
    "entries carry the key; requests since carry its SHA-256 only)",
)
"""What Shale writes that this scan does not read, named in every receipt."""


@dataclass(frozen=True)
class Needle:
    """What an erasure looks for: the SHA-256 of its key (or of its column value's canonical form, ``column``), its
    topics (empty: all), its high watermarks and the positions it recorded."""

    sha256: str
    column: str = ""
    topics: frozenset[str] = frozenset()
    marks: Watermarks = field(default_factory=lambda: Watermarks([]))
    positions: frozenset[Position] = frozenset()

    @classmethod
    def of(cls, erasure: Mapping[str, Any]) -> Needle:
        """From an ``erasures`` row or a receipt (both name the same fields)."""
        topics = erasure["topics"]
        matched = str(erasure["matched_by"])
        return cls(sha256=str(erasure["key_sha256"]),
                   column=matched.removeprefix("column:") if matched != "key" else "",
                   topics=frozenset(topics if isinstance(topics, list) else ()),
                   marks=Watermarks(erasure["watermarks"]),
                   positions=frozenset((str(t), int(p), int(o), str(i)) for t, p, o, i in erasure["positions"]))

    def requested(self, topic: str, partition: int, incarnation: str, offset: int) -> bool:
        """Whether a record of the key (or value) at this position is part of the request: one of its topics and
        not produced after it (``Watermarks``: a watermark bounds its own incarnation; a record whose incarnation
        is unknown, at or past the end, is the request's ``undecided`` and not erased, so not a leftover)."""
        if self.topics and topic not in self.topics:
            return False
        return not self.marks.produced_later(topic, partition, offset, incarnation)

    def at_position(self, topic: str, partition: int, offset: int, incarnation: str) -> bool:
        if not self.positions:
            return False
        return any((topic, partition, offset, i) in self.positions for i in {incarnation, ""}) or (
            not incarnation and any(p[:3] == (topic, partition, offset) for p in self.positions))


@dataclass(frozen=True)
class Leftover:
    """A record of the erasure found in the bucket: the object holding it, what the object is, and where."""

    object: str
    kind: str
    """``block`` (a block's data object), ``iceberg-copy``, ``restore-dead-letter`` or ``stray`` (a Parquet object
    where the layout names none)."""
    state: str
    """A block's state: ``indexed``, ``marked`` (a deletion mark: the leader deletes it after the delay),
    ``quarantined`` or ``unindexed`` (neither indexed nor marked: tombstoned and not marked yet, or an orphan the
    leader's bucket scan has not marked yet); '' for an object that is not a block's."""
    block: str
    why: str
    """``key``, ``value`` (a column erasure's value) or ``position`` (an erased position)."""
    topic: str
    partition: int
    offset: int

    def to_dict(self) -> dict[str, Any]:
        return {"object": self.object, "kind": self.kind, "state": self.state, "block": self.block,
                "why": self.why, "topic": self.topic, "partition": self.partition, "offset": self.offset}


@dataclass
class LeftoverScan:
    prefixes: list[str]
    objects: int = 0
    """Objects listed under the prefixes."""
    bytes: int = 0
    """Their total size."""
    objects_read: int = 0
    """Objects that can hold a record, read."""
    bytes_read: int = 0
    """Bytes received reading them (footers, the columns searched, dead letters)."""
    leftovers: list[Leftover] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    """Objects that cannot be read as what their names say: they cannot be shown free of the key."""
    gone: int = 0
    """Objects deleted between the LIST and their read."""
    unreadable_elsewhere: list[str] = field(default_factory=list)
    """Unreadable block data objects that their block's meta.json gives to a topic the erasure does not name."""

    def summary(self) -> dict[str, Any]:
        """What a receipt states of the scan (object keys, never a key or a value)."""
        return {"prefixes": self.prefixes, "objects_listed": self.objects, "bytes_listed": self.bytes,
                "objects_read": self.objects_read, "bytes_read": self.bytes_read, "gone_while_read": self.gone,
                "leftovers": len(self.leftovers), "unreadable": len(self.unreadable),
                "unreadable_of_other_topics": self.unreadable_elsewhere,
                "not_searched": list(NOT_SEARCHED)}


class Metered:
    """A read-only bucket that counts the bytes it receives (not thread-safe)."""

    def __init__(self, bucket: BucketReader) -> None:
        self._bucket = bucket
        self.bytes_read = 0

    @property
    def url(self) -> str:
        return self._bucket.url

    def get(self, key: str) -> bytes:
        data = self._bucket.get(key)
        self.bytes_read += len(data)
        return data

    def get_range(self, key: str, start: int, end: int) -> bytes:
        data = self._bucket.get_range(key, start, end)
        self.bytes_read += len(data)
        return data

    def head(self, key: str) -> ObjectInfo:
        return self._bucket.head(key)

    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectInfo]:
        return self._bucket.list(prefix, start_after)

    def list_dirs(self, prefix: str = "") -> Sequence[str]:
        return self._bucket.list_dirs(prefix)


def scan_prefixes(tenant: str) -> list[str]:
    """Every prefix Shale writes a tenant's objects under: its groups' block prefixes and its own folder (blocks of
    the first layout, marks, Iceberg copies, restore dead letters, receipts, the bucket index)."""
    return [p for p in blocks_prefixes(tenant) if p.startswith("group=")] + [f"{tenant}/"]


def scan_leftovers(bucket: BucketReader, tenant: str, needle: Needle,
                   indexed: Collection[str] = ()) -> LeftoverScan:
    """Read every object under ``scan_prefixes(tenant)`` that can hold a record for ``needle``'s records.
    ``indexed`` (the live blocks' ids, from the metastore when it is at hand) only names the state of a block
    found holding one; the others are ``marked``, ``quarantined`` or ``unindexed`` by their marks in the bucket."""
    metered = Metered(bucket)
    scan = LeftoverScan(prefixes=scan_prefixes(tenant))
    marks = [i.key for i in bucket.list(markers_prefix(tenant))]  # small: one mark per block waiting or kept
    marked = {mark[1] for key in marks if (mark := parse_mark_key(key, DELETION_MARK_SUFFIX))}
    quarantined = {mark[1] for key in marks if (mark := parse_mark_key(key, QUARANTINE_MARK_SUFFIX))}

    def state(block: str) -> str:
        if block in quarantined:
            return "quarantined"
        if block in marked:
            return "marked"
        return "indexed" if block in indexed else "unindexed"

    for info in (info for prefix in scan.prefixes for info in bucket.list(prefix)):  # streamed, not held
        scan.objects += 1
        scan.bytes += info.size
        kind, block = object_kind(tenant, info.key)
        if not kind:
            continue
        scan.objects_read += 1
        try:
            if kind == "restore-dead-letter":
                found = dead_letter_hits(metered.get(info.key), needle)
            else:
                meta = partial(block_meta, metered, info.key) if kind == "block" else _no_meta
                found = parquet_hits(parquet_source(metered, info.key, info.size), needle, meta)[1]
        except NotFoundError:
            scan.gone += 1  # deleted since it was listed (the leader's deletions go on): it holds nothing now
            continue
        except Exception:
            if _out_of_scope(metered, info.key, needle):
                scan.unreadable_elsewhere.append(info.key)
            else:
                scan.unreadable.append(info.key)
            continue
        scan.leftovers.extend(Leftover(info.key, kind, state(block) if block else "", block, *hit) for hit in found)
    scan.bytes_read = metered.bytes_read
    return scan


def _no_meta() -> BlockMeta | None:
    return None


def audit(bucket: BucketReader, receipt: Mapping[str, Any]) -> LeftoverScan:
    """The leftover scan of a receipt's erasure, run again now (``shale erase audit``): the receipt names the
    tenant, the key's SHA-256, the topics, the watermarks and the positions, so no key and no metastore is needed.
    A block's state comes from its marks only (``unindexed`` includes the live ones)."""
    return scan_leftovers(bucket, str(receipt["tenant"]), Needle.of(receipt))


def object_kind(tenant: str, key: str) -> tuple[str, str]:
    """(kind, block id) of an object that can hold a record (``block``, ``iceberg-copy``, ``restore-dead-letter``,
    or ``stray``: a Parquet object the layout does not name), or ('', '') for one that cannot (metadata)."""
    parsed = parse_block_key(key)
    if parsed is not None:
        return ("block", parsed.block_id) if parsed.name != META_FILENAME else ("", "")  # every data object
    parts = key.split("/")
    if len(parts) == 3 and parts[0] == tenant and parts[1] == ICEBERG_COPIES_DIR and parts[2].endswith(".parquet"):
        return "iceberg-copy", parts[2][:26]
    if len(parts) == 4 and parts[0] == tenant and parts[1] == RESTORE_DEAD_LETTERS_DIR:
        return "restore-dead-letter", ""
    if key.endswith(".parquet"):
        return "stray", ""  # a Parquet object where the layout names none (a hand copy, a foreign writer): read
    return "", ""


def _out_of_scope(bucket: BucketReader, key: str, needle: Needle) -> bool:
    """Whether an unreadable block data object is, by its block's meta.json, a dataset of a topic the erasure does
    not name (it then cannot hold one of its records, as far as that meta.json tells)."""
    parsed = parse_block_key(key)
    meta = block_meta(bucket, key)
    if not needle.topics or parsed is None or meta is None:
        return False
    topics = {d.topic for d in meta.datasets if d.file == parsed.name}
    return bool(topics) and not topics & needle.topics


def block_meta(bucket: BucketReader, key: str) -> BlockMeta | None:
    """The meta.json of the block folder holding ``key``, or None: none, or not readable (the rows then say their
    own incarnation, or none)."""
    parsed = parse_block_key(key)
    if parsed is None:
        return None
    try:
        return parse_meta(bucket.get(parsed.prefix + META_FILENAME), where=parsed.prefix + META_FILENAME)
    except Exception:
        return None


Hit = tuple[str, str, int, int]
"""(why, topic, partition, offset)."""


def parquet_source(bucket: BucketReader, key: str, size: int) -> pa.NativeFile | BucketFile:
    """A Parquet object to read: fetched whole in one GET when small (``WHOLE_OBJECT_BYTES``: fewer requests, and
    no more bytes than a footer and its column chunks read apart), else read by ranges, the needed ones only."""
    if size <= WHOLE_OBJECT_BYTES:
        return pa.BufferReader(bucket.get(key))
    return BucketFile(bucket, key, size)


def parquet_hits(source: pa.NativeFile | BucketFile, needle: Needle,
                 meta: Callable[[], BlockMeta | None]) -> tuple[pa.Array, list[Hit]]:
    """The rows of a Parquet object (``parquet_source``) that are the erasure's: a mask over its rows and each hit.
    Reads only the position columns and the one searched; ``meta`` (its block's, for the rows' incarnations) is
    asked for only when a row may be a hit."""
    parquet = pq.ParquetFile(source)
    names = set(parquet.schema_arrow.names)
    searched = needle.column.split(".", 1)[0] if needle.column else "key"
    columns = [c for c in (*POSITION_COLUMNS, INCARNATION_COLUMN, searched) if c in names]
    table = parquet.read(columns=columns)
    rows = table.num_rows
    found = _hash_mask(table, needle) if searched in names and rows else pa.array([False] * rows, pa.bool_())
    offsets = {o for _, _, o, _ in needle.positions}
    near = (pc.is_in(table.column("offset").combine_chunks(), value_set=pa.array(sorted(offsets), pa.int64()))
            if offsets and "offset" in names and rows else pa.array([False] * rows, pa.bool_()))
    candidates = pc.indices_nonzero(pc.fill_null(pc.or_(found, near), False))
    if not len(candidates):
        return pa.array([False] * rows, pa.bool_()), []
    some = table.take(candidates)
    count = some.num_rows

    def column(name: str, default: object) -> list[Any]:
        return some.column(name).to_pylist() if name in names else [default] * count

    by_value = found.take(candidates).to_pylist()
    hits: list[Hit] = []
    mask = [False] * rows
    for row, hashed, t, p, o, inc in zip(candidates.to_pylist(), by_value, column("topic", ""),
                                         column("partition", -1), column("offset", -1),
                                         _incarnations(some, meta()), strict=True):
        if hashed and needle.requested(t, p, inc, o):
            why = "value" if needle.column else "key"
        elif needle.at_position(t, p, o, inc):
            why = "position"
        else:
            continue
        mask[row] = True
        hits.append((why, t, p, o))
    return pa.array(mask, pa.bool_()), hits


def _hash_mask(table: pa.Table, needle: Needle) -> pa.Array:
    """Rows whose key's (or column value's canonical form's) SHA-256 is the needle's: each distinct key is hashed
    once."""
    if needle.column:
        try:
            return matching(column_values(table, needle.column), needle.sha256)
        except Exception:  # the object has the top-level field but not the path, or another kind: no value
            return pa.array([False] * table.num_rows, pa.bool_())
    keys = table.column("key")
    wanted = [k for k in pc.unique(keys).to_pylist() if k is not None
              and hashlib.sha256(k if isinstance(k, bytes) else str(k).encode()).hexdigest() == needle.sha256]
    if not wanted:
        return pa.array([False] * table.num_rows, pa.bool_())
    return pc.fill_null(pc.is_in(keys, value_set=pa.array(wanted, keys.type)), False).combine_chunks()


def _incarnations(table: pa.Table, meta: BlockMeta | None) -> list[str]:
    """Each row's topic incarnation: its own column, the block's ranges, or '' (unknown)."""
    if meta is not None and "partition" in table.column_names and "offset" in table.column_names:
        out: list[str] = [""] * table.num_rows
        topics = table.column("topic").to_pylist() if "topic" in table.column_names else [""] * table.num_rows
        for topic in set(topics):
            rows = [i for i, t in enumerate(topics) if t == topic]
            names = row_incarnation_names(meta, topic, table.take(pa.array(rows, pa.int64()))).to_pylist()
            for i, name in zip(rows, names, strict=True):
                out[i] = name or ""
        return out
    if INCARNATION_COLUMN in table.column_names:
        return [v or "" for v in table.column(INCARNATION_COLUMN).cast(pa.string()).to_pylist()]
    return [""] * table.num_rows


def dead_letter_hits(data: bytes, needle: Needle) -> list[Hit]:
    """Whether a restore dead letter (``shale.restore.task``) holds a record of the erasure: its key, or its
    source position (a column erasure: the value's bytes are the writer's, not parsed)."""
    body = json.loads(data)
    if body.get("erased_by") and body.get("key") is None and body.get("value") is None and not body.get("headers"):
        return []  # an erasure's stub (shale.erase.outside): the place of a record, nothing of it
    topic, partition, offset = str(body["topic"]), int(body["partition"]), int(body["offset"])
    incarnation = str(body.get("incarnation") or "")
    if not needle.column and body.get("key") is not None:
        try:
            key = base64.b64decode(body["key"], validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("a dead letter's key is not base64") from None
        if hashlib.sha256(key).hexdigest() == needle.sha256 and needle.requested(topic, partition, incarnation,
                                                                                   offset):
            return [("key", topic, partition, offset)]
    if needle.at_position(topic, partition, offset, incarnation):
        return [("position", topic, partition, offset)]
    return []
