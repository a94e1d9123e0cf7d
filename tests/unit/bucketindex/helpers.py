"""Shared pieces of the bucket-index tests: a settable clock, a fake index source, and a bucket wrapper that
lets a test run another writer at the exact moment a conditional write is about to be sent."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from prometheus_client import REGISTRY
from tests.factories import BASE_MS
from tests.unit.metastore.helpers import meta

from shale.block import BlockMeta
from shale.config import BucketIndexConfig
from shale.index import TombstoneRow
from shale.objstore import Bucket, ObjectInfo, PutResult

T0 = BASE_MS / 1000 + 86_400.0  # a day after the blocks' data time, in seconds


class Clock:
    """A clock that moves only when told to."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def config(**fields: object) -> BucketIndexConfig:
    base: dict[str, object] = {"debounce": 5.0, "rewrite_interval": 300.0, "max_stale_period": 3600.0,
                               "refresh_interval": 60.0, "idle_timeout": 3600.0, "deltas": True}
    return BucketIndexConfig.model_validate(base | fields)


def block(tenant: str, n: int, sources: list[str] | None = None, level: int = 0) -> BlockMeta:
    """A distinct block of ``tenant`` (``n`` picks its offsets and id)."""
    return meta(tenant=tenant, start=n * 100, end=n * 100 + 100, key=f"{tenant}/{n}/{level}", sources=sources,
                level=level)


def tombstone(block: BlockMeta, created_at_ms: int, reason: str = "compacted", seq: int = 1) -> TombstoneRow:
    return TombstoneRow(seq=seq, block_id=block.id, tenant=block.tenant, shard=0, created_at=created_at_ms,
                        reason=reason, files=[])


@dataclass
class FakeSource:
    """An ``IndexSource`` in memory: bump a tenant's version whenever its blocks or tombstones change."""

    versions: dict[str, int] = field(default_factory=dict)
    blocks: dict[str, list[BlockMeta]] = field(default_factory=dict)
    tombstones: dict[str, list[TombstoneRow]] = field(default_factory=dict)

    def set(self, tenant: str, blocks: list[BlockMeta], tombstones: list[TombstoneRow] | None = None) -> None:
        self.blocks[tenant] = list(blocks)
        self.tombstones[tenant] = list(tombstones or [])
        self.versions[tenant] = self.versions.get(tenant, 0) + 1

    def tenant_versions(self) -> dict[str, int]:
        return dict(self.versions)

    def tenant_blocks(self, tenant: str) -> list[BlockMeta]:
        return list(self.blocks.get(tenant, []))

    def tenant_tombstones(self, tenant: str) -> list[TombstoneRow]:
        return list(self.tombstones.get(tenant, []))

    def generation_rules(self, tenant: str) -> list[tuple[str, int, int, int]]:
        return []


class HookBucket:
    """A ``Bucket`` that runs ``hook`` once, just before the next conditional write (put_if_absent or
    put_if_match) is sent to the real bucket underneath."""

    def __init__(self, inner: Bucket) -> None:
        self.inner = inner
        self.hook: Callable[[], None] | None = None
        self.conflicts_seen = 0

    @property
    def url(self) -> str:
        return self.inner.url

    def _fire(self) -> None:
        hook, self.hook = self.hook, None
        if hook is not None:
            hook()

    def get(self, key: str) -> bytes:
        return self.inner.get(key)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        return self.inner.get_range(key, start, end)

    def head(self, key: str) -> ObjectInfo:
        return self.inner.head(key)

    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectInfo]:
        return self.inner.list(prefix, start_after)

    def list_dirs(self, prefix: str = "") -> Sequence[str]:
        return self.inner.list_dirs(prefix)

    def put(self, key: str, data: bytes) -> PutResult:
        return self.inner.put(key, data)

    def put_if_absent(self, key: str, data: bytes) -> PutResult:
        self._fire()
        return self.inner.put_if_absent(key, data)

    def put_if_match(self, key: str, data: bytes, etag: str) -> PutResult:
        self._fire()
        return self.inner.put_if_match(key, data, etag)

    def delete(self, key: str) -> None:
        self.inner.delete(key)


def sample(name: str, **labels: str) -> float:
    """A Prometheus sample's current value (0 if it was never set)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0
