"""Quarantine is loud (issue 29): each batch says, per topic, what it stored and quarantined and why; a topic whose
records (all, or more than ingest.quarantine_warn_share) went to quarantine gets a warning line and the
shale_ingest_quarantining gauge; `shale ingest --available-now` ends with the run's table."""

from __future__ import annotations

import json
import logging
import uuid

import pyarrow as pa
import pytest
from prometheus_client import REGISTRY
from tests.factories import BASE_MS, backup_table

from shale.config import BucketConfig, IngestConfig, ParserRule
from shale.encoder.chunks import Chunk, GroupSpec, reason_kind, top_reasons, write_chunk
from shale.ingest.summary import IngestSummary
from shale.objstore import open_bucket

READ_MS = BASE_MS + 7 * 86_400_000


def _written(topic: str, count: int, bad: set[int]) -> object:
    config = BucketConfig(url=f"memory://quarantine-{uuid.uuid4().hex}")
    table = backup_table(topic, 0, 0, count)
    values = [b"not json" if i in bad else json.dumps({"ts": f"2026-11-25T07:36:05.{i:06d}Z"}).encode()
              for i in range(count)]
    table = table.set_column(table.schema.get_field_index("value"), "value", pa.array(values, pa.binary()))
    ingest = IngestConfig(topics=[topic], parsers=[ParserRule(parser="json", options={"time_field": "ts"})])
    return write_chunk(GroupSpec("partition", 1, config, ingest), open_bucket(config), table,
                       Chunk(topic, 0, "", 0, count, READ_MS))


def _gauge(topic: str) -> float | None:
    return REGISTRY.get_sample_value("shale_ingest_quarantining", {"group": "partition", "topic": topic})


def test_a_chunk_reports_its_quarantine_reasons_by_kind() -> None:
    written = _written("logs.half", 6, {0, 1, 2})
    assert (written.records, written.quarantined) == (6, 3)  # type: ignore[attr-defined]
    (reason, count), = written.reasons.items()  # type: ignore[attr-defined]
    assert count == 3
    assert reason.startswith("invalid JSON")


def test_a_wholly_quarantined_topic_warns_sets_the_gauge_and_is_marked_in_the_table(
        caplog: pytest.LogCaptureFixture) -> None:
    summary = IngestSummary("partition", warn_share=0.5)
    with caplog.at_level(logging.INFO, logger="shale.ingest.job"):
        summary.batch([_written("logs.bad", 4, {0, 1, 2, 3}), _written("logs.good", 4, set())])
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "all records of this topic went to quarantine" in warnings[0].getMessage()
    assert warnings[0].topic == "logs.bad"  # type: ignore[attr-defined]
    assert "4x invalid JSON" in warnings[0].reasons  # type: ignore[attr-defined]
    per_topic = {r.topic: (r.stored, r.quarantined) for r in caplog.records  # type: ignore[attr-defined]
                 if r.getMessage() == "topic batch"}
    assert per_topic == {"logs.bad": (0, 4), "logs.good": (4, 0)}
    assert _gauge("logs.bad") == 1.0
    assert _gauge("logs.good") == 0.0
    table = summary.table().splitlines()
    assert table[0].split() == ["topic", "stored", "quarantined", "top", "quarantine", "reasons"]
    assert table[1].split()[:5] == ["logs.bad", "0", "4", "<<", "WARNING"]
    assert "4x invalid JSON" in table[1]
    assert table[2].split() == ["logs.good", "4", "0", "-"]
    assert summary.wholly_quarantined() == ["logs.bad"]  # `ingest --available-now` exits 4 for it
    summary.batch([_written("logs.bad", 2, set())])  # a later batch stores some: no longer wholly
    assert summary.wholly_quarantined() == []


@pytest.mark.parametrize(("bad", "share", "warned"), [(2, 0.5, False), (3, 0.5, True), (1, 0.0, True),
                                                      (3, 1.0, False), (4, 1.0, True), (0, 0.0, False)])
def test_the_warning_share_is_configurable(bad: int, share: float, warned: bool,
                                           caplog: pytest.LogCaptureFixture) -> None:
    summary = IngestSummary("partition", warn_share=share)
    with caplog.at_level(logging.INFO, logger="shale.ingest.job"):
        summary.batch([_written(f"logs.share{bad}{share}", 4, set(range(bad)))])
    assert any(r.levelno == logging.WARNING for r in caplog.records) is warned


def test_reasons_of_one_kind_count_together_whatever_the_record_values() -> None:
    reasons = [f"time '2026-11-25T07:00:{i:02d}' does not match '%Y': unconverted data remains: {i}" for i in range(50)]
    reasons += ["no time field 'ts'"] * 3
    top = top_reasons((r, 1) for r in reasons)
    assert list(top.values()) == [50, 3]
    assert reason_kind(reasons[0]) == reason_kind(reasons[49])
    assert reason_kind("no time field 'ts'") != reason_kind(reasons[0])
