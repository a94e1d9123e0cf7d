"""Measuring what a piece of work costs the process it runs in (Spark tasks report it to their drivers)."""

from __future__ import annotations

import ctypes
import os
import threading

import pyarrow as pa


def release_free_memory() -> None:
    """Give memory the process has freed back to the system: Arrow's pool keeps freed buffers, and glibc keeps
    freed heap pages (large records' buffers come from the heap once glibc has raised its mmap threshold), so a
    reused Python worker would otherwise carry an earlier task's peak into the next."""
    pa.default_memory_pool().release_unused()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim  # noqa: B018 - glibc only
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _libc()


class PeakMemory:
    """Peak memory while a block of code runs, sampled every 10 ms: the process's resident set (which also holds
    allocator caches and modules loaded on first use) and the bytes Arrow has allocated (the data itself)."""

    def __init__(self) -> None:
        self.start = self.peak = self.resident()
        self.arrow_start = self.arrow_peak = pa.total_allocated_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def resident() -> int:
        """The process's resident set now, in bytes."""
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self.sample()

    def sample(self) -> None:
        self.peak = max(self.peak, self.resident())
        self.arrow_peak = max(self.arrow_peak, pa.total_allocated_bytes())

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()
