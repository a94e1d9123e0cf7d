"""`shale verify` never summarises records not yet ingested, or quarantined, as OK (issue 29, case 2)."""

from __future__ import annotations

import pytest
from tests.factories import BASE_MS, write_backup_block

from shale.compactor.merge import merge_blocks
from shale.ingest.verify import PartitionReport, VerifyReport, stored_offsets
from shale.objstore import open_bucket_url


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


def test_a_compacted_block_of_two_incarnations_counts_each_record_once_for_its_own() -> None:
    """Found by the recreated-topic test under load: compaction merged the old incarnation's offsets [0, 200) with
    the new one's [0, 110), and verify took offsets 0-109 for copies (PROBLEMS). Rows the block cannot attribute
    count as present, never as copies; rows only the old incarnation holds are not the new one's."""
    bucket = open_bucket_url("memory://verify-incarnations")
    old = write_backup_block(bucket, "acme", "app", 0, 0, 200, incarnation="OLD")
    new = write_backup_block(bucket, "acme", "app", 0, 0, 110, incarnation="NEW", base_ms=BASE_MS + 3_600_000)
    merged = merge_blocks(bucket, [old, new], job="j", token=1, level=0).output
    assert {r.incarnation for r in merged.kafka} == {"OLD", "NEW"}
    found = stored_offsets(bucket, [merged], "app", "NEW")
    assert found.offsets.get(0, []) == []
    assert found.ambiguous[0] == set(range(110))
    older = stored_offsets(bucket, [merged], "app", "OLD")
    assert sorted(older.offsets[0]) == list(range(110, 200))
    assert sorted(stored_offsets(bucket, [merged], "app").offsets[0]) == sorted([*range(200), *range(110)])
