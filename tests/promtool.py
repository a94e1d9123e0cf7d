"""Running Prometheus's promtool on the shipped alert rules, with synthetic series or with scraped metrics.

promtool is built by ``src/shale/dev/fetch.py`` (``make deps``) into the cache; ``promtool_binary`` builds it there
if it is missing and raises ``FetchError`` if it cannot, so a test that needs it fails loudly and never skips.
"""

from __future__ import annotations

import math
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from shale.dev.fetch import fetch_promtool

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "deploy/prometheus/shale-alerts.yml"
RULE_TESTS = ROOT / "deploy/prometheus/shale-alerts.test.yml"


def promtool_binary() -> Path:
    return fetch_promtool()


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(promtool_binary()), *args], capture_output=True, text=True, timeout=120, check=False)


def _series_name(name: str, labels: Mapping[str, str]) -> str:
    def quoted(value: str) -> str:
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'

    if not labels:
        return name
    return name + "{" + ", ".join(f"{k}={quoted(v)}" for k, v in sorted(labels.items())) + "}"


def _value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Inf" if value > 0 else "-Inf"
    return repr(value)


def input_series(scrapes: Sequence[str], hold: int = 0) -> list[dict[str, str]]:
    """promtool input series from Prometheus text-format scrapes: scrape ``i`` is the sample at minute ``i``, and
    the last scrape is repeated for ``hold`` more minutes (the scraped state persisting). A series missing from a
    scrape has no sample there."""
    samples: dict[str, list[str]] = {}
    for i, text in enumerate(scrapes):
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                values = samples.setdefault(_series_name(sample.name, sample.labels), ["_"] * len(scrapes))
                values[i] = _value(float(sample.value))
    return [{"series": name, "values": " ".join([*values, *[values[-1]] * hold])}
            for name, values in sorted(samples.items())]


def alerts_mismatch(workdir: Path, scrapes: Sequence[str], at_minute: int,
                    expected: Mapping[str, Sequence[Mapping[str, str]]], hold: int = 0) -> str:
    """Evaluate the shipped rules over ``scrapes`` (see ``input_series``) with promtool, and compare the ``ALERTS``
    series of each named alert at ``at_minute`` with the expected label sets (``alertstate`` included, so an
    empty list means neither pending nor firing). Returns "" if they match, else promtool's report."""
    tests = [{
        "expr": f'ALERTS{{alertname="{name}"}}',
        "eval_time": f"{at_minute}m",
        "exp_samples": [{"labels": _series_name("ALERTS", {"alertname": name, **labels}), "value": 1}
                        for labels in alerts],
    } for name, alerts in expected.items()]
    document = {"rule_files": [str(RULES)], "evaluation_interval": "1m",
                "tests": [{"interval": "1m", "input_series": input_series(scrapes, hold), "promql_expr_test": tests}]}
    workdir.mkdir(parents=True, exist_ok=True)
    test_file = workdir / "scraped.test.yml"
    test_file.write_text(yaml.safe_dump(document, sort_keys=False))
    result = run_promtool("test", "rules", str(test_file))
    return "" if result.returncode == 0 else f"promtool test rules {test_file}:\n{result.stdout}{result.stderr}"
