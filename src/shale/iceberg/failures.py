"""Tables the publisher could not write for a reason of their own (an object it cannot read, a catalog error for
that table): each is set aside with its error and retried with a backoff while every other table is published
(docs/design/iceberg.md 16.4). What a failure records, when its retry is due and how the status shows it.

Not thread-safe: the publisher's lock guards it.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter, Gauge

from shale.iceberg.plan import TableKey

FAILING = Gauge("shale_iceberg_tables_failing", "Tables whose last publish failed for a reason of their own (an "
                "object it cannot read, a catalog error for that table): the log and the status name each and its "
                "error; retried with a backoff while every other table is published.")
TABLE_FAILURES = Counter("shale_iceberg_table_failures_total", "Publishes of one table that failed while the other "
                         "tables went on (each retried with a backoff).")
RETRY_BASE, RETRY_MAX = 5.0, 600.0
"""A failing table's retry delay: ``RETRY_BASE`` doubled per failure in a row, at most ``RETRY_MAX`` (seconds)."""


@dataclass
class TableFailure:
    """A table skipped until ``retry_at``, then brought to the index's state in one repair snapshot, so it needs
    nothing of the change feed, which is trimmed meanwhile."""

    error: str
    since: int
    """The first log entry it did not take."""
    failures: int
    """Failures in a row."""
    retry_at: float
    delay: float
    erasures: set[str] = field(default_factory=set)
    """Erasures whose snapshot it missed: its repair snapshot names them and expires the snapshots naming their
    records."""


class FailingTables:
    """One per publisher (one publisher per process: the gauge is the process's)."""

    def __init__(self) -> None:
        self._tables: dict[TableKey, TableFailure] = {}
        FAILING.set(0)

    def __contains__(self, key: object) -> bool:
        return key in self._tables

    def __len__(self) -> int:
        return len(self._tables)

    def get(self, key: TableKey) -> TableFailure | None:
        return self._tables.get(key)

    def due(self, now: float) -> list[TableKey]:
        """The tables whose retry is due."""
        return sorted(k for k, f in self._tables.items() if f.retry_at <= now)

    def record(self, key: TableKey, index: int, exc: BaseException, now: float,
               erasures: AbstractSet[str] = frozenset()) -> TableFailure:
        """``key`` failed at entry ``index``: one more failure in a row, retried after the next backoff."""
        before = self._tables.get(key)
        failures = before.failures + 1 if before else 1
        delay = min(RETRY_MAX, RETRY_BASE * 2.0 ** min(failures - 1, 10))
        failure = TableFailure(f"{type(exc).__name__}: {exc}"[:500], before.since if before else index, failures,
                               now + delay, delay, (before.erasures if before else set()) | set(erasures))
        self._tables[key] = failure
        FAILING.set(len(self._tables))
        TABLE_FAILURES.inc()
        return failure

    def missed(self, key: TableKey, erasures: AbstractSet[str]) -> None:
        """``key`` skipped the snapshot of these erasures."""
        self._tables[key].erasures |= erasures

    def clear(self, key: TableKey) -> TableFailure | None:
        """``key`` is published again (or no longer Shale's to write)."""
        failure = self._tables.pop(key, None)
        FAILING.set(len(self._tables))
        return failure

    def rows(self, now: float) -> list[dict[str, Any]]:
        """The status's ``failing_tables``."""
        return [{"tenant": k.tenant, "topic": k.topic, "record": k.record, "error": f.error, "since_entry": f.since,
                 "failures": f.failures, "retry_in": max(0.0, f.retry_at - now)}
                for k, f in sorted(self._tables.items())]
