"""``BucketIndex``: the versioned record in ``<tenant>/bucket-index.json.gz`` (seed 001), and the rule that turns
its entries into the blocks a reader may read.

The object is gzip-compressed JSON::

    {"version": 2, "tenant": "acme", "updated_at": 1795000000.0, "watermark": "<delta key or empty>",
     "blocks": [<meta.json of each block, without null fields, Kafka ranges and row groups>],
     "deletion_marks": [{"id": "01J...", "deletion_time": 1795000000.0, "reason": "compacted"}],
     "uploaded": {"01J...": 1795000000.0}, "tenant_version": 57}

* ``updated_at`` (seconds since the epoch, the writer's clock) is the index's freshness claim: it holds every
  change its source knew of at that time. Readers refuse an index older than ``max_stale_period``.
* ``watermark`` is the newest delta object (see ``deltas``) whose change the index is known to hold; readers in
  stale-tolerant mode apply only the deltas after it.
* ``blocks`` keeps each block's ``BlockMeta`` without what grows with the partitions it spans (``SUMMARY_EXCLUDE``:
  its Kafka ranges and its datasets' row groups), closer to seed 001's subset: the query path prunes by time,
  labels, datasets, files and compaction sources straight from the entries, and reads the meta.json of the blocks
  it selects for their Kafka ranges (``BucketIndexReader.full_meta``). Parsed entries say so (``BlockMeta.summary``).
  Version 1 (the previous release) kept each full ``BlockMeta``; it is still read, its entries as full metas.
* ``deletion_marks`` are blocks marked for deletion; a marked block may still be listed in ``blocks`` (it is
  readable by nobody, and deleted after the delay).
* ``uploaded`` is when each block was first seen by an index writer (or its newest object's upload time).
* ``tenant_version`` is the metastore's version of the tenant (the log index of its last change) that the
  writer's source reflected; absent in an index built from a bucket scan. Stale-tolerant readers follow the
  deltas' links from it (``deltas.follow_chain``).

A malformed index, an index of another tenant and an index of an unknown version are ``CorruptObjectError``s
naming the tenant and the key. Unknown fields are refused too: a newer Shale bumps ``version`` when it adds a
required one or drops one (version 2 dropped the entries' Kafka ranges, and a reader of version 1 refuses it,
saying to upgrade); an optional one (``tenant_version``, added later) keeps the version, and a reader of a release
that predates it refuses such an index, so readers are upgraded before the metastore (docs/DEPLOY.md).
"""

from __future__ import annotations

import gc
import gzip
import hashlib
import json
import threading
import zlib
from collections import defaultdict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from shale.block import BlockMeta, check_block_id, check_tenant
from shale.errors import CorruptObjectError

if TYPE_CHECKING:
    from pydantic.main import IncEx

INDEX_VERSION: Literal[2] = 2
READ_VERSIONS = (1, 2)
_ROW_GROUPS: IncEx = {"row_groups", "row_group_partitions"}
_EVERY_DATASET: IncEx = {"__all__": _ROW_GROUPS}
SUMMARY_EXCLUDE: IncEx = {"kafka": True, "datasets": _EVERY_DATASET}
"""What an index entry (version 2) leaves out of a block's meta.json: what grows with the partitions it spans."""
REBUILD_HINT = "rebuild it with `shale bucket index --tenant {tenant}` or let the metastore leader rewrite it"


class IndexedMark(BaseModel):
    """A deletion mark as the index keeps it: which block, since when (seconds since the epoch), and why."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    deletion_time: float
    reason: str = ""

    @model_validator(mode="after")
    def _valid_id(self) -> IndexedMark:
        check_block_id(self.id)
        return self


class BucketIndex(BaseModel):
    """One tenant's blocks and deletion marks. Immutable; writers build a new one for every write."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1, 2] = INDEX_VERSION
    tenant: str
    updated_at: float = Field(description="the writer's clock when it read its source, seconds since the epoch")
    watermark: str = Field(default="", description="the newest delta key whose change this index holds")
    blocks: list[BlockMeta] = Field(default_factory=list)
    deletion_marks: list[IndexedMark] = Field(default_factory=list)
    uploaded: dict[str, float] = Field(default_factory=dict, description="block id -> seconds since the epoch")
    generations: list[tuple[str, int, int, int]] | None = Field(
        default=None, description="the tenant's generation switches, oldest first: (topic, start ms, end ms, "
                                  "generation), as the metastore holds them; None when the writer could not know "
                                  "them (an index written from a bucket scan alone)")
    tenant_version: int | None = Field(default=None, ge=0, description="the metastore's version of the tenant "
                                       "that the writer's source reflected; None: built from a bucket scan")

    @model_validator(mode="after")
    def _consistent(self) -> BucketIndex:
        check_tenant(self.tenant)
        ids = [b.id for b in self.blocks]
        if len(set(ids)) != len(ids):
            raise ValueError("a block id appears twice in blocks")
        strangers = sorted({b.tenant for b in self.blocks} - {self.tenant})
        if strangers:
            raise ValueError(f"blocks of other tenants {strangers} in the index of {self.tenant}")
        marks = [m.id for m in self.deletion_marks]
        if len(set(marks)) != len(marks):
            raise ValueError("a block id appears twice in deletion_marks")
        return self

    @classmethod
    def empty(cls, tenant: str, updated_at: float = 0.0) -> BucketIndex:
        return cls(tenant=tenant, updated_at=updated_at)

    @classmethod
    def build(cls, tenant: str, updated_at: float, blocks: Iterable[BlockMeta], marks: Iterable[IndexedMark] = (),
              uploaded: dict[str, float] | None = None, watermark: str = "",
              generations: list[tuple[str, int, int, int]] | None = None,
              tenant_version: int | None = None) -> BucketIndex:
        """An index with blocks and marks in id order (so equal contents give equal bytes), and ``uploaded``
        limited to the blocks it lists."""
        by_id = {b.id: b for b in blocks}
        times = uploaded or {}
        return cls(tenant=tenant, updated_at=updated_at, watermark=watermark, generations=generations,
                   tenant_version=tenant_version,
                   blocks=[by_id[i] for i in sorted(by_id)],
                   deletion_marks=sorted({m.id: m for m in marks}.values(), key=lambda m: m.id),
                   uploaded={i: times[i] for i in sorted(by_id) if i in times})

    def to_bytes(self) -> bytes:
        """Gzip-compressed JSON of version ``INDEX_VERSION``, without null fields, each block as its index entry
        (``SUMMARY_EXCLUDE``). ``mtime=0`` keeps the bytes a function of the contents.

        The same bytes as ``model_dump_json`` of the whole index, but the blocks are serialized one at a time:
        pydantic holds the GIL for the whole of one call, and on the metastore leader one call over an index of
        tens of thousands of blocks held it for hundreds of milliseconds, long enough for the Raft heartbeats to
        stop and the followers to elect another leader (issue 44). gzip releases the GIL as it compresses."""
        head = self.model_copy(update={"blocks": [], "version": INDEX_VERSION}).model_dump_json(exclude_none=True)
        blocks = ",".join(b.model_dump_json(exclude_none=True, exclude=SUMMARY_EXCLUDE) for b in self.blocks)
        text = head.replace('"blocks":[]', f'"blocks":[{blocks}]', 1)
        return gzip.compress(text.encode(), compresslevel=6, mtime=0)

    @classmethod
    def parse(cls, data: bytes, *, tenant: str, key: str) -> BucketIndex:
        """Decode and validate the object at ``key``; any problem is a ``CorruptObjectError`` naming both."""
        try:
            raw = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise CorruptObjectError(
                f"{key}: the bucket index of tenant {tenant} is not gzip data ({exc}); "
                + REBUILD_HINT.format(tenant=tenant), key=key) from None
        try:
            with _COLLECTOR_PAUSE:
                index = cls.model_validate_json(raw)
        except ValidationError as exc:
            version = peek_version(raw)
            if version is not None and version not in READ_VERSIONS:
                raise CorruptObjectError(
                    f"{key}: the bucket index of tenant {tenant} has version {version!r}; this Shale reads versions "
                    f"{', '.join(map(str, READ_VERSIONS))}. Upgrade Shale to read it.", key=key) from None
            problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}"
                                 for e in exc.errors()[:5])
            raise CorruptObjectError(
                f"{key}: the bucket index of tenant {tenant} is invalid ({problems}); "
                + REBUILD_HINT.format(tenant=tenant), key=key) from None
        if index.tenant != tenant:
            raise CorruptObjectError(
                f"{key}: the bucket index of tenant {tenant} says it belongs to tenant {index.tenant}; "
                + REBUILD_HINT.format(tenant=tenant), key=key)
        if index.version >= 2:
            for block in index.blocks:  # what BlockMeta.summary reads (set once, before anyone sees the block)
                block.__pydantic_private__["_summary"] = True  # type: ignore[index]
        return index

    def block_ids(self) -> set[str]:
        return {b.id for b in self.blocks}

    def marked_ids(self) -> set[str]:
        return {m.id for m in self.deletion_marks}


class _CollectorPause:
    """Pauses CPython's cyclic garbage collector while an index is parsed and its live blocks computed;
    process-wide and shared by threads (the collector is re-enabled when the last pause ends, and only if it was
    enabled before).

    Parsing an index builds some 25 tracked containers per block, all still alive when it ends, so a collection
    during it can free nothing; yet every 700 allocations trigger one, and the survivors pushed into the old
    generation trigger full passes over the whole heap. Pausing is safe (other threads' garbage is collected
    once the pause ends), and it pays: on 100 indexes of 400 blocks, parsing took 2.6 s instead of 5.8 s, and a
    reader's cold start on a memory bucket 3.4 s with ``live_blocks`` paused as well, 4.3 s without.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active = 0
        self._resume = False

    def __enter__(self) -> None:
        with self._lock:
            if self._active == 0:
                self._resume = gc.isenabled()
                gc.disable()
            self._active += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._active -= 1
            if self._active == 0 and self._resume:
                gc.enable()


_COLLECTOR_PAUSE = _CollectorPause()


def peek_version(raw: bytes) -> object:
    """The ``version`` field of a JSON object, or None if ``raw`` is not a JSON object."""
    try:
        value = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return value.get("version") if isinstance(value, dict) else None


def live_blocks(index: BucketIndex) -> list[BlockMeta]:
    """The blocks a reader may read, in id order: not marked for deletion, and not HealthyOverlapped.

    Seed 000's full-overlap rule, as ``shale.block.fetcher`` applies it to a bucket scan: among unmarked blocks,
    a block whose compaction sources are all inside another block's sources is replaced by that block; equal
    source sets (the same compaction done twice) keep the greater id. Marked blocks take no part, so a compacted
    block that is itself marked does not hide its sources.
    """
    with _COLLECTOR_PAUSE:
        return _live_blocks(index)


def _live_blocks(index: BucketIndex) -> list[BlockMeta]:
    marked = index.marked_ids()
    candidates = [b for b in index.blocks if b.id not in marked]
    sources = {b.id: frozenset(b.compaction.sources) for b in candidates}
    by_source: dict[str, list[BlockMeta]] = defaultdict(list)
    for block in candidates:
        for source in sources[block.id]:
            by_source[source].append(block)
    live = []
    for block in candidates:
        mine = sources[block.id]
        # Any block whose sources contain all of mine contains my smallest source, so one lookup finds them all.
        rivals = by_source[min(mine)] if mine else []
        if not any(other.id != block.id and (mine < sources[other.id] or
                                             (mine == sources[other.id] and other.id > block.id))
                   for other in rivals):
            live.append(block)
    return sorted(live, key=lambda b: b.id)


Rule = tuple[str, int, int, int]
"""A generation switch: (topic, start ms, end ms, generation)."""


SET_HASH_MODULUS = 2**256
DIGEST_FORM = "s1:"
"""The prefix of a digest of the set-hash form (``state_digest``); a digest without it is of the first form
(``legacy_state_digest``), as metastores before this one stamped it."""


def block_id_hash(block_id: str) -> int:
    """One block id's term of a tenant's set hash: its SHA-256 as a 256-bit number."""
    return int.from_bytes(hashlib.sha256(block_id.encode()).digest(), "big")


def set_hash(ids: Iterable[str]) -> int:
    """The sum modulo 2**256 of the ids' ``block_id_hash``: equal for equal sets whatever their order, and kept up
    to date by adding what a change adds and subtracting what it removes (the metastore keeps one per tenant, so a
    command's digest costs what the command changes, not the tenant's history). A sum rather than a XOR: an id
    counted twice by mistake changes it."""
    return sum(block_id_hash(i) for i in ids) % SET_HASH_MODULUS


def _rules_text(generations: Iterable[Rule] | None) -> str:
    # Stable by topic: each topic's switches keep their order (a tuple again: a JSON delta gives lists).
    rules = sorted(((str(t), int(s), int(e), int(g)) for t, s, e, g in generations or ()), key=lambda r: r[0])
    return json.dumps(rules, separators=(",", ":"))


def digest_of_set(block_set_hash: int, generations: Iterable[Rule] | None) -> str:
    """``state_digest`` from the tenant's ``set_hash`` instead of its ids."""
    text = f"{block_set_hash % SET_HASH_MODULUS:064x}\n{_rules_text(generations)}"
    return DIGEST_FORM + hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def state_digest(live_ids: Iterable[str], generations: Iterable[Rule] | None) -> str:
    """A digest of what a tenant's queries can return: the ids of its blocks that are not marked for deletion
    (in the metastore: its blocks, tombstoned ones excluded) and its generation switches (each topic's in their
    order; no switches and unknown switches digest alike). The metastore stamps it on every delta link
    (``deltas.DeltaLink.digest``), and a stale-tolerant reader's view counts as fresh as of a change only if the
    view digests the same: a change the deltas did not carry cannot hide behind a chain without holes.

    The ids enter through their ``set_hash``, which the metastore keeps per tenant; a digest of the first form
    (``legacy_state_digest``, from a metastore of before) is still checked in that form (``view_digest``)."""
    return digest_of_set(set_hash(live_ids), generations)


def legacy_state_digest(live_ids: Iterable[str], generations: Iterable[Rule] | None) -> str:
    """The first form of ``state_digest``: BLAKE2b of every id, sorted, and the switches. Computing it reads and
    sorts the tenant's whole history, which made every command's cost grow with it; links stamped by a metastore of
    before carry it, and readers still check them."""
    text = "\n".join(sorted(live_ids)) + "\n\n" + _rules_text(generations)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def view_digest(index: BucketIndex, form: str | None = None) -> str:
    """``state_digest`` of an index (or a view with deltas applied), in the form of the digest ``form`` (a link's:
    the first form if it lacks ``DIGEST_FORM``)."""
    marked = index.marked_ids()
    ids = (b.id for b in index.blocks if b.id not in marked)
    if form is not None and not form.startswith(DIGEST_FORM):
        return legacy_state_digest(ids, index.generations)
    return state_digest(ids, index.generations)
