"""Throttling a restore: a token bucket over records and bytes per second.

A restore's limits are for the whole job. Each of the ``n`` tasks that run at the same time takes ``1/n`` of them
(``share``), so the job as a whole stays under the limit whatever the number of partitions. A bucket starts full
with one second's allowance, so a short burst is sent at once; after that the sender waits for its debt.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class RestoreLimits:
    """Records and bytes (key + value + headers) per second for the whole restore; None: no limit."""

    records_per_s: float | None = None
    bytes_per_s: float | None = None

    def share(self, tasks: int) -> RestoreLimits:
        """One of ``tasks`` tasks running at once: its part of the job's limits."""
        n = max(1, tasks)
        return RestoreLimits(None if self.records_per_s is None else self.records_per_s / n,
                             None if self.bytes_per_s is None else self.bytes_per_s / n)

    @property
    def limited(self) -> bool:
        return self.records_per_s is not None or self.bytes_per_s is not None


class _Bucket:
    def __init__(self, rate: float, now: float) -> None:
        self.rate, self.allowance, self.last = rate, rate, now  # full: one second's worth

    def take(self, amount: float, now: float) -> float:
        """Take ``amount``; return the seconds to wait until the allowance is no longer in debt."""
        self.allowance = min(self.rate, self.allowance + (now - self.last) * self.rate) - amount
        self.last = now
        return max(0.0, -self.allowance / self.rate)


class Throttle:
    """``take(records, nbytes)`` before sending; it sleeps as long as the limits require. Not thread-safe."""

    def __init__(self, limits: RestoreLimits, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.clock, self.sleep = clock, sleep
        now = clock()
        self.buckets = [(_Bucket(rate, now), index) for index, rate in
                        enumerate((limits.records_per_s, limits.bytes_per_s)) if rate is not None and rate > 0]

    def take(self, records: int, nbytes: int) -> float:
        """Account for ``records`` records of ``nbytes`` bytes; sleep if over the limits. Returns the seconds
        slept."""
        if not self.buckets:
            return 0.0
        now = self.clock()
        wait = max(bucket.take((records, nbytes)[index], now) for bucket, index in self.buckets)
        if wait > 0:
            self.sleep(wait)
        return wait
