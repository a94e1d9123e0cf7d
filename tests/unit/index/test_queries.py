"""Index queries: tenants, data time ranges, label matchers in Prometheus syntax, label names and values."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.factories import BASE_MS
from tests.unit.metastore.helpers import meta

from shale.errors import InvalidNameError, QueryTimeoutError
from shale.index import parse_matchers
from shale.metastore.rules.commands import AddBlocks, encode
from shale.metastore.rules.fsm import Entry, StateMachine

H = 3600 * 1000


@pytest.fixture
def sm(tmp_path: Path) -> StateMachine:
    machine = StateMachine(tmp_path / "s.db")
    blocks = [
        meta(start=0, min_time=BASE_MS, max_time=BASE_MS + H,
             labels=[{"topic": "app", "level": "INFO", "dt": "2026-11-18"},
                     {"topic": "app", "level": "ERROR", "dt": "2026-11-18"}]),
        meta(start=100, end=200, min_time=BASE_MS + 2 * H, max_time=BASE_MS + 3 * H,
             labels=[{"topic": "app", "level": "INFO", "dt": "2026-11-18"}]),
        meta(topic="web", start=0, min_time=BASE_MS, max_time=BASE_MS + H, labels=[{"topic": "web", "level": "WARN"}]),
        meta(tenant="beta", start=0, min_time=BASE_MS, max_time=BASE_MS + H, labels=[{"topic": "app"}]),
        meta(start=300, end=400, time_ms=BASE_MS + 30 * H, min_time=BASE_MS + 30 * H, max_time=BASE_MS + 31 * H),
    ]
    machine.apply(Entry(1, 1, BASE_MS), encode(AddBlocks(blocks=blocks)))
    return machine


def _q(sm: StateMachine, selector: str, start: int = BASE_MS, end: int = BASE_MS + 100 * H,
       tenants: tuple[str, ...] = ("acme",)) -> list[tuple[int, str]]:
    return sorted((m.kafka[0].start, m.kafka[0].topic)
                  for m in sm.reader.query_blocks(list(tenants), start, end, parse_matchers(selector)))


def test_time_range_and_tenants(sm: StateMachine) -> None:
    assert _q(sm, "{}") == [(0, "app"), (0, "web"), (100, "app"), (300, "app")]
    assert _q(sm, "{}", BASE_MS + 2 * H, BASE_MS + 2 * H + 1) == [(100, "app")]
    assert _q(sm, "{}", BASE_MS + 29 * H, BASE_MS + 29 * H + 10) == []
    assert _q(sm, "{}", tenants=("beta",)) == [(0, "app")]
    assert _q(sm, "{}", tenants=("nobody",)) == []


@pytest.mark.parametrize(("selector", "expected"), [
    ('{topic="app", level="ERROR"}', [(0, "app")]),
    ('{level=~"INFO|WARN"}', [(0, "app"), (0, "web"), (100, "app")]),
    ('{topic="app", level!="INFO"}', [(0, "app"), (300, "app")]),  # a missing label equals ""
    ('{level!~"INFO|ERROR"}', [(0, "web"), (300, "app")]),
    ('{kind="records", group="backup", topic="web"}', [(0, "web")]),
    ('{dt="2026-11-18"}', [(0, "app"), (100, "app")]),
    ('level="ERROR"', [(0, "app")]),
])
def test_label_matchers(sm: StateMachine, selector: str, expected: list[tuple[int, str]]) -> None:
    assert _q(sm, selector) == expected


def test_label_names_and_values(sm: StateMachine) -> None:
    r = sm.reader
    assert r.label_names(["acme"], BASE_MS, BASE_MS + 100 * H) == ["dt", "group", "kind", "level", "topic"]
    assert r.label_values("level", ["acme"], BASE_MS, BASE_MS + 100 * H) == ["ERROR", "INFO", "WARN"]
    assert r.label_values("level", ["acme"], BASE_MS, BASE_MS + 100 * H, parse_matchers('{topic="web"}')) == ["WARN"]


@pytest.mark.parametrize("bad", ['{topic="a"', '{topic=="a"}', "{1x=\"a\"}", '{a=~"("}', "{a=b}"])
def test_bad_selectors_are_clear_errors(bad: str) -> None:
    with pytest.raises(InvalidNameError):
        parse_matchers(bad)


def test_matcher_strings_round_trip() -> None:
    matchers = parse_matchers(r'{msg="say \"hi\"", a!~"x|y"}')
    assert [str(m) for m in matchers] == [r'msg="say \"hi\""', 'a!~"x|y"']
    assert matchers[0].value == 'say "hi"'


def test_regexes_are_re2_with_prometheus_semantics() -> None:
    (m,) = parse_matchers('{message=~"(a+)+$"}')
    long_value = "a" * 200_000 + "b"  # catastrophic for a backtracking engine; linear for RE2
    assert not m.matches({"message": long_value})
    assert m.matches({"message": "a" * 200_000})
    (dot,) = parse_matchers('{m=~"x.y"}')
    assert dot.matches({"m": "x\ny"})  # as in Prometheus 3, . matches a newline
    assert not dot.matches({"m": "ax\ny"})  # fully anchored
    with pytest.raises(InvalidNameError, match="RE2"):
        parse_matchers('{a=~"(?=x)x"}')  # lookarounds are not RE2 (nor Prometheus)


def test_a_query_past_its_deadline_stops_with_a_clear_error(sm: StateMachine) -> None:
    with pytest.raises(QueryTimeoutError, match=r"metastore\.query_timeout"):
        sm.reader.query_blocks(["acme"], BASE_MS, BASE_MS + 100 * H, timeout=0.0)
    with pytest.raises(QueryTimeoutError):
        sm.reader.label_values("level", ["acme"], BASE_MS, BASE_MS + 100 * H, timeout=0.0)
    # The connection is usable afterwards, and a generous deadline changes nothing.
    assert len(sm.reader.query_blocks(["acme"], BASE_MS, BASE_MS + 100 * H, timeout=60)) == 4
