"""The status page shows committed offsets per topic incarnation, offsets without a record, acknowledged losses
and past incarnations; with Kafka unreachable it says so and shows what the metastore knows."""

from __future__ import annotations

import uuid
from pathlib import Path

from tests.unit.metastore.helpers import meta

from shale.block import KafkaRange
from shale.config import ShaleConfig
from shale.metastore import (
    AcknowledgeOffsetLoss,
    AcquireIngestLease,
    CommitIngestBatch,
    MetastoreService,
    OffsetRange,
    SingleNodeLog,
    StateMachine,
    read_only_index,
)
from shale.objstore import open_bucket_url
from shale.web.page import render
from shale.web.status import collect

A, B = "AAAAAAAAAAAAAAAAAAAAAA", "BBBBBBBBBBBBBBBBBBBBBB"


def _commit(service: MetastoreService, start: int, end: int, incarnation: str, stored: int) -> None:
    block = meta(start=start, end=end, key=f"{incarnation}{start}")
    block = block.model_copy(update={"kafka": [KafkaRange(topic="app", partition=0, start=start, end=end,
                                                          incarnation=incarnation)]})
    service.submit(CommitIngestBatch(group="backup", ranges=[OffsetRange(
        topic="app", partition=0, start=start, end=end, incarnation=incarnation, stored=stored)],
        blocks=[block])).raise_for_rejection()


def test_offsets_incarnations_and_losses_on_the_page(tmp_path: Path) -> None:
    state = StateMachine(tmp_path / "state.db")
    service = MetastoreService(state, SingleNodeLog(state))
    _commit(service, 0, 100, A, 90)
    service.submit(AcknowledgeOffsetLoss(group="backup", generation=1, topic="app", partition=0, incarnation=A,
                                         start=100, end=150, reason="retention")).raise_for_rejection()
    _commit(service, 0, 40, B, 40)  # the topic was recreated
    config = ShaleConfig.model_validate({"kafka": {"bootstrap_servers": "127.0.0.1:1"}})
    status = collect(read_only_index(tmp_path / "state.db"), service.status(),
                     open_bucket_url(f"memory://page-{uuid.uuid4().hex}"), config)
    assert status.kafka_error.startswith("Kafka not reachable")
    [row] = status.offsets
    assert (row["committed_end"], row["incarnation"], row["skipped"]) == (40, B, 0)
    assert [(x["start"], x["end"], x["reason"]) for x in status.losses] == [(100, 150, "retention")]
    assert [(i["incarnation"], i["committed_end"]) for i in status.incarnations] == [(A, 150)]
    page = render(status)
    assert "BBBBBBBB" in page
    assert "[100,150) (retention)" in page
    assert "AAAAAAAA ended at 150" in page


def test_every_ingest_shard_with_its_holder_on_the_page(tmp_path: Path) -> None:
    state = StateMachine(tmp_path / "state.db")
    service = MetastoreService(state, SingleNodeLog(state))
    service.submit(AcquireIngestLease(group="backup", holder="app-1/42/ab", shards=2,
                                      duration_ms=60_000)).raise_for_rejection()
    status = collect(read_only_index(tmp_path / "state.db"), service.status(),
                     open_bucket_url(f"memory://page-{uuid.uuid4().hex}"),
                     ShaleConfig.model_validate({"kafka": {"bootstrap_servers": "127.0.0.1:1"}}))
    assert [(x["shard"], x["shards"], x["holder"]) for x in status.leases] == [(0, 2, "app-1/42/ab"), (1, 2, "")]
    page = render(status)
    assert "app-1/42/ab" in page
    assert "none (last: -)" in page  # shard 1: nobody took it yet
