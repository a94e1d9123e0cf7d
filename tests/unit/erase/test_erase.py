"""``shale erase`` against a real embedded metastore and an in-memory bucket: the request, the scan, the erase jobs
run by the compaction worker's own task code (``ThreadRunner``), leases and fencing, and the blocks read back
straight from the bucket."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import uuid
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from tests.factories import BASE_MS, Clock
from tests.unit.compactor.test_worker import ThreadRunner

from shale.block import (
    BlockMeta,
    BlockSpec,
    DatasetInput,
    KafkaRange,
    deterministic_block_id,
    read_dataset,
    write_block,
)
from shale.block.schemas import BACKUP_SCHEMA, QUARANTINE_SCHEMA, partition_schema
from shale.compaction.messages import JobUpdate, PollRequest
from shale.compactor.erase import erase_block
from shale.compactor.worker import CompactionWorker
from shale.config import BucketConfig, CompactionConfig, RetentionConfig
from shale.erase import ErasureRequest, ReceiptNotReadyError, erase, erasure_status, write_receipt
from shale.erase.receipt import final_scan
from shale.metastore import AddBlocks, MetastoreService, SingleNodeLog, StateMachine
from shale.metastore.api.maintenance import Maintenance
from shale.metastore.rules.erasures import erasure_of
from shale.objstore import Bucket, open_bucket

ERASED = b"customer-42"


def _key(topic: str, offset: int) -> bytes:
    return ERASED if offset % 7 == 3 else f"customer-{offset % 5}".encode()


def _rows(topic: str, partition: int, start: int, count: int) -> dict[str, pa.Array]:
    offsets = list(range(start, start + count))
    return {
        "topic": pa.array([topic] * count),
        "partition": pa.array([partition] * count, pa.int32()),
        "offset": pa.array(offsets, pa.int64()),
        "timestamp": pa.array([BASE_MS + o * 1000 for o in offsets], pa.timestamp("ms", tz="UTC")),
        "timestamp_type": pa.array([0] * count, pa.int8()),
        "key": pa.array([_key(topic, o) for o in offsets], pa.binary()),
        "value": pa.array([f'{{"n": {o}}}'.encode() for o in offsets], pa.binary()),
        "headers": pa.array([[]] * count, BACKUP_SCHEMA.field("headers").type),
    }


def _block(bucket: Bucket, group: str, topic: str, partition: int, start: int, count: int,
           generation: int = 1) -> BlockMeta:
    """A level-0 block of one group; a partition-group block holds its records' every third one quarantined."""
    block_id = deterministic_block_id(BASE_MS + start * 1000, f"{group}/{generation}/{topic}/{partition}/{start}")
    spec = BlockSpec(id=block_id, tenant="acme", group=group, generation=generation,
                     kafka=[KafkaRange(topic=topic, partition=partition, start=start, end=start + count)])
    return write_level0(bucket, spec, topic, pa.table(_rows(topic, partition, start, count), schema=BACKUP_SCHEMA))


def write_level0(bucket: Bucket, spec: BlockSpec, topic: str, table: pa.Table) -> BlockMeta:
    """``spec``'s block of the backup group's ``table`` as it is, or of the partition group: each record's ``n``
    parsed, every third offset quarantined."""
    if spec.group == "backup":
        return write_block(bucket, spec, [DatasetInput("records", topic, table, "timestamp",
                                                       labels=[{"topic": topic}])])
    bad = pa.array([o % 3 == 0 for o in table.column("offset").to_pylist()])
    good = table.filter(pa.compute.invert(bad))
    parsed = good.append_column("event_time", good.column("timestamp").cast(pa.timestamp("us", tz="UTC")))
    parsed = parsed.append_column("dt", pa.array(["2026-11-18"] * good.num_rows))
    parsed = parsed.append_column("hour", pa.array([None] * good.num_rows, pa.int8()))
    parsed = parsed.append_column("n", pa.array([str(o) for o in good.column("offset").to_pylist()]))
    quarantined = table.filter(bad)
    quarantined = quarantined.append_column("reason", pa.array(["test"] * quarantined.num_rows))
    quarantined = quarantined.append_column("parser", pa.array(["json"] * quarantined.num_rows))
    spec.partition_values = {"dt": "2026-11-18"}
    return write_block(bucket, spec, [
        DatasetInput("records", topic, parsed.cast(partition_schema(["n"])), "event_time", labels=[{"topic": topic}]),
        DatasetInput("quarantine", topic, quarantined.cast(QUARANTINE_SCHEMA), "timestamp",
                     labels=[{"topic": topic}])])


@pytest.fixture
def bucket() -> BucketConfig:
    return BucketConfig(url=f"memory://erase-{uuid.uuid4().hex}")


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def service(tmp_path: Path, bucket: BucketConfig, clock: Clock) -> MetastoreService:
    return make_service(tmp_path, bucket, clock)


def make_service(tmp_path: Path, bucket: BucketConfig, clock: Clock) -> MetastoreService:
    """Topic app, partitions 0 and 1, both groups, 4 blocks of 10 records each per partition and group; topic other
    holds the same key. Partition 0's backup blocks are compacted three at a time (one compacted block, one not)."""
    state = StateMachine(tmp_path / "s.db")
    service = MetastoreService(state, SingleNodeLog(state, clock=clock), clock=clock,
                               compaction=CompactionConfig(blocks_per_job=[3]))
    store = open_bucket(bucket)
    service.submit(AddBlocks(blocks=[_block(store, "backup", "app", 0, i * 10, 10) for i in range(4)]))
    worker = _worker(service, bucket)
    worker.run(until_idle=True)
    assert {m.level for m in service.tenant_blocks("acme")} == {0, 1}
    blocks = [_block(store, group, topic, p, i * 10, 10) for group in ("backup", "partition")
              for topic, p in (("app", 1), ("other", 0)) for i in range(4) if (group, topic, p) != ("backup", "app", 0)]
    blocks += [_block(store, "partition", "app", 0, i * 10, 10) for i in range(4)]
    service.submit(AddBlocks(blocks=blocks))
    return service


def _worker(service: MetastoreService, bucket: BucketConfig) -> CompactionWorker:
    return CompactionWorker(service, bucket, None, slots=64, poll_interval=0.01, runner=ThreadRunner(bucket))


def _stored(service: MetastoreService, bucket: BucketConfig) -> dict[tuple[str, str], Counter[tuple[str, int, int]]]:
    """Per (group, topic), each record's copies among the indexed blocks, read with pyarrow from the bucket; and
    no row with the erased key (checked while reading)."""
    store = open_bucket(bucket)
    out: dict[tuple[str, str], Counter[tuple[str, int, int]]] = {}
    keys: Counter[tuple[str, bytes]] = Counter()
    for meta in service.tenant_blocks("acme"):
        for d in meta.datasets:
            t = read_dataset(store, meta, d)
            rows = zip(t.column("topic").to_pylist(), t.column("partition").to_pylist(), t.column("offset").to_pylist(),
                       t.column("key").to_pylist(), strict=True)
            for topic, partition, offset, key in rows:
                out.setdefault((meta.group, topic), Counter())[(topic, partition, offset)] += 1
                keys[(topic, key)] += 1
    out[("keys", "")] = Counter({f"{t}/{k.decode()}": n for (t, k), n in keys.items()})  # type: ignore[misc]
    return out


def _expected(topic: str, erased: bool) -> Counter[tuple[str, int, int]]:
    return Counter({(topic, p, o): 1 for p in (0, 1) if (topic, p) != ("other", 1) for o in range(40)
                    if not (erased and _key(topic, o) == ERASED)})


def test_a_dry_run_lists_records_and_blocks_and_changes_nothing(service: MetastoreService,
                                                              bucket: BucketConfig) -> None:
    before = service.state.state_hash()
    report = erase(service, bucket, ErasureRequest("acme", ERASED, topics=["app"]), dry_run=True)
    assert service.state.state_hash() == before
    assert report.dry_run
    assert report.matches == 2 * sum(1 for o in range(40) if _key("app", o) == ERASED)
    assert {(r["topic"], r["partition"]) for r in report.records} == {("app", 0), ("app", 1)}
    groups = Counter(b["group"] for b in report.blocks)
    # partition 0's backup: one compacted block and one level-0 block; every other block is level 0
    assert groups["backup"] == 6
    assert groups["partition"] == 8
    assert report.blocks_opened == 6  # the backup blocks only, of app's 14
    assert report.blocks_total == 14


def test_an_erasure_rewrites_every_block_holding_the_key_and_nothing_else(service: MetastoreService,
                                                                       bucket: BucketConfig) -> None:
    request = ErasureRequest("acme", ERASED, topics=["app"])
    report = erase(service, bucket, request, dry_run=False, by="tester")
    assert report.state == "rewriting"
    assert len(report.jobs) == 14
    again = erase(service, bucket, request, dry_run=True)  # made again now, it would be a new erasure
    assert (again.previous, again.matches) == (report.id, report.matches)  # its records: not rewritten yet
    assert again.id != report.id
    _worker(service, bucket).run(until_idle=True)
    status = erasure_status(service, report.id)
    assert status.state == "rewritten"
    assert status.jobs == []
    assert len(status.blocks) == 14
    assert sum(b["rows_removed"] for b in status.blocks) == 2 * report.matches  # each record: backup and partition
    stored = _stored(service, bucket)
    assert stored[("backup", "app")] == _expected("app", erased=True)
    assert stored[("partition", "app")] == _expected("app", erased=True)
    assert stored[("backup", "other")] == _expected("other", erased=False)  # another topic: not named
    assert stored[("keys", "")]["app/customer-42"] == 0  # type: ignore[index]
    assert stored[("keys", "")]["other/customer-42"] > 0  # type: ignore[index]
    # The rewritten blocks still account for every offset: erased, not missing.
    covered = sorted(o for m in service.tenant_blocks("acme") if m.group == "backup" for r in m.kafka
                     if r.topic == "app" for o in range(r.start, r.end))
    assert covered == sorted(list(range(40)) * 2)
    # Rewritten blocks say so, and so do the merges of them with blocks of topic other (compacted meanwhile):
    # none of their other sources held an erased record.
    assert all(report.id in (m.erased or ()) for m in service.tenant_blocks("acme")
               if any(r.topic == "app" for r in m.kafka))


def test_a_dry_runs_rows_per_group_are_what_the_rewrites_remove(service: MetastoreService,
                                                              bucket: BucketConfig) -> None:
    """The backup group holds partition 1's first ten records twice (a second generation): its rows differ from
    the positions and from the partition group's, and the dry run says each group's, as the rewrites count them."""
    service.submit(AddBlocks(blocks=[_block(open_bucket(bucket), "backup", "app", 1, 0, 10, generation=2)]))
    request = ErasureRequest("acme", ERASED, topics=["app"])
    dry = erase(service, bucket, request, dry_run=True)
    again = sum(1 for o in range(10) if _key("app", o) == ERASED)
    assert again > 0
    assert dry.rows_to_remove == {"backup": dry.matches + again, "partition": dry.matches}
    assert "requested_at_iso" in dry.to_dict()  # "" until requested
    assert all(r["timestamp_iso"] == _iso(r["timestamp_ms"]) for r in dry.records)
    report = erase(service, bucket, request, dry_run=False, by="tester")
    assert report.rows_to_remove == dry.rows_to_remove
    assert report.to_dict()["requested_at_iso"] == _iso(report.requested_at)
    _worker(service, bucket).run(until_idle=True)
    status = erasure_status(service, report.id)
    assert status.state == "rewritten"
    assert status.rows_removed == dry.rows_to_remove


def _iso(ms: int) -> str:
    """ISO 8601 UTC to the millisecond, as a person reads it (checked against the standard library's parser)."""
    when = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(milliseconds=ms)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def test_a_stale_workers_rewrite_is_refused_and_the_new_owner_finishes(service: MetastoreService,
                                                                       bucket: BucketConfig, clock: Clock) -> None:
    report = erase(service, bucket, ErasureRequest("acme", ERASED), dry_run=False)
    taken = service.poll_compaction(PollRequest(worker="killed", capacity=64)).assigned
    erasing = [a for a in taken if a.erase is not None]
    assert erasing
    assert all(erasure_of(a.job) == report.id for a in erasing)
    first = erasing[0]
    stale = erase_block(open_bucket(bucket), first.sources[0], first.erase, job=first.job,  # type: ignore[arg-type]
                        token=first.token)
    clock.advance(16)  # the killed worker's leases expire; another worker takes its jobs over
    _worker(service, bucket).run(until_idle=True)
    assert erasure_status(service, report.id).state == "rewritten"
    late = service.poll_compaction(PollRequest(worker="killed", capacity=0, updates=[
        JobUpdate(job=first.job, token=first.token, status="success", outputs=[stale.output])]))
    assert late.updates[first.job] in ("lost", "unknown-job")
    assert service.get_block(stale.output.id) is None
    assert _stored(service, bucket)[("keys", "")]["other/customer-42"] == 0  # type: ignore[index]


def test_a_block_added_later_that_holds_an_erased_record_is_rewritten(service: MetastoreService,
                                                                      bucket: BucketConfig) -> None:
    report = erase(service, bucket, ErasureRequest("acme", ERASED, topics=["app"]), dry_run=False)
    _worker(service, bucket).run(until_idle=True)
    # A new generation read from Kafka again (which still holds the records until its retention passes).
    regenerated = _block(open_bucket(bucket), "partition", "app", 1, 0, 10, generation=2)
    service.submit(AddBlocks(blocks=[regenerated]))
    assert erasure_status(service, report.id).jobs == [f"erasure:{report.id}/{regenerated.id}"]
    _worker(service, bucket).run(until_idle=True)
    assert erasure_status(service, report.id).state == "rewritten"
    assert _stored(service, bucket)[("keys", "")]["app/customer-42"] == 0  # type: ignore[index]


def test_the_receipt_waits_for_the_deletes_then_scans_and_is_written_once(service: MetastoreService,
                                                                          bucket: BucketConfig,
                                                                          clock: Clock) -> None:
    report = erase(service, bucket, ErasureRequest("acme", ERASED, topics=["app"]), dry_run=False, by="tester")
    store = open_bucket(bucket)
    with pytest.raises(ReceiptNotReadyError, match="erase jobs left"):
        write_receipt(service, store, report.id)
    _worker(service, bucket).run(until_idle=True)
    with pytest.raises(ReceiptNotReadyError, match="still have objects in the bucket"):
        write_receipt(service, store, report.id)
    clock.advance(1)
    Maintenance(service, store, RetentionConfig(), delete_delay=0, is_leader=lambda: True, term=lambda: 1,
                clock=clock, sync_delay=0).collect_tombstones()
    receipt = write_receipt(service, store, report.id)
    assert receipt["records"] == report.matches
    assert receipt["key_sha256"] == hashlib.sha256(ERASED).hexdigest()
    assert "customer-42" not in json.dumps(receipt)  # the key itself is nowhere in the receipt
    assert receipt["final_scan"]["matches"] == 0
    assert receipt["final_scan"]["blocks"] >= 1
    assert {d["gone"] for d in receipt["objects_deleted"]} == {True}
    assert len(receipt["objects_deleted"]) == len(receipt["blocks_rewritten"]) == 14
    assert sum(b["records_removed"] for b in receipt["blocks_rewritten"]) == 2 * report.matches
    assert receipt["records_removed_by_group"] == {"backup": report.matches, "partition": report.matches}
    assert receipt["requested_at_iso"] == _iso(receipt["requested_at_ms"])  # beside the epoch milliseconds
    assert receipt["rewritten_at_iso"] == _iso(receipt["rewritten_at_ms"])
    assert receipt["not_reachable"]["kafka"][0]["topic"] == "app"
    assert erasure_status(service, report.id).state == "done"
    assert write_receipt(service, store, report.id) == receipt  # written once; asked again, the same object


def test_the_final_scan_finds_a_record_left_behind(service: MetastoreService, bucket: BucketConfig) -> None:
    """The scan reads the blocks, not the metastore's word: a block holding the key that the erasure never saw
    (here: one added to the index without passing through the metastore's cover rule) is a match."""
    report = erase(service, bucket, ErasureRequest("acme", ERASED, topics=["app"]), dry_run=False)
    _worker(service, bucket).run(until_idle=True)
    left = _block(open_bucket(bucket), "backup", "app", 7, 0, 10)
    scan = final_scan(open_bucket(bucket), [*service.tenant_blocks("acme"), left], ["app"],
                      hashlib.sha256(ERASED).hexdigest(), [])
    assert {m["block"] for m in scan.matches} == {left.id}
    assert erasure_status(service, report.id).state == "rewritten"


def test_a_key_no_block_holds_opens_no_block(service: MetastoreService, bucket: BucketConfig) -> None:
    """The backup blocks' key bloom filters rule the key out: no data object is read."""
    report = erase(service, bucket, ErasureRequest("acme", b"nobody-at-all"), dry_run=True)
    assert report.blocks_opened == 0
    assert report.matches == 0
    assert report.blocks_total == len(service.tenant_blocks("acme"))


def test_an_erasure_that_asked_for_a_shorter_delay_has_its_objects_deleted_then(service: MetastoreService,
                                                                               bucket: BucketConfig,
                                                                               clock: Clock) -> None:
    """The replaced blocks of an erasure that asked for 1 h go 1 h after their rewrite, and so do the fixture's
    merge sources tombstoned before the request that still hold the key (before: block.delete_delay, 2 h, and the
    receipt waited for them); the others (sources written without the key) wait for block.delete_delay; a request
    below the leader's floor gets the floor."""
    hour = 3600.0
    store = open_bucket(bucket)
    report = erase(service, bucket, ErasureRequest("acme", ERASED, topics=["app"], delete_delay=hour),
                   dry_run=False)
    low = erase(service, bucket, ErasureRequest("acme", ERASED, topics=["other"], delete_delay=60), dry_run=False)
    assert erasure_status(service, report.id).delete_delay == hour
    _worker(service, bucket).run(until_idle=True)
    leader = Maintenance(service, store, RetentionConfig(), delete_delay=2 * hour, is_leader=lambda: True,
                         term=lambda: 1, clock=clock, sync_delay=900, erasure_delay_floor=hour)

    def left() -> dict[str, int]:
        out: Counter[str] = Counter()
        for row in service.tombstones(limit=10_000):
            out["erased" if row.reason.startswith("erased by") else "other"] += 1
        return dict(out)

    before = left()
    assert before["erased"] == 14 + len(erasure_status(service, low.id).blocks)
    assert before["other"] > 0  # the fixture's compaction, and the merges of rewritten blocks
    clock.advance(hour - 60)  # (the clock moves from the real time, which the test's own work advances)
    assert leader.collect_tombstones() == 0
    clock.advance(120)  # past the hour, after both rewrites: every erased block's objects go, the 60 s one too,
    # and the fixture's three merge sources (partition 0's first backup blocks, holding the key of app)
    assert leader.collect_tombstones() == before["erased"] + 3
    assert left() == {"other": before["other"] - 3}
    assert write_receipt(service, store, low.id)["delete_delay_ms"] == 60_000  # asked; the floor applied
    assert write_receipt(service, store, report.id)["delete_delay_ms"] == hour * 1000  # nothing left to wait for
    clock.advance(hour - 120)
    assert leader.collect_tombstones() == 0  # the others wait for block.delete_delay
    clock.advance(120)
    assert leader.collect_tombstones() == before["other"] - 3


def test_a_delete_delay_outside_the_bounds_is_refused_with_them() -> None:
    from shale.config import ShaleConfig
    from shale.erase import check_delete_delay

    config = ShaleConfig()
    assert config.erasure_delay_floor == 3600
    assert check_delete_delay(config, 3600) == 3600
    for wrong in (60, 3599, config.block.delete_delay + 1):
        with pytest.raises(ValueError, match="max_stale_period") as refused:
            check_delete_delay(config, wrong)
        assert f"{wrong:g} s" in str(refused.value)
