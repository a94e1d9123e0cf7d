"""Waiting for a condition in tests: poll with a short backoff until it holds or a deadline passes.

Tests never sleep a fixed time before an assertion; they wait for the condition the assertion needs, with a
deadline long enough for a slow machine, and fail with a message that names what they waited for. This is the
tests' one way to wait: ``tests/unit/test_waiting.py`` fails on a hand-written deadline loop or a fixed sleep in a
test.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

FIRST_PAUSE = 0.05
LONGEST_PAUSE = 0.5


def eventually(condition: Callable[[], T], timeout: float, what: str | Callable[[], str]) -> T:
    """Call ``condition`` until it returns a truthy value, and return that value.

    Between calls the pause doubles from 50 ms up to 0.5 s. An exception raised by ``condition`` counts as
    "not yet" and is kept for the failure message, except ``AssertionError``, which fails at once: a condition
    raises it when waiting longer cannot help (the process it waits for has exited, for example).

    After ``timeout`` seconds, raises ``AssertionError`` naming ``what`` (a string, or a function called then,
    so that the message can show the state at the deadline) and the last value or exception.
    """
    deadline = time.monotonic() + timeout
    pause = FIRST_PAUSE
    while True:
        try:
            value = condition()
        except AssertionError:
            raise
        except Exception as exc:  # any other failure means "not yet"; it is reported if time runs out
            last = f"last exception: {exc!r}"
        else:
            if value:
                return value
            last = f"last value: {value!r}"
        if time.monotonic() >= deadline:
            described = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout:g} s waiting for {described}; {last}")
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(pause * 2, LONGEST_PAUSE)
