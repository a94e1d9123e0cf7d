"""How a long command stops (``shale ingest``, ``compact``, ``restore``, ``reprocess``, ``run``): the first SIGINT or
SIGTERM asks it to stop at its next safe point, with one line on standard error, and it exits 130 (SIGINT) or 143
(SIGTERM) once stopped; a second one stops the process at once, with no traceback. Stopping at once is safe: every
command's progress is committed by the metastore or the Kafka transaction, as after ``kill -9``.

PySpark's ``SparkContext`` installs its own SIGINT handler when it starts (it cancels every Spark job and raises
``KeyboardInterrupt`` wherever the main thread is, which printed py4j tracebacks and planned the batch again):
``shale.spark.spark_session`` puts the handler back that was there before (``keep_handler``)."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class Stopper:
    """The stop request of one command: ``event`` is set by the first signal; ``exit_code`` is 128 + its number."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.event = threading.Event()
        self.signum = 0

    def install(self) -> Stopper:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, self.on_signal)
        return self

    def on_signal(self, signum: int, _: Any) -> None:
        if self.event.is_set():
            sys.stderr.write(f"{self.what}: stopped at once ({signal.Signals(signum).name} again)\n")
            sys.stderr.flush()
            os._exit(128 + signum)
        self.signum = signum
        self.event.set()
        sys.stderr.write(f"{self.what}: stopping at the next safe point ({signal.Signals(signum).name}); send it "
                         "again to stop at once\n")
        sys.stderr.flush()

    @property
    def exit_code(self) -> int:
        return 128 + self.signum if self.signum else 0


@contextmanager
def keep_handler() -> Iterator[None]:
    """The SIGINT handler in place before the block is in place after it (PySpark's SparkContext replaces it)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.getsignal(signal.SIGINT)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
