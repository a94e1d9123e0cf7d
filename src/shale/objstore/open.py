"""Buckets built from URLs: ``file://``, ``s3://`` (with an endpoint option for MinIO), ``gs://``, ``az://`` and
``memory://``."""

from __future__ import annotations

import datetime as dt
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from obstore.store import LocalStore, MemoryStore, ObjectStore, S3Store, from_url

from shale.config import BucketConfig
from shale.errors import ConfigError
from shale.objstore.obstore_bucket import ObstoreBucket, RetryPolicy

_MEMORY: dict[str, ObjectStore] = {}
_CACHE_LOCK = threading.RLock()  # task_bucket holds it while open_bucket takes it for memory:// URLs
_TASK_BUCKETS: dict[str, ObstoreBucket] = {}
# Shale retries itself (see obstore_bucket), so obstore's client must not retry underneath it.
_NO_CLIENT_RETRIES: Any = {"max_retries": 0, "retry_timeout": dt.timedelta(seconds=60)}
_CLIENT: Any = {"timeout": "60s", "connect_timeout": "5s"}


def local_path(url: str) -> Path:
    """The directory of a ``file://`` URL; relative paths (``file://.shale/bucket``) are relative to the cwd."""
    return Path(url.removeprefix("file://")).expanduser().resolve()


def open_bucket(config: BucketConfig) -> ObstoreBucket:
    """Open the configured bucket. ``memory://NAME`` is shared by everything in the process using that URL."""
    url = config.url
    scheme = urlparse(url).scheme
    retry = RetryPolicy(config.retry.attempts, config.retry.base_delay, config.retry.max_delay)
    store: ObjectStore
    if scheme == "memory":
        with _CACHE_LOCK:
            store = _MEMORY.setdefault(url, MemoryStore())
        return ObstoreBucket(store, url, retry=retry)
    if scheme == "file":
        root = local_path(url)
        root.mkdir(parents=True, exist_ok=True)
        return ObstoreBucket(LocalStore(root, mkdir=True), url, local_root=root, retry=retry)
    if scheme == "s3":
        parsed = urlparse(url)
        if not parsed.netloc:
            raise ConfigError(f"bucket.url = {url!r}: an s3 URL needs a bucket name, like s3://my-bucket")
        options: dict[str, Any] = {"region": config.region, **config.options}
        if config.endpoint:
            options["endpoint"] = config.endpoint
            options.setdefault("virtual_hosted_style_request", False)
        if config.access_key_id:
            options["access_key_id"] = config.access_key_id
            options["secret_access_key"] = config.secret_access_key.get_secret_value()
        client: Any = dict(_CLIENT, allow_http=config.allow_http)
        store = S3Store(parsed.netloc, prefix=parsed.path.strip("/") or None, client_options=client,
                        retry_config=_NO_CLIENT_RETRIES, **options)
        return ObstoreBucket(store, url, retry=retry)
    extra: Any = dict(config.options)
    client_options: Any = dict(_CLIENT, allow_http=config.allow_http)
    store = from_url(url, config=extra, client_options=client_options, retry_config=_NO_CLIENT_RETRIES)
    return ObstoreBucket(store, url, retry=retry)


def task_bucket(config: BucketConfig) -> ObstoreBucket:
    """The process's client for this bucket, for Spark tasks: Python workers are reused from task to task, so one
    client (its connection pool, credentials and TLS sessions) serves them all instead of one per task."""
    # The JSON dump masks the secret key, so the key itself is part of the cache key (kept in memory only).
    key = config.model_dump_json() + "\0" + config.secret_access_key.get_secret_value()
    with _CACHE_LOCK:
        bucket = _TASK_BUCKETS.get(key)
        if bucket is None:
            bucket = _TASK_BUCKETS[key] = open_bucket(config)
        return bucket


def scratch_bucket() -> ObstoreBucket:
    """A bucket in this process's memory of its own (not shared with any other, dropped with the object): for
    rehearsing a write path without writing anywhere. Its requests cost nothing: they are counted on the instance
    only, not in the metrics or a task's ``RequestReport``."""
    return ObstoreBucket(MemoryStore(), "memory://scratch", exported=False)


def open_bucket_url(url: str, **fields: Any) -> ObstoreBucket:
    """Shorthand for tests and tools: ``open_bucket(BucketConfig(url=url, **fields))``."""
    return open_bucket(BucketConfig(url=url, **fields))
