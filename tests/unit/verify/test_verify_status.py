"""`shale verify` never summarises records not yet ingested, or quarantined, as OK (issue 29, case 2), nor offsets
Kafka deleted before they were read as "not yet ingested"."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from tests.factories import BASE_MS, write_backup_block

from shale.compactor.merge import merge_blocks
from shale.index import OffsetRow
from shale.kafka import TopicState
from shale.objstore import open_bucket_url
from shale.verify import NothingStored, VerifyReport, verify_topic
from shale.verify.reconcile import PartitionReport, pending, stored_offsets


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
    ({"lost": 200, "not_yet_ingested": 100}, "LOST"),
    ({"lost": 1, "quarantined": 3}, "LOST"),
    ({"lost": 5, "missing": 1}, "PROBLEMS"),
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

    assert sorted(VERIFY_EXIT.values()) == [0, 1, 3, 4, 5]
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


# --- offsets Kafka deleted before the group read them ------------------------------------------------------------

@given(earliest=st.integers(0, 300), held=st.integers(0, 300), committed=st.one_of(st.none(), st.integers(0, 700)))
@example(earliest=300, held=200, committed=100)  # the issue's: 200 lost, 100 not yet ingested (was "300 not yet")
@example(earliest=300, held=200, committed=300)  # the loss acknowledged: the committed end moved to Kafka's earliest
@example(earliest=300, held=200, committed=650)  # ahead of Kafka's end (a truncated log): neither
def test_every_offset_above_the_committed_end_is_lost_or_not_yet_ingested_never_both(
        earliest: int, held: int, committed: int | None) -> None:
    end = earliest + held
    lost, not_yet = pending(earliest, end, committed)
    assert lost.step == not_yet.step == 1
    start = earliest if committed is None else committed
    for offset in range(end + 60):
        in_kafka = earliest <= offset < end
        above = offset >= start
        assert (offset in lost) == (above and offset < earliest)  # gone before it was read
        assert (offset in not_yet) == (above and in_kafka)  # still in Kafka: it may yet be ingested
    if committed is None:
        assert len(lost) == 0  # a group that never committed starts at Kafka's earliest: nothing of it was lost


class _Committed(NothingStored):
    def __init__(self, *rows: OffsetRow) -> None:
        self.rows = list(rows)

    def offsets(self, group: str | None = None, generation: int | None = None) -> list[OffsetRow]:
        return [r for r in self.rows if r.group == group and r.generation == generation]


def _verify_against(monkeypatch: pytest.MonkeyPatch, bounds: dict[int, tuple[int, int]],
                    committed: dict[int, int]) -> VerifyReport:
    """``verify_topic`` over Kafka answers given here (bounds per partition; every offset it holds is a record)."""
    monkeypatch.setattr("shale.verify.reconcile.describe_topics",
                        lambda kafka, topics: {"logs": TopicState("logs", "INC", tuple(sorted(bounds)))})
    monkeypatch.setattr("shale.verify.reconcile.offset_bounds",
                        lambda kafka, tps: {("logs", p): bounds[p] for _, p in tps})
    monkeypatch.setattr("shale.verify.reconcile.existing_offsets",
                        lambda kafka, topic, partition, start, end: list(range(start, end)))
    monkeypatch.setattr("shale.verify.reconcile._compacted", lambda kafka, topic: False)
    rows = [OffsetRow(group="backup", generation=1, topic="logs", partition=p, committed_end=end, max_event_time=0,
                      updated_at=0, incarnation="INC") for p, end in committed.items()]
    from shale.config import KafkaConfig

    return verify_topic(_Committed(*rows), open_bucket_url("memory://verify-lost"), KafkaConfig(), "backup", 1,
                        "logs")


def test_case11_offsets_kafka_deleted_before_they_were_read_are_lost_not_not_yet_ingested(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Kafka holds [300, 400) of partition 0; the group committed up to 100; retention deleted [100, 300) before
    it was read. Before: "300 not yet ingested: NOT YET" (exit 3), an operator waits for records that will never
    come. Now: 200 lost, with the range and the command, and 100 not yet ingested."""
    report = _verify_against(monkeypatch, {0: (300, 400), 1: (0, 50)}, {0: 100})  # partition 1: never committed
    zero, one = report.partitions
    assert (zero.lost, zero.not_yet_ingested, zero.missing) == (200, 100, 0)
    assert zero.action == ("shale offsets acknowledge-loss --group backup --generation 1 --topic logs --partition 0 "
                           "--to 300")
    assert (one.lost, one.not_yet_ingested, one.action) == (0, 50, "")
    assert report.status == "LOST"
    assert (report.as_dict()["lost"], report.as_dict()["not_yet_ingested"]) == (200, 150)
    acknowledged = _verify_against(monkeypatch, {0: (300, 400)}, {0: 300})  # the command moved the committed end
    assert (acknowledged.lost, acknowledged.not_yet_ingested, acknowledged.status) == (0, 100, "NOT YET")


def test_case11_the_verify_command_prints_the_lost_range_and_the_command_and_exits_5(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from shale.cli import cli

    report = _verify_against(monkeypatch, {0: (300, 400)}, {0: 100})
    monkeypatch.setattr("shale.verify.reconcile.verify_topic", lambda *args: report)
    config = tmp_path / "shale.toml"
    config.write_text(f'[bucket]\nurl = "memory://verify-cli"\n[metastore]\ndata_dir = "{tmp_path}"\n')
    result = CliRunner().invoke(cli, ["--config", str(config), "verify", "--group", "backup", "--topic", "logs"])
    assert result.exit_code == 5, result.output
    assert "lost [100,300): Kafka's retention deleted these 200 offsets" in result.output
    assert "shale offsets acknowledge-loss --group backup --generation 1 --topic logs --partition 0 --to 300" in (
        result.output)
    assert result.output.rstrip().endswith("200 lost, 100 not yet ingested, 0 not in Kafka: LOST")


def test_kafka_that_does_not_answer_is_not_a_verdict_and_has_its_own_exit(monkeypatch: pytest.MonkeyPatch,
                                                                          tmp_path: Path) -> None:
    from click.testing import CliRunner

    from shale.cli import cli
    from shale.errors import RetryableError

    def unreachable(*_: object) -> None:
        raise RetryableError("Kafka at 127.0.0.1:1 did not answer a metadata request: timed out")

    monkeypatch.setattr("shale.verify.reconcile.verify_topic", unreachable)
    config = tmp_path / "shale.toml"
    config.write_text(f'[bucket]\nurl = "memory://verify-cli"\n[metastore]\ndata_dir = "{tmp_path}"\n')
    result = CliRunner().invoke(cli, ["--config", str(config), "verify", "--group", "backup", "--topic", "logs"])
    assert result.exit_code == 6  # not 1, which says records are missing
    assert result.output == ("could not verify backup topic logs: Kafka at 127.0.0.1:1 did not answer a metadata "
                             "request: timed out\n")
