"""Index deltas: small objects that let a reader answer from a stale index (stale-tolerant mode, beyond seed 001).

A producer that changes a tenant's blocks (ingest, compaction, retention, the cleaner) drops one delta after the
change is durable, with put-if-absent::

    <tenant>/bucket-index-deltas/<ms:013d>-<seq:06d>-<writer>.json
    {"version": 1, "tenant": "acme", "time": 1795000000.5,
     "added": [<BlockMeta>], "marks": [{"id", "deletion_time", "reason"}], "removed": ["<block id>"],
     "link": {"previous": 41, "version": 57, "time": 1795000000.4, "digest": "<32 hex digits>",
              "generations": [["app", 0, 4611686018427387904, 1]]}}

Keys sort by the producer's (per-writer monotonic) clock, then by a sequence within one millisecond, then by
writer. "After the change is durable" matters: a block is announced only once its meta.json exists and, with a
metastore, once its commit is applied, so that anything a delta announces can be found by an index writer that
lists the deltas *before* reading its source.

A delta names where its change sits in the metastore's history of the tenant (``link``): the tenant's version
before and after it (the log index of its last change; the metastore's command result says both), the log's
time of the change, and what the tenant looked like once the change's entry was applied (``digest``, see
``model.state_digest``; and the generation switches, when the entry changed them). The index says the version its
source reflected (``BucketIndex.tenant_version``). A reader applies the deltas whose links continue the index's
version, in version order (``follow_chain``); the view is fresh as of the newest change it reaches without a hole
*and* whose digest it matches. A producer that died between its commit and its delta leaves a hole that no later
delta can cover, and a delta that carries less than its change (a switch, a forgotten block) leaves a view that
matches no digest: either way the view stays stale (``StaleIndexError``) until the index writer folds the change
in, instead of looking fresh while it lacks a change. A delta without a link (a replayed commit, a delta of an
older Shale) is not applied and proves nothing.

Index writers fold deltas: they set the index's ``watermark`` to the newest delta key whose change the index
holds, and then delete the deltas up to it. ``fold_watermark`` is the rule both writers share: the watermark
stops before the first delta the writer's source does not reflect yet, and never passes a delta younger than
``DELTA_MARGIN`` by the writer's clock, so a delta written concurrently under a slightly older key (a producer
whose clock is behind, or whose put was slow) still lands after the watermark and is never deleted unread.
"""

from __future__ import annotations

import logging
import re
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from shale.block import BlockMeta, DeletionMark, bucket_index_deltas_prefix, check_block_id, check_tenant
from shale.bucketindex.model import BucketIndex, IndexedMark, Rule, view_digest
from shale.errors import CorruptObjectError, NotFoundError, ShaleError
from shale.objstore import Bucket, BucketReader, ObjectInfo, OrderedNames

log = logging.getLogger(__name__)
DELTA_MARGIN = 60.0
"""Seconds: index writers never fold a delta younger than this, by their own clock (see the module docstring)."""
UNREFLECTED_DELTA_LIMIT = 600.0
"""Seconds: a delta the writer's source still does not reflect after this long is folded anyway, so that one
change that will never arrive (a commit the metastore rejected) cannot hold every later delta back."""
_DELTA_NAME = re.compile(r"^(\d{13})-(\d{6})-([0-9a-z]+)\.json$")

MarkLike = DeletionMark | IndexedMark | tuple[str, float, str]


class DeltaLink(BaseModel):
    """Where a delta's change sits in the metastore's history of its tenant, and what the tenant looked like
    right after it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    previous: int = Field(ge=0, description="the tenant's version before the change (0: its first change)")
    version: int = Field(ge=1, description="the tenant's version after it: the log index of the change")
    time: float = Field(description="the log's time of the change, seconds since the epoch")
    digest: str | None = Field(default=None, description="``model.state_digest`` of the tenant when the change's "
                               "entry was applied; None: a metastore that predates it (the link cannot vouch)")
    generations: list[Rule] | None = Field(default=None, description="the tenant's generation switches after the "
                                           "change, when the change's entry changed them; None: unchanged")

    @model_validator(mode="after")
    def _ordered(self) -> DeltaLink:
        if self.previous > self.version:
            raise ValueError(f"previous version {self.previous} is after version {self.version}")
        return self

    @classmethod
    def of(cls, raw: object) -> DeltaLink | None:
        """A link as a metastore command's result gives it (``[previous, version, time ms]``, followed by the
        digest and the switches when the metastore stamps them); None if the result does not give one (a
        replayed command)."""
        if not isinstance(raw, list) or len(raw) not in (3, 5):
            return None
        digest, generations = (raw[3], raw[4]) if len(raw) == 5 else (None, None)
        return cls(previous=raw[0], version=raw[1], time=raw[2] / 1000, digest=digest,
                   generations=None if generations is None else [tuple(r) for r in generations])


@dataclass(frozen=True)
class ChainView:
    """What a stale index and its deltas prove (``follow_chain``). ``view`` is the index with the deltas of the
    chain applied up to ``version``, the newest change whose digest it matches (``time`` is that change's log
    time); both None and ``view`` the index itself when no change could be verified. ``hole`` is the version
    after which a change announced no delta; ``unverified`` the newest change reached whose digest the view did
    not match (a change its deltas did not carry, or a link without a digest)."""

    view: BucketIndex
    version: int | None = None
    time: float | None = None
    hole: int | None = None
    unverified: int | None = None


def follow_chain(index: BucketIndex, deltas: Mapping[str, IndexDelta]) -> ChainView:
    """Apply the deltas whose links continue the index's tenant version, in version order (deltas of one
    version in key order), and check the view against each version's digest.

    A delta without a link, or with a link at or before the index's version (the index holds its change), is
    not applied: only the chain is. The chain stops at a hole. The view is fresh as of the newest version whose
    digest it matches, wherever that is on the chain: a digest covers the whole tenant, so a match proves the
    view whatever came before it (an index whose source read a change its version does not claim mismatches
    until the chain reaches that change). A view that never matches proves nothing, and ``view`` stays the
    index."""
    start = index.tenant_version
    if start is None:  # a scan cannot say which changes it holds
        return ChainView(index)
    by_version: dict[int, list[tuple[str, IndexDelta, DeltaLink]]] = defaultdict(list)
    for key, delta in deltas.items():
        if delta.link is not None and delta.link.version > start:
            by_version[delta.link.version].append((key, delta, delta.link))
    result = ChainView(index)
    view, at = index, start
    for version in sorted(by_version):
        group = sorted(by_version[version], key=lambda item: item[0])
        if min(link.previous for _, _, link in group) > at:
            return replace(result, hole=at)
        for key, delta, _ in group:
            view = apply_delta(view, delta, key)
        at = version
        digests = {link.digest for _, _, link in group}
        digest = digests.pop() if len(digests) == 1 else None
        if digest is not None and digest == view_digest(view, digest):
            result = ChainView(view, version, max(link.time for _, _, link in group))
        else:
            result = replace(result, unverified=version)
    return result


class IndexDelta(BaseModel):
    """One producer's change to one tenant's blocks."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1] = 1
    tenant: str
    time: float = Field(description="the producer's clock when it wrote the delta, seconds since the epoch")
    added: list[BlockMeta] = Field(default_factory=list)
    marks: list[IndexedMark] = Field(default_factory=list)
    removed: list[str] = Field(default_factory=list, description="blocks whose objects are gone")
    link: DeltaLink | None = Field(default=None, description="the change's place in the tenant's history")

    @model_validator(mode="after")
    def _consistent(self) -> IndexDelta:
        check_tenant(self.tenant)
        strangers = sorted({b.tenant for b in self.added} - {self.tenant})
        if strangers:
            raise ValueError(f"blocks of other tenants {strangers} in a delta of {self.tenant}")
        for block_id in self.removed:
            check_block_id(block_id)
        return self

    @classmethod
    def parse(cls, data: bytes, *, tenant: str, key: str) -> IndexDelta:
        try:
            delta = cls.model_validate_json(data)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}"
                                 for e in exc.errors()[:5])
            raise CorruptObjectError(f"{key}: bucket index delta of tenant {tenant} is invalid ({problems}); "
                                     "delete it after checking what the producer meant to add", key=key) from None
        if delta.tenant != tenant:
            raise CorruptObjectError(f"{key}: bucket index delta says tenant {delta.tenant}, its key says {tenant}",
                                     key=key)
        return delta


def delta_time(key: str) -> float | None:
    """The producer's time in a delta key, in seconds; None if the key is not a delta's."""
    match = _DELTA_NAME.match(key.rsplit("/", 1)[-1])
    return int(match.group(1)) / 1000.0 if match else None


def _to_mark(mark: MarkLike) -> IndexedMark:
    if isinstance(mark, IndexedMark):
        return mark
    if isinstance(mark, DeletionMark):
        return IndexedMark(id=mark.id, deletion_time=mark.deletion_time, reason=mark.reason)
    block_id, deletion_time, reason = mark
    return IndexedMark(id=block_id, deletion_time=deletion_time, reason=reason)


class DeltaWriter:
    """Writes deltas for any number of tenants. Thread-safe; keys are unique and increasing per instance."""

    def __init__(self, bucket: Bucket, clock: Callable[[], float] = time.time) -> None:
        self.bucket = bucket
        self._names = OrderedNames(clock)

    def write(self, tenant: str, added: Sequence[BlockMeta] = (), marks: Sequence[MarkLike] = (),
              removed: Sequence[str] = (), link: DeltaLink | None = None) -> str:
        """Write one delta (put-if-absent) and return its key. Call it only after the change is durable: after
        meta.json and the metastore commit (whose result gives ``link``), after a mark, after a deletion."""
        name, ms = self._names.next()
        key = f"{bucket_index_deltas_prefix(tenant)}{name}.json"
        delta = IndexDelta(tenant=tenant, time=ms / 1000.0, added=list(added), marks=[_to_mark(m) for m in marks],
                           removed=list(removed), link=link)
        self.bucket.put_if_absent(key, delta.model_dump_json(exclude_none=True).encode())
        return key


def list_deltas(bucket: BucketReader, tenant: str, after: str = "") -> list[ObjectInfo]:
    """The tenant's delta objects with keys after ``after``, in key order: one LIST (one request per 1,000)."""
    return [info for info in bucket.list(bucket_index_deltas_prefix(tenant), start_after=after or None)
            if delta_time(info.key) is not None]


def read_delta(bucket: BucketReader, tenant: str, key: str) -> IndexDelta:
    return IndexDelta.parse(bucket.get(key), tenant=tenant, key=key)


def apply_delta(index: BucketIndex, delta: IndexDelta, key: str) -> BucketIndex:
    """The index with one delta applied: blocks added if absent, marks added if absent (the earliest time
    wins), then removed blocks dropped with their marks; the generation switches become the link's when it
    carries them. ``watermark`` becomes ``key``; ``updated_at`` and ``tenant_version`` stay."""
    blocks = {b.id: b for b in index.blocks}
    marks = {m.id: m for m in index.deletion_marks}
    uploaded = dict(index.uploaded)
    for meta in delta.added:
        if meta.id not in blocks:
            blocks[meta.id] = meta
            uploaded.setdefault(meta.id, delta.time)
    for mark in delta.marks:
        if mark.id not in marks or mark.deletion_time < marks[mark.id].deletion_time:
            marks[mark.id] = mark
    for block_id in delta.removed:
        blocks.pop(block_id, None)
        marks.pop(block_id, None)
    generations = index.generations
    if delta.link is not None and delta.link.generations is not None:
        generations = list(delta.link.generations)
    return BucketIndex.build(index.tenant, index.updated_at, blocks.values(), marks.values(), uploaded,
                             watermark=max(index.watermark, key), generations=generations,
                             tenant_version=index.tenant_version)


@dataclass(frozen=True)
class ListedDelta:
    """A listed delta and its contents; ``delta`` is None if it could not be read (deleted or unreadable)."""

    key: str
    delta: IndexDelta | None


def fold_watermark(listed: Iterable[ListedDelta], reflected: Callable[[IndexDelta], bool], now: float,
                   after: str = "", margin: float = DELTA_MARGIN,
                   give_up_after: float = UNREFLECTED_DELTA_LIMIT) -> str:
    """The newest key of the longest run of deltas (in key order, after ``after``) that an index built from the
    writer's source holds. A delta stops the run if it is younger than ``margin`` or if ``reflected`` says the
    source does not hold it yet (unless it is older than ``give_up_after``, then it is folded with a warning).
    A delta that could not be read is folded: another writer folded and deleted it, or nobody can ever apply it.
    """
    watermark = after
    for item in sorted(listed, key=lambda d: d.key):
        if item.key <= watermark:
            continue
        written = delta_time(item.key)
        if written is None or now - written < margin:
            break
        if item.delta is not None and not reflected(item.delta):
            if now - written < give_up_after:
                break
            log.warning("folding a bucket index delta the index source never reflected",
                        extra={"key": item.key, "age": round(now - written, 1)})
        watermark = item.key
    return watermark


def read_listed(bucket: BucketReader, tenant: str, infos: Iterable[ObjectInfo],
                cache: dict[str, IndexDelta] | None = None) -> list[ListedDelta]:
    """GET each listed delta not in ``cache`` (deltas are immutable); unreadable ones come back as None."""
    out = []
    for info in infos:
        delta = cache.get(info.key) if cache is not None else None
        if delta is None:
            try:
                delta = read_delta(bucket, tenant, info.key)
            except NotFoundError:
                delta = None  # folded and deleted by another writer since the LIST
            except CorruptObjectError as exc:
                log.error("unreadable bucket index delta; it will be folded and deleted",
                          extra={"key": info.key, "error": str(exc)})
                delta = None
            if delta is not None and cache is not None:
                cache[info.key] = delta
        out.append(ListedDelta(info.key, delta))
    return out


def delete_folded(bucket: Bucket, keys: Iterable[str], watermark: str) -> int:
    """Delete the listed deltas at or before ``watermark`` (the index holds them); return how many went. A
    failed delete is logged and left for the next write, whose listing (from the start of the prefix) finds it
    again."""
    done = 0
    for key in keys:
        if key > watermark:
            continue
        try:
            bucket.delete(key)
        except ShaleError as exc:
            log.warning("could not delete a folded bucket index delta; the next write retries",
                        extra={"key": key, "error": str(exc)})
            continue
        done += 1
    return done

