"""The dead letter queue across a metastore outage longer than the ingest lease: the queued commits of a driver
whose shard nobody took apply on replay; rejected commits are cleaned only once other blocks store their offsets;
queued and rejected commits that hold a partition's offsets are named before a loss is acknowledged."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from tests.unit.metastore.helpers import meta

from shale.config import RetentionConfig
from shale.metastore import (
    AcknowledgeOffsetLoss,
    AcquireIngestLease,
    CommitIngestBatch,
    DeadLetterQueue,
    MetastoreService,
    Noop,
    OffsetRange,
    SingleNodeLog,
    StateMachine,
)
from shale.metastore.api.dlq import REJECTED_KEEP_SECONDS, REJECTED_PREFIX
from shale.metastore.api.maintenance import Maintenance
from shale.objstore import ObstoreBucket, open_bucket_url

LEASE_MS = 15_000


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def bucket() -> ObstoreBucket:
    return open_bucket_url(f"memory://dlq-{uuid.uuid4().hex}")


def _service(tmp_path: Path, clock: Clock) -> MetastoreService:
    state = StateMachine(tmp_path / "state.db")
    return MetastoreService(state, SingleNodeLog(state, clock=clock))


def _commit(start: int, end: int, token: int | None = None) -> CommitIngestBatch:
    return CommitIngestBatch(group="backup", lease=token, blocks=[meta(start=start, end=end, key=f"k{start}")],
                             ranges=[OffsetRange(topic="app", partition=0, start=start, end=end)])


def test_case12_commits_dead_lettered_through_a_long_outage_apply_on_replay(tmp_path: Path,
                                                                            bucket: ObstoreBucket) -> None:
    """Four leases long: the queued commits carry the token of a lease that expired by the log's time, but nobody
    took the shard, so every one applies in order and none is set aside."""
    clock = Clock()
    service = _service(tmp_path, clock)
    token = service.submit(AcquireIngestLease(group="backup", holder="a", duration_ms=LEASE_MS)).data["token"]
    service.submit(_commit(0, 100, token)).raise_for_rejection()
    dlq = DeadLetterQueue(bucket)
    keys = [dlq.enqueue("ingest-backup-g1", _commit(i * 100, i * 100 + 100, token)) for i in range(1, 5)]
    clock.now += 60
    report = dlq.replay(service.submit_bytes)
    assert (report.replayed, report.rejected) == (keys, [])
    assert not list(bucket.list(REJECTED_PREFIX))
    assert service.offsets("backup")[0].committed_end == 500
    assert service.ingest_leases()[0]["holder"] == "a"  # renewed by the replayed commits


def test_case12_a_takeover_still_sets_the_old_holders_queued_commits_aside(tmp_path: Path,
                                                                           bucket: ObstoreBucket) -> None:
    clock = Clock()
    service = _service(tmp_path, clock)
    old = service.submit(AcquireIngestLease(group="backup", holder="a", duration_ms=LEASE_MS)).data["token"]
    dlq = DeadLetterQueue(bucket)
    key = dlq.enqueue("ingest-backup-g1", _commit(0, 100, old))
    for _ in range(60):  # the holder is cut off for a minute while the log runs
        clock.now += 1
        service.submit(Noop())
    assert service.submit(AcquireIngestLease(group="backup", holder="b", duration_ms=LEASE_MS)).data["granted"]
    report = dlq.replay(service.submit_bytes)
    assert report.rejected == [key]
    assert b"stale-lease" in bucket.get(REJECTED_PREFIX + key.split("/", 2)[2])


def _maintenance(service: MetastoreService, bucket: ObstoreBucket, clock: Clock) -> Maintenance:
    return Maintenance(service, bucket, RetentionConfig(default=0), 0.0, lambda: True, lambda: 1, clock=clock)


def test_case12_rejected_commits_are_cleaned_once_other_blocks_store_their_offsets(tmp_path: Path,
                                                                                   bucket: ObstoreBucket) -> None:
    """`_shale/dlq-rejected/` is no longer kept for ever: a rejected commit goes once it is older than the keep
    period and its offsets are committed by other blocks; until then (its blocks may be the only copy) it stays.
    Something that is not a commit goes after the keep period."""
    clock = Clock()
    service = _service(tmp_path, clock)
    service.submit(_commit(0, 100)).raise_for_rejection()
    dlq = DeadLetterQueue(bucket)
    key = dlq.enqueue("ingest-backup-g1", _commit(200, 300))  # a gap: rejected on replay
    assert dlq.replay(service.submit_bytes).rejected == [key]
    junk = REJECTED_PREFIX + "ingest-backup-g1/junk.json"
    bucket.put(junk, b"not a command\n{}")
    rejected = REJECTED_PREFIX + key.split("/", 2)[2]
    maintenance = _maintenance(service, bucket, clock)
    assert maintenance.clean_rejected() == []  # younger than the keep period
    clock.now += REJECTED_KEEP_SECONDS + 1
    assert maintenance.clean_rejected() == [junk]  # its offsets [200,300) are committed by nobody
    assert [i.key for i in bucket.list(REJECTED_PREFIX)] == [rejected]
    service.submit(_commit(100, 300)).raise_for_rejection()  # another writer stores them
    assert maintenance.clean_rejected() == [rejected]
    assert not list(bucket.list(REJECTED_PREFIX))


def test_case12_a_rejected_commit_over_acknowledged_lost_offsets_is_kept(tmp_path: Path,
                                                                         bucket: ObstoreBucket) -> None:
    """Offsets acknowledged as lost count as committed, but not as stored: the rejected commit holding them is
    their only copy and is never cleaned."""
    clock = Clock()
    service = _service(tmp_path, clock)
    service.submit(_commit(0, 100)).raise_for_rejection()
    dlq = DeadLetterQueue(bucket)
    key = dlq.enqueue("ingest-backup-g1", _commit(150, 200))
    assert dlq.replay(service.submit_bytes).rejected == [key]
    service.submit(AcknowledgeOffsetLoss(group="backup", generation=1, topic="app", partition=0, start=100,
                                         end=200)).raise_for_rejection()
    clock.now += REJECTED_KEEP_SECONDS + 1
    assert _maintenance(service, bucket, clock).clean_rejected() == []


def test_case12_the_commits_holding_a_partitions_offsets_are_named(bucket: ObstoreBucket) -> None:
    """What `shale offsets acknowledge-loss` refuses to discard: queued and rejected commits of the group and
    generation with offsets of the partition inside the range to be acknowledged, and no others."""
    dlq = DeadLetterQueue(bucket)
    queued = dlq.enqueue("ingest-backup-g1", _commit(100, 200))
    later = dlq.enqueue("ingest-backup-g1", _commit(300, 400))
    rejected = REJECTED_PREFIX + "ingest-backup-g1/old.json"
    bucket.put(rejected, _commit(200, 300).model_dump_json().encode() + b'\n{"ok": false, "reason": "stale-lease"}')
    assert dlq.holding("backup", 1, "app", 0, 100, 300) == [queued, rejected]
    assert dlq.holding("backup", 1, "app", 0, 400, 500) == []
    assert dlq.holding("backup", 1, "app", 1, 100, 300) == []
    assert dlq.holding("backup", 2, "app", 0, 100, 300) == []
    assert dlq.holding("partition", 1, "app", 0, 0, 1_000) == []
    assert later in dlq.holding("backup", 1, "app", 0, 0, 1_000)
