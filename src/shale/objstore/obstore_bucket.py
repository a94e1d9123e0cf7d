"""The bucket implementation over obstore, for every backend obstore supports.

Retries: obstore's own retries are turned off so that every request is counted and every retry follows
one policy: transient failures only (5xx, timeouts, dropped connections), full-jitter exponential backoff.
A conditional put that is retried after a transient failure may find that its first attempt did land;
it then reads the object back and succeeds if the content is its own.

Conditional update (``put_if_match``): S3, MinIO, GCS, Azure and memory do it natively (If-Match). obstore's
local filesystem store does not, so for ``file://`` buckets Shale takes an exclusive ``flock`` on the current
file, compares its etag, and atomically renames a temporary file over it. That fallback is correct for any
number of processes on one host, which is the only place a local filesystem bucket can be shared.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import os
import random
import re
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import obstore
from obstore import exceptions as obx
from obstore.store import ObjectStore

from shale.errors import ArchivedObjectError, ConflictError, NotFoundError, ShaleError, StoreUnavailableError
from shale.objstore.counting import CallCounter
from shale.objstore.types import ObjectInfo, PutResult, check_key, check_prefix

T = TypeVar("T")
LIST_PAGE_SIZE = 1000
_TRANSIENT = re.compile(
    r"status code: 5\d\d|timed out|timeout|connection|error sending request|broken pipe|reset by peer|"
    r"incomplete message|unexpected eof|dns error|HTTP error",
    re.IGNORECASE,
)
LOCAL_TMP_DIR = ".shale-tmp"


@dataclass(frozen=True)
class RetryPolicy:
    """Full-jitter exponential backoff: attempt n waits a uniform time in [0, min(max, base * 2**(n-1))]."""

    attempts: int = 5
    base_delay: float = 0.1
    max_delay: float = 5.0
    sleep: Callable[[float], None] = time.sleep

    def backoff(self, attempt: int) -> None:
        if attempt:
            self.sleep(random.uniform(0, min(self.max_delay, self.base_delay * 2 ** (attempt - 1))))


def is_transient(exc: BaseException) -> bool:
    """5xx answers, timeouts and connection failures; never 4xx, missing objects or precondition failures."""
    return bool(_TRANSIENT.search(str(exc)))


def _epoch(value: dt.datetime) -> float:
    return value.timestamp()


def _info(meta: object) -> ObjectInfo:
    m = meta  # obstore's ObjectMeta is a TypedDict
    assert isinstance(m, dict)
    return ObjectInfo(key=m["path"], size=int(m["size"]), last_modified=_epoch(m["last_modified"]),
                      etag=m.get("e_tag"))


class ObstoreBucket:
    """A ``Bucket`` backed by an obstore ``ObjectStore``. Thread-safe; share one per process and bucket."""

    def __init__(
        self,
        store: ObjectStore,
        url: str,
        *,
        local_root: Path | None = None,
        retry: RetryPolicy | None = None,
        exported: bool = True,
    ) -> None:
        self._store = store
        self._url = url
        self._local_root = local_root
        self.retry = retry or RetryPolicy()
        self.calls = CallCounter(url, exported=exported)  # exported=False: out of the metrics and task reports

    @property
    def url(self) -> str:
        return self._url

    def __repr__(self) -> str:
        return f"ObstoreBucket({self._url!r})"

    # -- retries and error mapping ---------------------------------------------------------------

    def _call(self, operation: str, key: str, fn: Callable[[], T], retried: list[bool] | None = None) -> T:
        """Run one request with the retry policy. ``retried`` (if given) records whether any attempt failed."""
        started = time.perf_counter()
        try:
            return self._attempts(operation, key, fn, retried)
        finally:
            self.calls.add_seconds(operation, time.perf_counter() - started)

    def _attempts(self, operation: str, key: str, fn: Callable[[], T], retried: list[bool] | None) -> T:
        last: Exception | None = None
        for attempt in range(self.retry.attempts):
            self.retry.backoff(attempt)
            try:
                result = fn()
            except (obx.NotFoundError, FileNotFoundError, NotFoundError) as exc:
                self.calls.add(operation, "not_found")
                if isinstance(exc, NotFoundError):
                    raise
                raise NotFoundError(f"{self._url}: no object at {key!r}") from exc
            except (obx.AlreadyExistsError, obx.PreconditionError, ConflictError) as exc:
                self.calls.add(operation, "conflict")
                if isinstance(exc, ConflictError):
                    raise
                raise ConflictError(f"{self._url}: conditional write to {key!r} lost: {_first_line(exc)}") from exc
            except ShaleError:
                self.calls.add(operation, "error")
                raise
            except Exception as exc:
                if "InvalidObjectState" in str(exc):  # S3's 403 for a GET of an object in an archive class
                    self.calls.add(operation, "error")
                    raise ArchivedObjectError(
                        f"{self._url}/{key} is in an archive storage class (S3 Glacier Flexible Retrieval or Deep "
                        "Archive) and cannot be read until it is restored: restore the objects under its prefix "
                        "(`aws s3api restore-object`, or S3 Batch Operations for many), wait for the restore to "
                        "finish, then run this again (docs/DEPLOY.md, archiving the backup group)") from exc
                if not is_transient(exc):
                    self.calls.add(operation, "error")
                    raise
                self.calls.add(operation, "retried")
                if retried is not None:
                    retried.append(True)
                last = exc
                continue
            self.calls.add(operation, "ok")
            return result
        raise StoreUnavailableError(
            f"{self._url}: {operation} {key!r} failed {self.retry.attempts} times with transient errors; "
            f"the store may be down or overloaded. Last error: {_first_line(last)}"
        ) from last

    def _conditional(self, operation: str, key: str, data: bytes, fn: Callable[[], PutResult]) -> PutResult:
        """A conditional put whose first attempt may have landed before a transient failure hid the answer."""
        retried: list[bool] = []
        try:
            return self._call(operation, key, fn, retried)
        except ConflictError:
            if not retried:
                raise
            try:
                if self.get(key) == data:
                    return PutResult(self.head(key).etag)
            except NotFoundError:
                pass
            raise

    # -- reads -----------------------------------------------------------------------------------

    def get(self, key: str) -> bytes:
        check_key(key)
        data = self._call("get", key, lambda: bytes(obstore.get(self._store, key).bytes()))
        self.calls.add_bytes_read(len(data))
        return data

    def get_range(self, key: str, start: int, end: int) -> bytes:
        check_key(key)
        if end <= start:
            return b""
        data = self._call("get_range", key, lambda: bytes(obstore.get_range(self._store, key, start=start, end=end)))
        self.calls.add_bytes_read(len(data))
        return data

    def head(self, key: str) -> ObjectInfo:
        check_key(key)
        return self._call("head", key, lambda: _info(obstore.head(self._store, key)))

    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectInfo]:
        """Objects under ``prefix`` in key order; the listing is read eagerly, page by page."""
        check_prefix(prefix)

        def run() -> list[ObjectInfo]:
            out: list[ObjectInfo] = []
            stream = obstore.list(self._store, prefix=prefix or None, offset=start_after, chunk_size=LIST_PAGE_SIZE)
            for chunk in stream:
                out.extend(_info(m) for m in chunk)
            return out

        items = self._call("list", prefix, run)
        if len(items) > LIST_PAGE_SIZE:
            self.calls.add("list", "ok", (len(items) - 1) // LIST_PAGE_SIZE)
        items.sort(key=lambda i: i.key)
        yield from (i for i in items if not i.key.startswith(LOCAL_TMP_DIR + "/"))

    def list_dirs(self, prefix: str = "") -> Sequence[str]:
        check_prefix(prefix)

        def run() -> list[str]:
            result = obstore.list_with_delimiter(self._store, prefix or None)
            return sorted(p.rstrip("/") + "/" for p in result["common_prefixes"])

        dirs = self._call("list", prefix, run)
        return [d for d in dirs if d != LOCAL_TMP_DIR + "/"]

    # -- writes ----------------------------------------------------------------------------------

    def put(self, key: str, data: bytes) -> PutResult:
        check_key(key)
        return self._call("put", key, lambda: PutResult(obstore.put(self._store, key, data)["e_tag"]))

    def put_if_absent(self, key: str, data: bytes) -> PutResult:
        check_key(key)
        return self._conditional(
            "put", key, data, lambda: PutResult(obstore.put(self._store, key, data, mode="create")["e_tag"])
        )

    def put_if_match(self, key: str, data: bytes, etag: str) -> PutResult:
        check_key(key)
        if self._local_root is not None:
            return self._conditional("put", key, data, lambda: self._local_put_if_match(key, data, etag))
        return self._conditional(
            "put", key, data,
            lambda: PutResult(obstore.put(self._store, key, data, mode={"e_tag": etag})["e_tag"]),
        )

    def _local_put_if_match(self, key: str, data: bytes, etag: str) -> PutResult:
        assert self._local_root is not None
        path = self._local_root / key
        try:
            handle = open(path, "rb")  # noqa: SIM115 - held open for the lock's lifetime below
        except FileNotFoundError as exc:
            raise ConflictError(f"{self._url}: {key!r} does not exist, so it cannot match etag {etag}") from exc
        with handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            current = _info(obstore.head(self._store, key)).etag
            if current != etag:
                raise ConflictError(f"{self._url}: {key!r} changed (etag {current}, expected {etag})")
            tmp_dir = self._local_root / LOCAL_TMP_DIR
            tmp_dir.mkdir(exist_ok=True)
            tmp = tmp_dir / f"{uuid.uuid4().hex}.tmp"
            with open(tmp, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, path)
        return PutResult(_info(obstore.head(self._store, key)).etag)

    def delete(self, key: str) -> None:
        check_key(key)

        def run() -> None:
            with contextlib.suppress(obx.NotFoundError, FileNotFoundError):
                obstore.delete(self._store, key)
            if self._local_root is not None:
                self._prune_empty_dirs(key)

        self._call("delete", key, run)

    def _prune_empty_dirs(self, key: str) -> None:
        """A filesystem bucket removes the folders a delete left empty, so that ``list_dirs`` answers as S3 does
        (a prefix exists while an object is under it). A writer that created the folder meanwhile has an object or
        its staging file in it, so ``rmdir`` refuses and the folder stays."""
        assert self._local_root is not None
        folder = (self._local_root / key).parent
        while folder != self._local_root and self._local_root in folder.parents:
            try:
                folder.rmdir()
            except OSError:  # not empty, or already gone
                return
            folder = folder.parent


def _first_line(exc: BaseException | None) -> str:
    return str(exc).strip().splitlines()[0] if exc and str(exc).strip() else type(exc).__name__
