"""The block fetcher: a tenant's blocks and their states, from the bucket alone (seed 000).

One sync costs a LIST of each prefix the tenant's blocks may be under (``blocks_prefixes``: each group's, and
``<tenant>/blocks/`` of before; every object, 1,000 keys per page), one LIST of ``<tenant>/markers/``, and a GET of
each meta.json and deletion mark not seen before. Both are immutable, so they are cached for the fetcher's
lifetime: a steady-state sync costs the four LISTs only. A meta.json must place its block where it was found
(``shale.block.layout.block_prefix``), or the block is judged as one whose meta.json is invalid.

States::

    Fresh               younger than the sync delay: may still be uploading; not trusted by bucket scanners
    Healthy             complete (loadable meta.json) and older than the sync delay (or ignore_delay)
    Partial             no loadable meta.json after the sync delay: crashed upload or interrupted delete
    MarkedForDeletion   has a deletion mark; readers skip it, the cleaner removes it after the delete delay
    HealthyOverlapped   healthy, but a newer healthy block's compaction sources include all of its sources
    Quarantined         has a quarantine mark (damaged, records not recoverable): readers skip it, and it is
                        never judged Partial or deleted, whatever other mark it has

A block's age counts from the later of its ULID time and its newest object's last-modified time, so a block
whose id carries an old time (a deterministic id from old Kafka timestamps) is not judged Partial while it is
still being uploaded (the risk the seed names for writers that were partitioned from the store).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypeVar

from shale.block.ids import ulid_time_ms, ulid_time_prefix
from shale.block.layout import (
    DAY_KEY,
    GROUP_KEY,
    GROUP_NAMES,
    META_FILENAME,
    QUARANTINE_MARK_SUFFIX,
    block_prefix,
    blocks_prefixes,
    group_prefix,
    markers_prefix,
    parse_block_key,
    parse_mark_key,
    tenant_group_prefix,
    tenant_of_dir,
)
from shale.block.marks import DeletionMark, QuarantineMark, parse_mark, parse_quarantine_mark
from shale.block.meta import BlockMeta, parse_meta
from shale.errors import CorruptObjectError, NotFoundError
from shale.objstore import BucketReader, ObjectInfo

A = TypeVar("A")
R = TypeVar("R")


class BlockState(StrEnum):
    FRESH = "fresh"
    HEALTHY = "healthy"
    PARTIAL = "partial"
    MARKED_FOR_DELETION = "marked-for-deletion"
    HEALTHY_OVERLAPPED = "healthy-overlapped"
    QUARANTINED = "quarantined"


@dataclass
class BlockView:
    tenant: str
    id: str
    state: BlockState
    age: float
    objects: list[ObjectInfo] = field(default_factory=list)
    meta: BlockMeta | None = None
    mark: DeletionMark | None = None
    error: str | None = None
    overlapped_by: str | None = None
    quarantine: QuarantineMark | None = None

    @property
    def readable(self) -> bool:
        """Whether a bucket-scanning reader may read it."""
        return self.state is BlockState.HEALTHY


@dataclass
class FetchResult:
    tenant: str
    synced_at: float
    blocks: dict[str, BlockView]
    orphan_marks: dict[str, DeletionMark]
    """Deletion marks whose block has no objects left: a delete that stopped before removing its mark."""

    def in_state(self, *states: BlockState) -> list[BlockView]:
        return [b for b in self.blocks.values() if b.state in states]

    def metas(self, *states: BlockState) -> list[BlockMeta]:
        return [b.meta for b in self.in_state(*states) if b.meta is not None]


class BlockFetcher:
    """Computes block states for tenants. Thread-safe for distinct tenants; caches immutable objects."""

    def __init__(self, bucket: BucketReader, sync_delay: float, clock: Callable[[], float] = time.time,
                 concurrency: int = 16) -> None:
        self.bucket = bucket
        self.sync_delay = sync_delay
        self.clock = clock
        self.concurrency = concurrency
        self._metas: dict[tuple[str, str], BlockMeta] = {}
        self._marks: dict[str, DeletionMark] = {}

    def tenants(self, group: str | None = None) -> list[str]:
        """Tenants with a folder of their own (markers, bucket index, blocks of before) or blocks in a group; with
        ``group``, those with a folder in that group (one LIST)."""
        if group is not None:
            return sorted({t for d in self.bucket.list_dirs(group_prefix(group)) if (t := tenant_of_dir(d))})
        top = self.bucket.list_dirs("")
        groups = [d for d in top if d.removeprefix(GROUP_KEY).rstrip("/") in GROUP_NAMES]
        folders = [*top, *(d for g in groups for d in self.bucket.list_dirs(g))]
        return sorted({t for d in folders if not d.startswith("_") and (t := tenant_of_dir(d)) is not None})

    def sync(self, tenant: str, *, group: str | None = None, since_ms: int = 0) -> FetchResult:
        """The tenant's blocks and their states. ``group`` narrows the sync to one group's blocks (in the current
        layout), ``since_ms`` to blocks whose id was made at that time or later, listed from there on (``_listing``):
        marks are then read for those alone, and a narrowed sync reports no orphan marks (it cannot tell a mark of
        a block it did not list from one whose block is gone)."""
        now = self.clock()
        objects: dict[str, list[ObjectInfo]] = defaultdict(list)
        metas_at: dict[str, str] = {}
        for info in self._listing(tenant, group, since_ms):
            parsed = parse_block_key(info.key)
            if parsed is not None and parsed.tenant == tenant and (
                    not since_ms or ulid_time_ms(parsed.block_id) >= since_ms):
                objects[parsed.block_id].append(info)
                if parsed.name == META_FILENAME:
                    metas_at[parsed.block_id] = info.key
        marks, quarantined = self._load_marks(tenant, since_ms)
        metas, errors = self._load_metas(tenant, metas_at)
        views: dict[str, BlockView] = {}
        for block_id, objs in objects.items():
            newest = max(o.last_modified for o in objs)
            age = now - max(ulid_time_ms(block_id) / 1000.0, newest)
            meta = metas.get(block_id)
            view = BlockView(tenant, block_id, BlockState.HEALTHY, age, sorted(objs, key=lambda o: o.key), meta,
                             marks.get(block_id), errors.get(block_id), quarantine=quarantined.get(block_id))
            if view.quarantine is not None:
                view.state = BlockState.QUARANTINED
            elif view.mark is not None:
                view.state = BlockState.MARKED_FOR_DELETION
            elif age < self.sync_delay and not (meta is not None and meta.ignore_delay):
                view.state = BlockState.FRESH
            elif meta is None:
                view.state = BlockState.PARTIAL
            views[block_id] = view
        _judge_overlaps(views.values())
        narrowed = group is not None or since_ms > 0
        orphans = {} if narrowed else {bid: m for bid, m in marks.items() if bid not in objects}
        return FetchResult(tenant, now, views, orphans)

    def _listing(self, tenant: str, group: str | None, since_ms: int) -> Iterator[ObjectInfo]:
        """Every object of the tenant's blocks (of ``group`` in the current layout; made at ``since_ms`` or later),
        as LISTs return them.
        With ``since_ms``, each folder of block ids is listed from that time on (ids sort by time): the backup
        group's and the old layout's folder with one LIST each, the partition group's with one LIST of its day
        folders and one of each day's blocks, ``concurrency`` at a time."""
        prefixes = blocks_prefixes(tenant) if group is None else (tenant_group_prefix(tenant, group),)
        if not since_ms:
            for prefix in prefixes:
                yield from self.bucket.list(prefix)
            return
        start = ulid_time_prefix(since_ms)
        folders = [folder for prefix in prefixes for folder in (
            [d for d in self.bucket.list_dirs(prefix) if d.startswith(prefix + DAY_KEY)]
            if prefix == tenant_group_prefix(tenant, "partition") else [prefix])]
        for found in self._map(lambda folder: list(self.bucket.list(folder, start_after=folder + start)), folders):
            yield from found

    def _load_marks(self, tenant: str, since_ms: int = 0) -> tuple[dict[str, DeletionMark],
                                                                   dict[str, QuarantineMark]]:
        keys, quarantine_keys = [], []
        for info in self.bucket.list(markers_prefix(tenant)):
            if (parsed := parse_mark_key(info.key)) is not None:
                keys.append((parsed[1], info.key))
            elif (parsed := parse_mark_key(info.key, QUARANTINE_MARK_SUFFIX)) is not None:
                quarantine_keys.append((parsed[1], info.key))
        if since_ms:
            keys = [(bid, key) for bid, key in keys if ulid_time_ms(bid) >= since_ms]
            quarantine_keys = [(bid, key) for bid, key in quarantine_keys if ulid_time_ms(bid) >= since_ms]
        missing = [key for _, key in keys if key not in self._marks]

        def load(key: str) -> tuple[str, DeletionMark | None]:
            try:
                return key, parse_mark(self.bucket.get(key), key)
            except (NotFoundError, CorruptObjectError):
                return key, None  # deleted since the LIST, or unreadable: not a mark we can act on

        for key, mark in self._map(load, missing):
            if mark is not None:
                self._marks[key] = mark
        quarantined = {bid: q for bid, key in quarantine_keys
                       if (q := self._load_quarantine(tenant, bid, key)) is not None}
        return {bid: self._marks[key] for bid, key in keys if key in self._marks}, quarantined

    def _load_quarantine(self, tenant: str, block_id: str, key: str) -> QuarantineMark | None:
        """A quarantine mark, or None if it was removed since the LIST. Not cached: a repair that rebuilds a
        quarantined block removes its mark. A mark that cannot be read still quarantines its block: the key alone
        must keep the block from ever being deleted."""
        try:
            return parse_quarantine_mark(self.bucket.get(key), key)
        except NotFoundError:
            return None
        except CorruptObjectError as exc:
            return QuarantineMark(id=block_id, tenant=tenant, quarantine_time=0, damage=[], reason=str(exc))

    def _load_metas(self, tenant: str, keys: dict[str, str]) -> tuple[dict[str, BlockMeta], dict[str, str]]:
        """The metadata of the blocks ``keys`` names (block id: its meta.json's key), and why any cannot be read."""
        metas = {bid: meta for bid, key in keys.items()
                 if (meta := self._metas.get((tenant, key))) is not None}
        errors: dict[str, str] = {}

        def load(block_id: str) -> tuple[str, BlockMeta | str | None]:
            key = keys[block_id]
            try:
                meta = parse_meta(self.bucket.get(key), where=key, block_id=block_id)
            except NotFoundError:
                return block_id, None  # deleted since the LIST (a delete removes meta.json first)
            except CorruptObjectError as exc:
                return block_id, str(exc)
            if meta.tenant != tenant or key != f"{block_prefix(meta)}{META_FILENAME}":
                return block_id, (f"{key}: meta.json of block {block_id} places it at {block_prefix(meta)} "
                                  "(tenant, group, day or layout differ from its key)")
            return block_id, meta

        for block_id, result in self._map(load, [b for b in keys if b not in metas]):
            if isinstance(result, BlockMeta):
                metas[block_id] = self._metas[(tenant, keys[block_id])] = result
            elif isinstance(result, str):
                errors[block_id] = result
        return metas, errors

    def _map(self, fn: Callable[[A], R], items: list[A]) -> Iterable[R]:
        if len(items) <= 1:
            return [fn(i) for i in items]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(items))) as pool:
            return list(pool.map(fn, items))


def by_source(views: Iterable[BlockView]) -> dict[str, list[BlockView]]:
    """Blocks with metadata, under each of their compaction sources."""
    index: dict[str, list[BlockView]] = defaultdict(list)
    for view in views:
        for source in view.meta.compaction.sources if view.meta is not None else ():
            index[source].append(view)
    return index


def covering(view: BlockView, index: dict[str, list[BlockView]]) -> Iterator[tuple[BlockView, bool]]:
    """The other blocks of ``index`` whose sources include all of ``view``'s, each with whether the two source sets
    are equal. Looking under one of ``view``'s sources is enough: a covering block is listed under all of them."""
    mine = set(view.meta.compaction.sources) if view.meta is not None else set()
    for other in index.get(next(iter(mine)), []) if mine else []:
        assert other.meta is not None
        theirs = set(other.meta.compaction.sources)
        if other is not view and mine <= theirs:
            yield other, mine == theirs


def _judge_overlaps(views: Iterable[BlockView]) -> None:
    """Seed 000's full-overlap rule: a healthy block whose sources are all inside a newer healthy block's sources
    is HealthyOverlapped. Equal source sets (the same compaction done twice) keep the greater id."""
    healthy = [v for v in views if v.state is BlockState.HEALTHY and v.meta is not None]
    index = by_source(healthy)
    for view in healthy:
        for other, equal in covering(view, index):
            if not equal or other.id > view.id:
                view.state = BlockState.HEALTHY_OVERLAPPED
                view.overlapped_by = other.id
                break
