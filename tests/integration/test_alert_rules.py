"""The alert rules, checked and unit-tested by Prometheus's own promtool (deploy/prometheus/shale-alerts.test.yml).

promtool is built into the cache by `make deps`; if it is missing it is built here, and if it cannot be built
these tests fail: they never skip.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from tests.promtool import RULE_TESTS, RULES, run_promtool


def _alerts() -> list[str]:
    return [r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r]


def test_promtool_checks_the_rules() -> None:
    result = run_promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(_alerts())} rules found" in result.stdout


def test_promtool_unit_tests_of_the_rules_pass() -> None:
    result = run_promtool("test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    tests = yaml.safe_load(RULE_TESTS.read_text())
    assert tests["rule_files"] == [RULES.name]
    firing: set[str] = set()
    silent: set[str] = set()
    for group in tests["tests"]:
        for case in group.get("alert_rule_test", []):
            (firing if case["exp_alerts"] else silent).add(case["alertname"])
    alerts = set(_alerts())
    assert len(alerts) >= 8
    assert alerts - firing == set(), "alerts never shown firing"
    assert alerts - silent == set(), "alerts never shown not firing"
    assert (firing | silent) - alerts == set(), "tests of alerts that do not exist"


def test_the_unit_tests_fail_when_a_rule_is_broken(tmp_path: Path) -> None:
    # The same tests against a copy of the rules whose lag threshold is off by one: promtool must report it.
    rules = RULES.read_text()
    assert "(shale_ingest_lag_records) > 1000000" in rules
    (tmp_path / RULES.name).write_text(rules.replace("(shale_ingest_lag_records) > 1000000",
                                                     "(shale_ingest_lag_records) >= 1000000"))
    (tmp_path / RULE_TESTS.name).write_text(RULE_TESTS.read_text())
    result = run_promtool("test", "rules", str(tmp_path / RULE_TESTS.name))
    assert result.returncode != 0
    assert 'alertname: ShaleIngestLagHigh' in result.stdout + result.stderr
