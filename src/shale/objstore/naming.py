"""Time-ordered, unique object names for append-only queues in a bucket (bucket-index deltas, the dead letter queue).

A name is ``<unix ms, 13 digits>-<sequence, 6 digits>-<writer>``: names sort by time in a LIST (which returns keys in
lexical order), the sequence keeps one writer's names unique and increasing inside a millisecond (and when the clock
steps back), and the random writer suffix keeps concurrent writers from ever choosing the same key.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable


class OrderedNames:
    """Thread-safe generator of names that increase for this instance and never collide with another instance's."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._last_ms = 0
        self._seq = 0
        self.writer = f"{os.getpid():x}{os.urandom(3).hex()}"

    def next(self) -> tuple[str, int]:
        """The next name and its time in unix milliseconds."""
        with self._lock:
            ms = max(int(self.clock() * 1000), self._last_ms)
            self._seq = self._seq + 1 if ms == self._last_ms else 0
            self._last_ms = ms
            return f"{ms:013d}-{self._seq:06d}-{self.writer}", ms
