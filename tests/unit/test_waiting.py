"""`eventually` returns the first truthy value, and on timeout names what it waited for and what it last saw."""

from __future__ import annotations

import itertools

import pytest
from tests.waiting import eventually


def test_returns_the_first_truthy_value() -> None:
    calls = itertools.count()
    assert eventually(lambda: max(0, next(calls) - 2), 10, "the third call") == 1


def test_timeout_names_what_and_the_last_value() -> None:
    with pytest.raises(AssertionError, match=r"waiting for the queue to drain; last value: \[\]"):
        eventually(list, 0.2, "the queue to drain")


def test_exceptions_count_as_not_yet_and_the_last_one_is_reported() -> None:
    calls = itertools.count()

    def flaky() -> str:
        if next(calls) < 2:
            raise ConnectionError("refused")
        return "up"

    assert eventually(flaky, 10, "the service") == "up"

    def down() -> str:
        raise ConnectionError("refused")

    with pytest.raises(AssertionError, match=r"the service \(state: down\); last exception: ConnectionError"):
        eventually(down, 0.2, lambda: "the service (state: down)")


def test_an_assertion_in_the_condition_fails_at_once() -> None:
    calls = itertools.count()

    def exited() -> bool:
        next(calls)
        raise AssertionError("the process exited")

    with pytest.raises(AssertionError, match="the process exited"):
        eventually(exited, 60, "the process")
    assert next(calls) == 1  # called once, not retried until the deadline
