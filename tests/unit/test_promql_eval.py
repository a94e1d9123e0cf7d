"""The test evaluator agrees with Prometheus semantics on the shapes the alert rules use."""

from __future__ import annotations

from pathlib import Path

import yaml
from tests.promql_eval import SeriesStore, evaluate

ROOT = Path(__file__).resolve().parents[2]
SCRAPE = """# TYPE q gauge
q{level="0"} 5
q{level="1"} 0
# TYPE done_total counter
done_total{level="0"} 3
# TYPE cfg gauge
cfg{setting="max"} 100
# TYPE age gauge
age{tenant="a"} 90
age{tenant="b"} 10
"""


def test_selectors_aggregations_comparisons_and_matching() -> None:
    store = SeriesStore()
    store.scrape(SCRAPE, 1000)
    store.scrape(SCRAPE.replace("done_total{level=\"0\"} 3", "done_total{level=\"0\"} 7"), 1060)
    assert evaluate('sum(q) > 0', store, 1060) == {frozenset(): 5.0}
    assert evaluate('sum(increase(done_total[30m])) == 0', store, 1060) == {}
    assert evaluate('sum(increase(done_total[30m]))', store, 1060) == {frozenset(): 4.0}
    fired = evaluate('max by (tenant) (age) > on() group_left() (0.8 * max(cfg{setting="max"}))', store, 1060)
    assert fired == {frozenset({("tenant", "a")}): 90.0}
    assert evaluate('time() - max(age) > 900', store, 1060) == {frozenset(): 970.0}
    assert evaluate('q{level=~"1|2"} == 0', store, 1060)
    assert evaluate('q > 100 and on() sum(q) > 0', store, 1060) == {}


def test_every_shipped_rule_parses_and_evaluates() -> None:
    rules = yaml.safe_load((ROOT / "deploy/prometheus/shale-alerts.yml").read_text())["groups"][0]["rules"]
    assert len(rules) >= 6
    store = SeriesStore()
    store.scrape(SCRAPE, 1000)
    for rule in rules:
        assert rule["annotations"]["runbook"].strip()
        evaluate(rule["expr"], store, 1000)  # unknown metrics give empty results, never an error
