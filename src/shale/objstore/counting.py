"""Counting of object-store requests: per bucket instance for tests and benchmarks, and as Prometheus metrics."""

from __future__ import annotations

import threading
from collections import Counter

from prometheus_client import Counter as PromCounter

REQUESTS = PromCounter(
    "shale_objstore_requests_total",
    "Object-store requests sent, by operation and outcome (ok, not_found, conflict, error, retried).",
    ["operation", "outcome"],
)

BYTES_READ = PromCounter("shale_objstore_read_bytes_total", "Bytes received from the object store.")
SECONDS = PromCounter("shale_objstore_request_seconds_total",
                      "Seconds spent waiting on object-store requests, by operation (retries and backoff included).",
                      ["operation"])

OPERATIONS = ("get", "get_range", "head", "list", "put", "delete")


class CallCounter:
    """Thread-safe counts of requests by operation. ``list`` counts one request per page of 1,000 keys,
    which is what S3, GCS and MinIO return per ListObjects call."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._bytes_read = 0
        self._seconds = 0.0

    def add(self, operation: str, outcome: str = "ok", n: int = 1) -> None:
        with self._lock:
            self._counts[operation] += n
        REQUESTS.labels(operation, outcome).inc(n)

    def add_bytes_read(self, n: int) -> None:
        with self._lock:
            self._bytes_read += n
        BYTES_READ.inc(n)

    def add_seconds(self, operation: str, seconds: float) -> None:
        with self._lock:
            self._seconds += seconds
        SECONDS.labels(operation).inc(seconds)

    @property
    def seconds(self) -> float:
        """Seconds spent waiting on requests (retries and backoff included), all operations."""
        with self._lock:
            return self._seconds

    @property
    def bytes_read(self) -> int:
        """Bytes received by GET and ranged GET requests."""
        with self._lock:
            return self._bytes_read

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {op: self._counts.get(op, 0) for op in OPERATIONS}

    def total(self) -> int:
        with self._lock:
            return sum(self._counts.values())

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()
            self._bytes_read = 0
            self._seconds = 0.0
