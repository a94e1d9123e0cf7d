"""Records and key rules shared by every bucket implementation."""

from __future__ import annotations

from dataclasses import dataclass

from shale.errors import InvalidNameError


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One object as a LIST or HEAD returns it. ``last_modified`` is in seconds since the epoch."""

    key: str
    size: int
    last_modified: float
    etag: str | None = None


@dataclass(frozen=True, slots=True)
class PutResult:
    """What a successful put returns: the new object's entity tag, the token for a later conditional update."""

    etag: str | None


def check_key(key: str) -> str:
    """Keys are bucket-relative: no leading slash, no empty, ``.`` or ``..`` segments."""
    if not key or key.startswith("/") or any(part in ("", ".", "..") for part in key.split("/")):
        raise InvalidNameError(f"object key {key!r} is not a clean relative path like 'tenant/blocks/ID/meta.json'")
    return key


def check_prefix(prefix: str) -> str:
    """A listing prefix: empty (the whole bucket) or a clean key that may end with ``/``."""
    if prefix:
        check_key(prefix.rstrip("/") or "x")
    return prefix
