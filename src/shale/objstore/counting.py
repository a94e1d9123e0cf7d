"""Counting of object-store requests: per bucket instance for tests and benchmarks, per process for the tasks
that run in Spark's Python workers, and as Prometheus metrics.

A Spark task's requests are made in a Python worker, a process no one scrapes. So a task counts what it made
(``counting_requests``: this process's requests by bucket, operation and outcome while the task ran; a Python
worker runs one task at a time) and returns the ``RequestReport`` with its result; the driver adds it to its own
``shale_objstore_requests_total`` with ``by="tasks"`` (``add_task_requests``), beside its own requests
(``by="process"``). A report from a task that ran in the driver's own process (a test's in-process runner) is
counted there already and is not added again (``RequestReport.process``)."""

from __future__ import annotations

import os
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

from prometheus_client import Counter as PromCounter
from pydantic import BaseModel, ConfigDict

REQUESTS = PromCounter(
    "shale_objstore_requests_total",
    "Object-store requests sent, by operation and outcome (ok, not_found, conflict, error, retried), and by who "
    "made them: this process, or the Spark tasks it ran (in Python workers, reported with their results).",
    ["operation", "outcome", "by"],
)
BY_PROCESS = "process"
BY_TASKS = "tasks"

BYTES_READ = PromCounter("shale_objstore_read_bytes_total", "Bytes received from the object store.")
SECONDS = PromCounter("shale_objstore_request_seconds_total",
                      "Seconds spent waiting on object-store requests, by operation (retries and backoff included).",
                      ["operation"])

OPERATIONS = ("get", "get_range", "head", "list", "put", "delete")
P = ParamSpec("P")
T = TypeVar("T")

_LEDGER_LOCK = threading.Lock()
_LEDGER: Counter[tuple[str, str, str]] = Counter()
"""This process's requests by (bucket URL, operation, outcome), for ``counting_requests``."""
_PROCESS = [uuid.uuid4().hex]
"""This process's token: a report carries it, so a driver knows a report of its own process (regenerated in a
forked child, such as a Python worker forked by Spark's daemon)."""


def _forked() -> None:
    global _LEDGER_LOCK
    _LEDGER_LOCK = threading.Lock()
    _PROCESS[0] = uuid.uuid4().hex


os.register_at_fork(after_in_child=_forked)


class CallCounter:
    """Thread-safe counts of requests by operation. ``list`` counts one request per page of 1,000 keys,
    which is what S3, GCS and MinIO return per ListObjects call. ``bucket`` (the URL) names the bucket in this
    process's ledger; ``exported=False`` keeps a bucket out of the ledger and the metrics (a scratch bucket in
    memory, whose requests cost nothing)."""

    def __init__(self, bucket: str = "", *, exported: bool = True) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._bytes_read = 0
        self._seconds = 0.0
        self._bucket = bucket
        self._exported = exported

    def add(self, operation: str, outcome: str = "ok", n: int = 1) -> None:
        with self._lock:
            self._counts[operation] += n
        if self._exported:
            with _LEDGER_LOCK:
                _LEDGER[(self._bucket, operation, outcome)] += n
            REQUESTS.labels(operation, outcome, BY_PROCESS).inc(n)

    def add_bytes_read(self, n: int) -> None:
        with self._lock:
            self._bytes_read += n
        if self._exported:
            BYTES_READ.inc(n)

    def add_seconds(self, operation: str, seconds: float) -> None:
        with self._lock:
            self._seconds += seconds
        if self._exported:
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


class RequestCount(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    bucket: str
    operation: str
    outcome: str
    n: int


class RequestReport(BaseModel):
    """The requests a task made (by bucket, operation and outcome), returned with its result."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    process: str = ""
    """The token of the process the task ran in."""
    counts: tuple[RequestCount, ...] = ()

    def total(self, operation: str | None = None, bucket: str | None = None) -> int:
        return sum(c.n for c in self.counts
                   if (operation is None or c.operation == operation) and (bucket is None or c.bucket == bucket))

    def __add__(self, other: RequestReport) -> RequestReport:
        summed: Counter[tuple[str, str, str]] = Counter()
        for c in (*self.counts, *other.counts):
            summed[(c.bucket, c.operation, c.outcome)] += c.n
        return RequestReport(process=self.process if self.process == other.process else "", counts=_counts(summed))


def _counts(counter: Counter[tuple[str, str, str]]) -> tuple[RequestCount, ...]:
    return tuple(RequestCount(bucket=b, operation=op, outcome=out, n=n)
                 for (b, op, out), n in sorted(counter.items()) if n > 0)


def _ledger() -> Counter[tuple[str, str, str]]:
    with _LEDGER_LOCK:
        return Counter(_LEDGER)


@contextmanager
def counting_requests() -> Iterator[list[RequestReport]]:
    """The requests this process makes inside the block, as the one ``RequestReport`` the yielded list holds once
    the block ends (also when it raises). Meant for a Spark task: its Python worker runs one task at a time, so
    the process's requests meanwhile are the task's (in a driver, other threads' requests would be included: a
    report of the driver's own process is never added, ``add_task_requests``)."""
    before = _ledger()
    out: list[RequestReport] = []
    try:
        yield out
    finally:
        out.append(RequestReport(process=_PROCESS[0], counts=_counts(_ledger() - before)))


def add_task_requests(report: RequestReport) -> bool:
    """Add a task's requests to this process's ``shale_objstore_requests_total{by="tasks"}``, unless the task ran in
    this process (its requests are counted here already, ``by="process"``). Returns whether they were added."""
    if report.process == _PROCESS[0]:
        return False
    for c in report.counts:
        REQUESTS.labels(c.operation, c.outcome, BY_TASKS).inc(c.n)
    return True


def with_requests(fn: Callable[P, T]) -> Callable[P, tuple[T, str]]:
    """``fn`` returning its result and the ``RequestReport`` (JSON) of the requests it made: the function of a Spark
    task (``rdd.map(with_requests(lambda p: run(p, ...)))``), whose driver reads the results with
    ``results_counted``."""

    def counted(*args: P.args, **kwargs: P.kwargs) -> tuple[T, str]:
        with counting_requests() as requests:
            result = fn(*args, **kwargs)
        return result, requests[0].model_dump_json()

    return counted


def results_counted(rows: Iterable[tuple[T, str]]) -> list[T]:
    """The results of ``with_requests`` tasks, their requests added to this process's metric
    (``add_task_requests``)."""
    results = []
    for result, report in rows:
        add_task_requests(RequestReport.model_validate_json(report))
        results.append(result)
    return results
