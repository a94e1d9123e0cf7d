"""Measuring what a piece of work costs the process it runs in (Spark tasks report it to their drivers)."""

from __future__ import annotations

import os
import threading

import pyarrow as pa


class PeakMemory:
    """Peak memory while a block of code runs, sampled every 10 ms: the process's resident set (which also holds
    allocator caches and modules loaded on first use) and the bytes Arrow has allocated (the data itself)."""

    def __init__(self) -> None:
        self.start = self.peak = self._rss()
        self.arrow_start = self.arrow_peak = pa.total_allocated_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self.sample()

    def sample(self) -> None:
        self.peak = max(self.peak, self._rss())
        self.arrow_peak = max(self.arrow_peak, pa.total_allocated_bytes())

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()
