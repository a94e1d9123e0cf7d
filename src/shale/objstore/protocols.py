"""The bucket interface, one small protocol per capability (as obspec does), combined by consumers.

Read paths take a ``BucketReader`` so that they cannot write; writers take a ``Bucket``.

Contract every implementation passes (tests/bucket_acceptance.py runs it on memory, the local
filesystem and MinIO):

* ``get`` / ``get_range`` / ``head`` of a missing key raise ``NotFoundError``.
* ``list(prefix, start_after)`` yields every object under ``prefix`` whose key sorts after ``start_after``,
  in lexicographic key order; ``list_dirs(prefix)`` returns the sorted common prefixes one level down.
* ``put_if_absent`` raises ``ConflictError`` when the key exists (and does not change it).
* ``put_if_match`` replaces an object only if its etag still equals the given one, else ``ConflictError``.
* ``delete`` of a missing key succeeds (deletes are idempotent).
* Transient failures are retried with jittered backoff and surface as ``StoreUnavailableError``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

from shale.objstore.types import ObjectInfo, PutResult


class ObjectReader(Protocol):
    def get(self, key: str) -> bytes: ...

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of the object."""
        ...

    def head(self, key: str) -> ObjectInfo: ...


class ObjectLister(Protocol):
    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectInfo]: ...

    def list_dirs(self, prefix: str = "") -> Sequence[str]:
        """The "folders" directly under ``prefix`` (common prefixes with delimiter ``/``), each ending in ``/``."""
        ...


class ObjectWriter(Protocol):
    def put(self, key: str, data: bytes) -> PutResult:
        """Create or overwrite."""
        ...

    def put_if_absent(self, key: str, data: bytes) -> PutResult: ...

    def put_if_match(self, key: str, data: bytes, etag: str) -> PutResult: ...


class ObjectDeleter(Protocol):
    def delete(self, key: str) -> None: ...


class BucketReader(ObjectReader, ObjectLister, Protocol):
    """Everything a read path needs, and nothing that writes."""

    @property
    def url(self) -> str: ...


class Bucket(BucketReader, ObjectWriter, ObjectDeleter, Protocol):
    """A bucket that can be written."""
