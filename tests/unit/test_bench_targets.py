"""docs/BENCHMARKS.md's targets table is what the committed results and ``bench/targets.py`` say."""

from __future__ import annotations

import json
from pathlib import Path

from bench.targets import DOC, TARGETS, Target, rewrite, table
from hypothesis import given
from hypothesis import strategies as st


def test_the_targets_table_in_the_docs_is_generated_from_the_committed_results() -> None:
    assert DOC.read_text() == rewrite(DOC), "run `python -m bench targets` and commit docs/BENCHMARKS.md"


def test_every_target_names_a_figure_or_a_ratio() -> None:
    assert all(t.key.split(".")[0] in ("figures", "ratios") for t in TARGETS)
    assert len({(t.bench, t.key, t.op, t.value) for t in TARGETS}) == len(TARGETS)


@given(value=st.floats(-1e6, 1e6), goal=st.floats(-1e6, 1e6), op=st.sampled_from([">=", "<="]))
def test_a_target_is_met_exactly_on_its_side_of_the_goal(value: float, goal: float, op: str) -> None:
    target = Target("b", "ratios.x", op, goal, "x")  # type: ignore[arg-type]
    assert target.met(value) == (value >= goal if op == ">=" else value <= goal)
    assert target.measured({"ratios": {"x": value}}) == value
    assert target.measured({"ratios": {}}) is None


def test_a_result_without_the_figure_shows_as_not_measured(tmp_path: Path) -> None:
    bench = TARGETS[0].bench
    (tmp_path / f"{bench}.json").write_text(json.dumps({"figures": {}, "ratios": {}, "date": "d", "machine": "m"}))
    assert f"| {TARGETS[0].what}: `{bench}` `{TARGETS[0].key}`" in table(tmp_path)
    row = next(line for line in table(tmp_path).splitlines() if TARGETS[0].what in line)
    assert "not measured" in row
