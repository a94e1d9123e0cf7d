"""`shale verify` never summarises records not yet ingested, or quarantined, as OK (issue 29, case 2)."""

from __future__ import annotations

import pytest

from shale.ingest.verify import PartitionReport, VerifyReport


def _report(**counts: int) -> VerifyReport:
    base = {"stored": 100, "quarantined": 0, "missing": 0, "duplicated": 0, "not_yet_ingested": 0}
    part = PartitionReport(partition=0, kafka_earliest=0, kafka_end=100, committed_end=100, **{**base, **counts})
    return VerifyReport("partition", 1, "logs", [part])


@pytest.mark.parametrize(("counts", "status"), [
    ({}, "OK"),
    ({"not_yet_ingested": 200}, "NOT YET"),
    ({"quarantined": 20}, "QUARANTINED"),
    ({"quarantined": 20, "not_yet_ingested": 1}, "NOT YET"),
    ({"missing": 1, "not_yet_ingested": 5, "quarantined": 3}, "PROBLEMS"),
    ({"duplicated": 2}, "PROBLEMS"),
])
def test_the_verdict_is_the_worst_condition(counts: dict[str, int], status: str) -> None:
    report = _report(**counts)
    assert report.status == status
    assert report.as_dict()["status"] == status
    assert report.as_dict()["not_yet_ingested"] == counts.get("not_yet_ingested", 0)


def test_the_exit_statuses_are_distinct_and_documented() -> None:
    from click.testing import CliRunner

    from shale.cli import cli
    from shale.cli.ingest_cmd import VERIFY_EXIT

    assert sorted(VERIFY_EXIT.values()) == [0, 1, 3, 4]
    help_text = " ".join(CliRunner().invoke(cli, ["verify", "--help"]).output.split())
    for status, code in VERIFY_EXIT.items():
        assert f"{code} {status}:" in help_text
    assert "2 an unknown topic" in help_text
