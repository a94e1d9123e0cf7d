"""An erasure in Shale's Iceberg tables (DESIGN 19.6), on an embedded metastore, a folder bucket and a SQLite
catalog, with the erase jobs run by the compaction worker's own task code: the table gets one snapshot for the
whole erasure (held back while its blocks are rewritten), every older snapshot naming a file that holds an erased
record is expired (a crash between the two commits included), the table reads every other record once, and the
receipt lists the snapshots expired and scans every file the retained snapshots name."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from tests.iceberg_helpers import publisher_setup
from tests.unit.compactor.test_worker import ThreadRunner
from tests.unit.erase.test_erase import ERASED, _block, _key
from tests.waiting import eventually

from shale.compactor.worker import CompactionWorker
from shale.config import CompactionConfig, RetentionConfig
from shale.erase import ErasureRequest, erase, erasure_status, write_receipt
from shale.iceberg import IcebergPublisher
from shale.iceberg.catalog import SUMMARY_ERASURES, SUMMARY_EXPIRES, identifier, open_catalog
from shale.iceberg.erasure import receipt_check, snapshot_files
from shale.iceberg.files import key_of
from shale.metastore import AddBlocks, MetastoreService, SingleNodeLog, StateMachine
from shale.metastore.api.maintenance import Maintenance

TENANT, TOPIC = "acme", "app"


def _setup(tmp_path: Path) -> tuple[Any, MetastoreService, IcebergPublisher, Any]:
    config, _, _, bucket = publisher_setup(tmp_path)
    state = StateMachine(tmp_path / "ms" / "erase.db")
    service = MetastoreService(state, SingleNodeLog(state), compaction=CompactionConfig(blocks_per_job=[3]))
    return config, service, IcebergPublisher(config, state.reader, service.submit, bucket), bucket


def _worker(service: MetastoreService, config: Any, slots: int) -> CompactionWorker:
    return CompactionWorker(service, config.bucket, None, slots=slots, poll_interval=0.01,
                            runner=ThreadRunner(config.bucket))


def _summary(snapshot: Any, key: str) -> Any:
    return json.loads(snapshot.summary.additional_properties.get(key, "null"))


def _retained_files(table: Any) -> set[str]:
    cache: dict[str, list[str]] = {}
    return {u for s in table.metadata.snapshots for u in snapshot_files(table, s, cache)}


def _keys_in(config: Any, bucket: Any, uris: set[str]) -> Counter[bytes]:
    keys: Counter[bytes] = Counter()
    for uri in uris:
        keys.update(pq.read_table(io.BytesIO(bucket.get(key_of(config.bucket, uri))), columns=["key"])
                    .column("key").to_pylist())
    return keys


def _bounds(table: Any) -> list[bytes]:
    """Every lower and upper bound in the manifests of the table's snapshots, DELETED entries included."""
    out: list[bytes] = []
    for snapshot in table.snapshots():
        for manifest in snapshot.manifests(table.io):
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
                for bounds in (entry.data_file.lower_bounds, entry.data_file.upper_bounds):
                    out += list((bounds or {}).values())
    return out


def test_an_erasure_is_one_snapshot_per_table_and_the_snapshots_naming_its_records_are_expired(
        tmp_path: Path) -> None:
    config, service, publisher, bucket = _setup(tmp_path)
    for group in ("backup", "partition"):  # one entry per block: a snapshot each
        for p in (0, 1):
            for i in range(4):
                service.submit(AddBlocks(blocks=[_block(bucket, group, TOPIC, p, i * 10, 10)]))
    assert publisher.run_once() == 8
    _worker(service, config, 4).run(until_idle=True)  # merges: older snapshots name level-0 blocks merged away
    assert publisher.run_once() >= 1
    catalog = open_catalog(config)
    name = identifier(TENANT, TOPIC)
    before = catalog.load_table(name)
    assert _keys_in(config, bucket, _retained_files(before))[ERASED] > 0

    report = erase(service, config.bucket, ErasureRequest(TENANT, ERASED, [TOPIC]), dry_run=False)
    jobs = len(report.jobs)
    worker = _worker(service, config, 1)
    assert jobs >= 3  # partition-group blocks of both partitions, and backup blocks

    def one_more_done() -> bool:
        worker.step()
        return len(erasure_status(service, report.id).jobs) < jobs

    eventually(one_more_done, 30, "an erase job to complete")
    assert erasure_status(service, report.id).state == "rewriting"
    snapshots = len(catalog.load_table(name).snapshots())
    assert publisher.run_once() == 0  # held back while the erasure's blocks are rewritten
    assert len(catalog.load_table(name).snapshots()) == snapshots

    worker.run(until_idle=True)
    assert erasure_status(service, report.id).state == "rewritten"
    assert publisher.run_once() == 1  # the whole erasure: one snapshot of the table
    table = catalog.load_table(name)
    (mine,) = [s for s in table.snapshots() if _summary(s, SUMMARY_ERASURES) == [report.id]]
    expired = _summary(mine, SUMMARY_EXPIRES)
    assert expired
    assert not set(expired) & {s.snapshot_id for s in table.snapshots()}
    assert _keys_in(config, bucket, _retained_files(table))[ERASED] == 0  # no retained snapshot names one
    # Nor does any manifest keep it as a column bound: the erasure snapshot's DELETED entries carried the removed
    # files' bounds, and "customer-42" was the key column's upper bound (manifests keep no content bounds now).
    assert _bounds(table)  # the columns engines prune by keep theirs
    assert not [b for b in _bounds(table) if ERASED in b or b"customer" in b]
    read = table.scan().to_arrow()
    assert ERASED not in read.column("key").to_pylist()
    positions = Counter(zip(read.column("partition").to_pylist(), read.column("offset").to_pylist(), strict=True))
    assert positions == Counter({(p, o): 1 for p in (0, 1) for o in range(40)
                                 if o % 3 and _key(TOPIC, o) != ERASED})  # every other record once
    assert publisher.sync()["snapshots"] == 0  # nothing published twice

    leader = Maintenance(service, bucket, RetentionConfig(), delete_delay=0, is_leader=lambda: True, term=lambda: 1,
                         sync_delay=0)
    leader.collect_tombstones()
    receipt = write_receipt(service, bucket, report.id, iceberg=receipt_check(config, bucket))
    (evidence,) = receipt["iceberg"]["tables"]
    assert evidence["erasure_snapshots"] == [mine.snapshot_id]
    assert [e["snapshot"] for e in evidence["snapshots_expired"]] == sorted(expired)
    assert all(e["gone"] for e in evidence["snapshots_expired"])
    assert receipt["final_scan"]["iceberg_files"] >= 2
    assert receipt["final_scan"]["matches"] == 0


def test_a_crash_between_the_erasure_snapshot_and_the_expiry_expires_them_at_the_next_round(
        tmp_path: Path, monkeypatch: Any) -> None:
    config, service, publisher, bucket = _setup(tmp_path)
    worker = _worker(service, config, 4)
    for group in ("backup", "partition"):
        service.submit(AddBlocks(blocks=[_block(bucket, group, TOPIC, 0, i * 10, 10) for i in range(2)]))
    publisher.run_once()
    report = erase(service, config.bucket, ErasureRequest(TENANT, ERASED, [TOPIC]), dry_run=False)
    worker.run(until_idle=True)
    import shale.iceberg.publisher as module

    def crash(table: Any) -> list[int]:
        raise RuntimeError("killed before the expiry")

    monkeypatch.setattr(module, "expire_listed", crash)
    with contextlib.suppress(RuntimeError):
        publisher.run_once()
    table = open_catalog(config).load_table(identifier(TENANT, TOPIC))
    (mine,) = [s for s in table.snapshots() if _summary(s, SUMMARY_ERASURES) == [report.id]]
    doomed = set(_summary(mine, SUMMARY_EXPIRES))
    assert doomed <= {s.snapshot_id for s in table.snapshots()}  # committed, not expired yet
    monkeypatch.undo()
    restarted = IcebergPublisher(config, service.state.reader, service.submit, bucket)
    assert restarted.run_once() == 0  # no snapshot again
    table = open_catalog(config).load_table(identifier(TENANT, TOPIC))
    assert not doomed & {s.snapshot_id for s in table.snapshots()}
    assert _keys_in(config, bucket, _retained_files(table))[ERASED] == 0


def test_a_hold_that_runs_out_publishes_what_is_rewritten_and_the_rest_later(tmp_path: Path) -> None:
    config, service, _, bucket = _setup(tmp_path)
    now = [time.time()]
    publisher = IcebergPublisher(config, service.state.reader, service.submit, bucket, clock=lambda: now[0])
    for p in (0, 1):
        for group in ("backup", "partition"):
            service.submit(AddBlocks(blocks=[_block(bucket, group, TOPIC, p, i * 10, 10) for i in range(2)]))
    publisher.run_once()
    report = erase(service, config.bucket, ErasureRequest(TENANT, ERASED, [TOPIC]), dry_run=False)
    jobs = len(report.jobs)
    worker = _worker(service, config, 1)

    def one_more_done() -> bool:
        worker.step()
        return len(erasure_status(service, report.id).jobs) < jobs

    eventually(one_more_done, 30, "an erase job to complete")
    assert publisher.run_once() == 0  # held
    held = publisher.published_through
    now[0] += config.iceberg.erasure_hold + 1
    publisher.run_once()  # the hold ran out: what is rewritten so far is published
    assert publisher.published_through > held
    worker.run(until_idle=True)
    assert publisher.run_once() == 1  # the rest; the snapshot before it named blocks not yet rewritten: expired
    table = open_catalog(config).load_table(identifier(TENANT, TOPIC))
    assert len([s for s in table.snapshots() if _summary(s, SUMMARY_ERASURES) == [report.id]]) == 1
    assert _keys_in(config, bucket, _retained_files(table))[ERASED] == 0
    read = table.scan().to_arrow()
    positions = Counter(zip(read.column("partition").to_pylist(), read.column("offset").to_pylist(), strict=True))
    assert positions == Counter({(p, o): 1 for p in (0, 1) for o in range(20) if o % 3 and _key(TOPIC, o) != ERASED})


def test_copies_an_erasure_released_go_after_its_shorter_delay_and_the_others_after_the_delete_delay(
        tmp_path: Path) -> None:
    """The publisher's sweep: copies released by an erasure's snapshot that asked for 600 s go once it is past
    600 s (never before the floor, here 300 s); those a plain snapshot released wait for block.delete_delay."""
    from types import SimpleNamespace

    from shale.config import ShaleConfig
    from shale.errors import NotFoundError
    from shale.iceberg.catalog import SUMMARY_DELETE_DELAY, SUMMARY_RELEASED
    from shale.iceberg.files import copy_key
    from shale.iceberg.plan import TableKey
    from shale.iceberg.publisher import _Table
    from shale.objstore import open_bucket

    config = ShaleConfig.model_validate({
        "bucket": {"url": f"file://{tmp_path}/bucket"}, "iceberg": {"enabled": True},
        "block": {"delete_delay": 7200, "sync_delay": 300}, "bucket_index": {"max_stale_period": 300}})
    bucket = open_bucket(config.bucket)
    now = [1_000_000.0]
    keys = {name: copy_key(TENANT, name) for name in ("plain", "erased", "too-soon")}
    for key in keys.values():
        bucket.put(key, b"rows")

    def snapshot(sid: int, released: str, delay_ms: int | None) -> Any:
        props = {SUMMARY_RELEASED: json.dumps([keys[released]])}
        if delay_ms is not None:
            props[SUMMARY_DELETE_DELAY] = str(delay_ms)
        return SimpleNamespace(snapshot_id=sid, timestamp_ms=int(now[0] * 1000),
                               summary=SimpleNamespace(additional_properties=props))

    snapshots = [snapshot(1, "plain", None), snapshot(2, "erased", 600_000), snapshot(3, "too-soon", 1_000)]
    publisher = IcebergPublisher(config, None, lambda c: None, bucket, clock=lambda: now[0])  # type: ignore[arg-type]
    publisher._tables = {TableKey(TENANT, TOPIC): _Table(SimpleNamespace(metadata=SimpleNamespace(
        snapshots=snapshots)), 0)}

    def left() -> set[str]:
        found = set()
        for name, key in keys.items():
            with contextlib.suppress(NotFoundError):
                bucket.get(key)
                found.add(name)
        return found

    now[0] += 299
    publisher._sweep()
    assert left() == {"plain", "erased", "too-soon"}
    now[0] += 2  # past the floor: the erasure that asked for 1 s gets the floor
    publisher._sweep()
    assert left() == {"plain", "erased"}
    now[0] += 300
    publisher._sweep()
    assert left() == {"plain"}
    now[0] += 7200 - 602
    publisher._sweep()
    assert left() == {"plain"}
    now[0] += 2
    publisher._sweep()
    assert left() == set()


def test_the_receipts_table_scan_leaves_the_keys_records_produced_after_the_request() -> None:
    """A data file holding the key at offsets 3, 10 and 17 of incarnation A, the request's watermark at 10 of A:
    offset 3 is the erasure's, 10 and 17 were produced after it (new data, not erased). Before, the receipt's
    check matched the key's hash at every offset and the receipt could never be written while the table held
    them. A row whose incarnation nothing tells is bounded like the watermark's (without the block's meta)."""
    from shale.block import KafkaRange
    from shale.config import BucketConfig
    from shale.iceberg.erasure import _matches
    from shale.metastore import ErasureWatermark, Watermarks
    from shale.objstore import open_bucket

    offsets = list(range(20))
    table = pa.table({"topic": [TOPIC] * 20, "partition": pa.array([0] * 20, pa.int32()),
                      "offset": pa.array(offsets, pa.int64()),
                      "key": pa.array([_key(TOPIC, o) for o in offsets], pa.binary())})
    sink = io.BytesIO()
    pq.write_table(table, sink)
    written = _block(open_bucket(BucketConfig(url="memory://iceberg-marks")), "partition", TOPIC, 0, 0, 20)
    meta = written.model_copy(update={"kafka": [KafkaRange(topic=TOPIC, partition=0, start=0, end=20,
                                                           incarnation="A" * 22)]})
    marks = Watermarks([ErasureWatermark(topic=TOPIC, partition=0, end=10, incarnation="A" * 22)])
    sha = hashlib.sha256(ERASED).hexdigest()
    assert _matches(sink.getvalue(), TOPIC, meta, [], sha, marks) == [3]
    assert _matches(sink.getvalue(), TOPIC, None, [], sha, marks) == [3]
    assert _matches(sink.getvalue(), TOPIC, meta, [], sha, Watermarks([])) == [3, 10, 17]  # no watermark: all
    other = Watermarks([ErasureWatermark(topic=TOPIC, partition=0, end=5, incarnation="B" * 22)])
    assert _matches(sink.getvalue(), TOPIC, meta, [], sha, other) == [3, 10, 17]  # an older incarnation: all
