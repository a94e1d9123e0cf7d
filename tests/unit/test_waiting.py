"""`eventually` returns the first truthy value, and on timeout names what it waited for and what it last saw."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

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


# -- one way to wait ------------------------------------------------------------------------------------------

TESTS = Path(__file__).resolve().parents[1]
CLOCKS = {"monotonic", "time", "perf_counter"}


def _is_call(node: ast.AST, names: set[str]) -> bool:
    """Whether ``node`` is a call of ``time.<name>`` or of a bare ``<name>``, for one of ``names``."""
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    return ((isinstance(f, ast.Attribute) and f.attr in names and isinstance(f.value, ast.Name)
             and f.value.id == "time") or (isinstance(f, ast.Name) and f.id in names))


def _calls(node: ast.AST, names: set[str]) -> bool:
    return any(_is_call(n, names) for n in ast.walk(node))


def _own_statements(function: ast.FunctionDef) -> list[ast.AST]:
    """The nodes of ``function``'s own body: not those of functions, lambdas or classes defined in it."""
    found: list[ast.AST] = []
    todo: list[ast.AST] = list(function.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        found.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return found


def _fixed(call: ast.AST) -> bool:
    """Whether a call's arguments are constants (``time.sleep(3)``: a fixed time, not a random moment of a fault
    test such as ``time.sleep(rng.uniform(0.2, 3.0))``)."""
    assert isinstance(call, ast.Call)
    return all(isinstance(n, (ast.Constant, ast.BinOp, ast.UnaryOp, ast.operator, ast.unaryop))
               for arg in call.args for n in ast.walk(arg))


def _compares_the_clock(loop: ast.AST) -> bool:
    """Whether a loop compares the clock with something (``assert time.monotonic() < deadline`` around a blocking
    poll is a deadline loop without a sleep)."""
    return any(isinstance(n, ast.Compare) and _calls(n, CLOCKS) for n in ast.walk(loop))


def waiting_offences(source: str) -> list[str]:
    """Hand-written deadline loops (a loop that reads the clock and sleeps: ``eventually`` does that) and fixed
    sleeps in a test's own body (a test waits for the condition it needs, never a fixed time)."""
    tree = ast.parse(source)
    offences = [f"line {n.lineno}: a deadline loop" for n in ast.walk(tree) if isinstance(n, (ast.While, ast.For))
                and (_compares_the_clock(n) or (_calls(n, {"sleep"}) and _calls(n, CLOCKS)))]
    for function in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")):
        offences += [f"line {n.lineno}: a fixed sleep in {function.name}" for n in _own_statements(function)
                     if _is_call(n, {"sleep"}) and _fixed(n)]
    return sorted(set(offences))


def test_tests_wait_one_way() -> None:
    files = sorted(p for p in TESTS.rglob("*.py") if p.name != "waiting.py")
    assert len(files) > 50
    offenders = {str(p.relative_to(TESTS)): found for p in files if (found := waiting_offences(p.read_text()))}
    assert offenders == {}


def test_the_wait_check_sees_deadline_loops_and_fixed_sleeps() -> None:
    loop = ("def helper():\n    deadline = time.monotonic() + 5\n    while not ready():\n"
            "        assert time.monotonic() < deadline\n        time.sleep(0.2)\n")
    sleep = "def test_x():\n    produce()\n    time.sleep(3)\n    assert consumed()\n"
    nested = "def test_y():\n    def slow():\n        time.sleep(0.01)\n    run(slow)\n"
    random_moment = "def test_z():\n    start()\n    time.sleep(rng.uniform(0.2, 3.0))\n    kill()\n"
    polling = ("def helper():\n    deadline = time.monotonic() + 5\n    while not done:\n"
               "        assert time.monotonic() < deadline\n        message = consumer.poll(0.5)\n")
    assert waiting_offences(loop) == waiting_offences(polling) == ["line 3: a deadline loop"]
    assert waiting_offences(sleep) == ["line 3: a fixed sleep in test_x"]
    assert waiting_offences(nested) == waiting_offences(random_moment) == []
