"""Test buckets that wrap a real one: delayed visibility and fault injection.

They implement the same ``Bucket`` protocol, so any component can be run against an eventually consistent or
failing store without changing a line of it.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from shale.errors import NotFoundError, StoreUnavailableError
from shale.objstore.protocols import Bucket
from shale.objstore.types import ObjectInfo, PutResult


class DelayedVisibilityBucket:
    """New objects written through this wrapper stay invisible to get, head and list for ``delay`` seconds,
    as on an eventually consistent store. Objects that existed before are visible."""

    def __init__(self, inner: Bucket, delay: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.inner = inner
        self.delay = delay
        self.clock = clock
        self._born: dict[str, float] = {}
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return self.inner.url

    def _visible(self, key: str) -> bool:
        with self._lock:
            born = self._born.get(key)
        return born is None or self.clock() - born >= self.delay

    def _hide(self, key: str) -> None:
        if not self._visible(key):
            raise NotFoundError(f"{self.url}: no object at {key!r} (not yet visible)")

    def _written(self, key: str, result: PutResult) -> PutResult:
        with self._lock:
            self._born[key] = self.clock()
        return result

    def get(self, key: str) -> bytes:
        self._hide(key)
        return self.inner.get(key)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        self._hide(key)
        return self.inner.get_range(key, start, end)

    def head(self, key: str) -> ObjectInfo:
        self._hide(key)
        return self.inner.head(key)

    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectInfo]:
        return (i for i in self.inner.list(prefix, start_after) if self._visible(i.key))

    def list_dirs(self, prefix: str = "") -> Sequence[str]:
        dirs = {prefix + i.key[len(prefix):].split("/", 1)[0] + "/" for i in self.list(prefix)
                if "/" in i.key[len(prefix):]}
        return sorted(dirs)

    def put(self, key: str, data: bytes) -> PutResult:
        return self._written(key, self.inner.put(key, data))

    def put_if_absent(self, key: str, data: bytes) -> PutResult:
        return self._written(key, self.inner.put_if_absent(key, data))

    def put_if_match(self, key: str, data: bytes, etag: str) -> PutResult:
        return self._written(key, self.inner.put_if_match(key, data, etag))

    def delete(self, key: str) -> None:
        self.inner.delete(key)


@dataclass
class Fault:
    """Fail calls of ``operation`` (get, get_range, head, list, put, delete, or * for any) on keys matching
    ``key`` (a regex), ``times`` times. ``kind`` is "5xx" or "timeout". With ``after`` the real call is made
    first and only its answer is lost, as when a response times out after the write landed."""

    operation: str
    key: str = ".*"
    times: int = 1
    kind: str = "5xx"
    after: bool = False


class FaultyBucket:
    """Raises ``StoreUnavailableError`` on the calls its faults select, as a store would after the retries."""

    def __init__(self, inner: Bucket, faults: list[Fault] | None = None) -> None:
        self.inner = inner
        self.faults = list(faults or [])
        self.injected: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return self.inner.url

    def _match(self, operation: str, key: str) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                if fault.times > 0 and fault.operation in ("*", operation) and re.search(fault.key, key):
                    fault.times -= 1
                    self.injected.append((operation, key))
                    return fault
        return None

    def _run(self, operation: str, key: str, call: Callable[[], object]) -> object:
        fault = self._match(operation, key)
        if fault is None:
            return call()
        if fault.after:
            call()
        what = "timed out" if fault.kind == "timeout" else "returned HTTP 503"
        raise StoreUnavailableError(f"{self.url}: injected fault: {operation} {key!r} {what}")

    def get(self, key: str) -> bytes:
        result = self._run("get", key, lambda: self.inner.get(key))
        assert isinstance(result, bytes)
        return result

    def get_range(self, key: str, start: int, end: int) -> bytes:
        result = self._run("get_range", key, lambda: self.inner.get_range(key, start, end))
        assert isinstance(result, bytes)
        return result

    def head(self, key: str) -> ObjectInfo:
        result = self._run("head", key, lambda: self.inner.head(key))
        assert isinstance(result, ObjectInfo)
        return result

    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectInfo]:
        result = self._run("list", prefix, lambda: list(self.inner.list(prefix, start_after)))
        assert isinstance(result, list)
        return iter(result)

    def list_dirs(self, prefix: str = "") -> Sequence[str]:
        result = self._run("list", prefix, lambda: self.inner.list_dirs(prefix))
        assert isinstance(result, list)
        return result

    def put(self, key: str, data: bytes) -> PutResult:
        result = self._run("put", key, lambda: self.inner.put(key, data))
        assert isinstance(result, PutResult)
        return result

    def put_if_absent(self, key: str, data: bytes) -> PutResult:
        result = self._run("put", key, lambda: self.inner.put_if_absent(key, data))
        assert isinstance(result, PutResult)
        return result

    def put_if_match(self, key: str, data: bytes, etag: str) -> PutResult:
        result = self._run("put", key, lambda: self.inner.put_if_match(key, data, etag))
        assert isinstance(result, PutResult)
        return result

    def delete(self, key: str) -> None:
        self._run("delete", key, lambda: self.inner.delete(key))
