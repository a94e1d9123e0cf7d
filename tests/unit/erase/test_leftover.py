"""The leftover scan and what the receipt does with it: every object under the tenant's prefixes is read for the
erasure's records, whatever the index says. Tombstoned sources and orphans make the receipt wait, restore dead
letters are deleted and quarantined blocks' objects rewritten by the erasure itself, an unreadable object refuses
the receipt; against a real embedded metastore and an in-memory bucket (the fixture of ``test_erase``)."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.factories import Clock
from tests.unit.erase.test_erase import ERASED, _block, _key, _worker, make_service

from shale.block import (
    block_file_key,
    meta_key,
    restore_dead_letter_key,
    write_deletion_mark,
    write_quarantine_mark,
)
from shale.config import BucketConfig, RetentionConfig
from shale.erase import ErasureRequest, Needle, ReceiptNotReadyError, erase, scan_leftovers, write_receipt
from shale.erase.leftover import Metered, scan_prefixes
from shale.errors import ShaleError
from shale.metastore import MetastoreService, Watermarks
from shale.metastore.api.maintenance import Maintenance
from shale.objstore import Bucket, open_bucket
from shale.restore import dead_lettered
from shale.restore.task import PartitionWork, _dead_letter

HOUR = 3600.0


@pytest.fixture
def bucket() -> BucketConfig:
    return BucketConfig(url=f"memory://leftover-{uuid.uuid4().hex}")


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def service(tmp_path: Path, bucket: BucketConfig, clock: Clock) -> MetastoreService:
    return make_service(tmp_path, bucket, clock)


def _erased(service: MetastoreService, bucket: BucketConfig, clock: Clock, delay: float = 0.0) -> str:
    """An erasure of the key from topic app, rewritten, its replaced blocks' objects deleted (and, with no
    ``delay`` asked, every other tombstoned block's too): ready for its receipt."""
    report = erase(service, bucket, ErasureRequest("acme", ERASED, topics=["app"], delete_delay=delay),
                   dry_run=False, by="tester")
    _worker(service, bucket).run(until_idle=True)
    clock.advance((delay or 0) + 120)
    Maintenance(service, open_bucket(bucket), RetentionConfig(), delete_delay=0 if not delay else 2 * HOUR,
                is_leader=lambda: True, term=lambda: 1, clock=clock, sync_delay=0,
                erasure_delay_floor=HOUR).collect_tombstones()
    return report.id


def _holders(store: Bucket, erasure: str) -> set[str]:
    """The objects the leftover scan finds holding a record of the erasure."""
    row = {"tenant": "acme", "key_sha256": hashlib.sha256(ERASED).hexdigest(), "matched_by": "key",
           "topics": ["app"], "watermarks": [], "positions": []}
    return {f.object for f in scan_leftovers(store, "acme", Needle.of(row)).leftovers}


def _keys(store: Bucket, key: str) -> list[bytes]:
    return pq.read_table(io.BytesIO(store.get(key)), columns=["key"]).column("key").to_pylist()


def test_tombstoned_merge_sources_holding_the_key_go_with_the_erasures_delay(service: MetastoreService,
                                                                            bucket: BucketConfig,
                                                                            clock: Clock) -> None:
    """A merge's sources tombstoned before the request still hold the key verbatim; the erasure asked for 1 h:
    they go with its own replaced blocks, and the receipt is written then. Before, they kept block.delete_delay
    (2 h) and the receipt waited an hour more than asked."""
    store = open_bucket(bucket)
    tombstoned = {r.block_id for r in service.tombstones(limit=100)}
    assert len(tombstoned) == 3  # partition 0's first three backup blocks, merged by the fixture
    erasure = _erased(service, bucket, clock, delay=HOUR)
    assert tombstoned.isdisjoint(r.block_id for r in service.tombstones(limit=10_000))
    receipt = write_receipt(service, store, erasure)
    assert receipt["leftover_scan"]["leftovers"] == 0
    assert _holders(store, erasure) == set()


def test_a_marked_block_holding_the_key_makes_the_receipt_wait(service: MetastoreService, bucket: BucketConfig,
                                                               clock: Clock) -> None:
    """A block marked for deletion and not deleted yet (tombstoned by another cause, with a longer delay) holds the
    key verbatim: the receipt waits for it, naming its objects and never the key."""
    store = open_bucket(bucket)
    erasure = _erased(service, bucket, clock, delay=HOUR)
    marked = _block(store, "backup", "app", 1, 0, 10, generation=7)
    write_deletion_mark(store, "acme", marked.id, clock(), "test")
    with pytest.raises(ReceiptNotReadyError, match="marked for deletion") as waiting:
        write_receipt(service, store, erasure)
    assert block_file_key(marked, marked.datasets[0].file) in str(waiting.value)
    assert "customer-42" not in str(waiting.value)
    for item in list(store.list(meta_key(marked).removesuffix("meta.json"))):
        store.delete(item.key)  # the leader deletes it after its delay
    assert write_receipt(service, store, erasure)["leftover_scan"]["leftovers"] == 0


def test_an_orphan_block_holding_the_key_makes_the_receipt_wait(service: MetastoreService, bucket: BucketConfig,
                                                                clock: Clock) -> None:
    """A block in the bucket the index never had (a lost lease's output, a refused dead letter commit's)."""
    store = open_bucket(bucket)
    erasure = _erased(service, bucket, clock)
    orphan = _block(store, "backup", "app", 1, 0, 10, generation=7)
    with pytest.raises(ReceiptNotReadyError, match="not in the index and not marked") as waiting:
        write_receipt(service, store, erasure)
    assert block_file_key(orphan, orphan.datasets[0].file) in str(waiting.value)
    for item in list(store.list(meta_key(orphan).removesuffix("meta.json"))):
        store.delete(item.key)  # the leader's bucket scan marks it, then deletes it
    assert write_receipt(service, store, erasure)["leftover_scan"]["leftovers"] == 0


def _dead_letters(bucket: BucketConfig) -> dict[str, str]:
    """Dead letters of restore job r1 from topic app: the key's record at offset 3, another key's at 4; and, of
    job r2, the key's record in topic other (not erased)."""
    def work(topic: str) -> PartitionWork:
        return PartitionWork(job="r1" if topic == "app" else "r2", topic=topic, target_topic=f"{topic}-back",
                             partition=0, start=0, end=40, intervals=(), source_partitions=2, target_partitions=2,
                             until_ms=None,
                             commit_every=100, tenant="acme", max_message_bytes=10, dead_letter=True)
    assert _key("app", 3) == ERASED
    return {name: _dead_letter(bucket, work(topic), "b", offset, 99, key, b"v" * 50, [("h", key)], 1_000)
            for name, topic, offset, key in (("erased", "app", 3, ERASED), ("kept", "app", 4, _key("app", 4)),
                                             ("other topic", "other", 5, ERASED))}


def test_a_restore_dead_letter_of_the_key_becomes_a_stub_named_by_the_receipt(service: MetastoreService,
                                                                              bucket: BucketConfig,
                                                                              clock: Clock) -> None:
    """The dead letter keeps the record's place (``shale restore offsets`` counts it as not sent), not the
    record; the others are untouched."""
    store = open_bucket(bucket)
    erasure = _erased(service, bucket, clock)
    letters = _dead_letters(bucket)
    before = {name: store.get(key) for name, key in letters.items()}
    assert _holders(store, erasure) == {letters["erased"]}
    receipt = write_receipt(service, store, erasure)
    assert _holders(store, erasure) == set()
    for kept in ("kept", "other topic"):
        assert store.get(letters[kept]) == before[kept]
    stub = json.loads(store.get(letters["erased"]))
    assert (stub["key"], stub["value"], stub["headers"], stub["erased_by"]) == (None, None, [], erasure)
    assert (stub["topic"], stub["partition"], stub["offset"], stub["job"]) == ("app", 0, 3, "r1")
    assert "timestamp_ms" not in stub
    assert dead_lettered(store, "acme", "r1") == {0: [3, 4]}
    outside = receipt["leftover_scan"]["erased_outside_index"]
    assert [(o["object"], o["kind"], o["records_removed"]) for o in outside] == [
        (letters["erased"], "restore-dead-letter", 1)]
    assert outside[0]["sha256_after"] == hashlib.sha256(store.get(letters["erased"])).hexdigest()
    assert "customer-42" not in json.dumps(receipt)
    assert json.loads(store.get(f"acme/erasures/{erasure}/outside.json"))[0]["object"] == letters["erased"]
    assert receipt["leftover_scan"]["prefixes"] == scan_prefixes("acme")


def test_a_quarantined_blocks_objects_are_rewritten_without_the_key(service: MetastoreService,
                                                                    bucket: BucketConfig, clock: Clock) -> None:
    """A damaged block kept by repair (its records found nowhere else) keeps its intact objects for ever: the
    erasure rewrites each holding a record of the key without those rows, keeping the others."""
    store = open_bucket(bucket)
    erasure = _erased(service, bucket, clock)
    damaged = _block(store, "partition", "app", 1, 0, 20, generation=3)
    write_quarantine_mark(store, "acme", damaged.id, clock(), ["records: checksum"], "no other copy")
    objects = {d.kind: block_file_key(damaged, d.file) for d in damaged.datasets}
    before = {name: _keys(store, key) for name, key in objects.items()}
    assert ERASED in before["records"] + before["quarantine"]
    receipt = write_receipt(service, store, erasure)
    assert _holders(store, erasure) == set()
    outside = {o["object"]: o for o in receipt["leftover_scan"]["erased_outside_index"]}
    for name, key in objects.items():
        after = _keys(store, key)
        assert after == [k for k in before[name] if k != ERASED]  # the others kept, in order
        if ERASED in before[name]:
            assert outside[key]["records_removed"] == before[name].count(ERASED)
            assert outside[key]["state"] == "quarantined"
            assert outside[key]["sha256_after"] == hashlib.sha256(store.get(key)).hexdigest()


def test_an_unreadable_object_refuses_the_receipt(service: MetastoreService, bucket: BucketConfig,
                                                  clock: Clock) -> None:
    store = open_bucket(bucket)
    erasure = _erased(service, bucket, clock)
    damaged = _block(store, "backup", "app", 1, 0, 10, generation=4)
    key = block_file_key(damaged, damaged.datasets[0].file)
    store.put(key, b"PAR1 not a parquet object")
    with pytest.raises(ShaleError, match="cannot be read") as refused:
        write_receipt(service, store, erasure)
    assert not isinstance(refused.value, ReceiptNotReadyError)
    assert key in str(refused.value)
    store.delete(key)
    elsewhere = _block(store, "backup", "other", 1, 0, 10, generation=4)  # a topic the erasure does not name
    store.put(block_file_key(elsewhere, elsewhere.datasets[0].file), b"PAR1 not a parquet object")
    receipt = write_receipt(service, store, erasure)
    assert receipt["leftover_scan"]["unreadable_of_other_topics"] == [
        block_file_key(elsewhere, elsewhere.datasets[0].file)]


def test_records_of_the_key_after_the_watermarks_or_in_other_topics_are_not_leftovers(bucket: BucketConfig) -> None:
    store = open_bucket(bucket)
    _block(store, "backup", "app", 0, 0, 20)  # the key at offsets 3, 10 and 17
    _block(store, "backup", "other", 0, 0, 20)
    row = {"tenant": "acme", "key_sha256": hashlib.sha256(ERASED).hexdigest(), "matched_by": "key",
           "topics": ["app"], "watermarks": [{"topic": "app", "partition": 0, "end": 11}], "positions": []}
    scan = scan_leftovers(store, "acme", Needle.of(row))
    assert sorted((f.topic, f.offset) for f in scan.leftovers) == [("app", 3), ("app", 10)]
    assert scan.objects_read == 2
    assert scan.bytes_read > 0
    everywhere = scan_leftovers(store, "acme", Needle.of(row | {"topics": "all", "watermarks": []}))
    assert sorted((f.topic, f.offset) for f in everywhere.leftovers) == [
        ("app", 3), ("app", 10), ("app", 17), ("other", 3), ("other", 10), ("other", 17)]
    at = scan_leftovers(store, "acme", Needle.of(row | {"key_sha256": "0" * 64, "positions": [["app", 0, 5, ""]]}))
    assert [(f.why, f.offset) for f in at.leftovers] == [("position", 5)]
    # A Parquet object where the layout names none (a copy made by hand) is read too.
    sink = io.BytesIO()
    pq.write_table(pa.table({"topic": ["app"], "partition": pa.array([0], pa.int32()),
                             "offset": pa.array([3], pa.int64()), "key": pa.array([ERASED])}), sink)
    store.put("acme/exports/copy.parquet", sink.getvalue())
    stray = scan_leftovers(store, "acme", Needle.of(row))
    assert [(f.object, f.kind, f.offset) for f in stray.leftovers if f.kind == "stray"] == [
        ("acme/exports/copy.parquet", "stray", 3)]


PLACES = st.tuples(st.sampled_from(["backup", "partition", "dead-letter"]),
                   st.sampled_from(["unindexed", "marked", "quarantined"]), st.sampled_from(["app", "other"]),
                   st.integers(0, 1), st.integers(0, 30), st.integers(1, 15))


@settings(max_examples=30, deadline=None)
@given(st.lists(PLACES, max_size=6), st.dictionaries(st.integers(0, 1), st.integers(0, 50), max_size=2))
def test_the_scan_finds_exactly_the_requested_records_of_the_key_wherever_they_are(
        places: list[tuple[str, str, str, int, int, int]], ends: dict[int, int]) -> None:
    """Blocks of either group in any state and dead letters, of the erased topic and another: the scan finds each
    record of the key in the erased topic below its partition's watermark, in every object holding it, in the
    state its marks give, and nothing else."""
    store = open_bucket(BucketConfig(url=f"memory://leftover-{uuid.uuid4().hex}"))
    expected: set[tuple[str, str, str, int, int]] = set()
    for n, (kind, state, topic, partition, start, count) in enumerate(places):
        wanted = [o for o in range(start, start + count) if _key(topic, o) == ERASED and topic == "app"
                  and o < ends.get(partition, 2**62)]
        if kind == "dead-letter":
            for o in range(start, start + count):
                key = restore_dead_letter_key("acme", f"r{n}", partition, o)
                store.put(key, json.dumps({"topic": topic, "partition": partition, "offset": o,
                                           "key": base64.b64encode(_key(topic, o)).decode()}).encode())
                expected |= {(key, "", topic, partition, o)} if o in wanted else set()
            continue
        block = _block(store, kind, topic, partition, start, count, generation=n + 1)
        if state == "marked":
            write_deletion_mark(store, "acme", block.id, 0.0, "test")
        elif state == "quarantined":
            write_quarantine_mark(store, "acme", block.id, 0.0, ["test"], "test")
        for d in block.datasets:
            rows = pq.read_table(io.BytesIO(store.get(block_file_key(block, d.file))), columns=["offset"])
            expected |= {(block_file_key(block, d.file), state, topic, partition, o)
                         for o in rows.column("offset").to_pylist() if o in wanted}
    needle = Needle(hashlib.sha256(ERASED).hexdigest(), topics=frozenset(["app"]),
                    marks=Watermarks([{"topic": "app", "partition": p, "end": end} for p, end in ends.items()]))
    scan = scan_leftovers(store, "acme", needle)
    assert scan.unreadable == []
    assert {(f.object, f.state, f.topic, f.partition, f.offset) for f in scan.leftovers} == expected
    assert {f.why for f in scan.leftovers} <= {"key"}


def test_a_column_erasure_finds_the_value_in_an_orphan_and_its_backup_copy_by_position(bucket: BucketConfig) -> None:
    """By a typed column's value: a partition block the index does not know holds the value (found by its hash),
    its backup copy and a dead letter of the same record are found at the erased position."""
    from tests.unit.erase.test_erase_column import TARGET, _blocks

    from shale.erase.column import parse, value_sha256

    store = open_bucket(bucket)
    backup, partition = _blocks(store, "orders", 0, 0, [1, TARGET, 2])
    letter = restore_dead_letter_key("acme", "r1", 0, 1)
    store.put(letter, json.dumps({"topic": "orders", "partition": 0, "offset": 1, "key": None}).encode())
    needle = Needle(value_sha256(parse(str(TARGET), pa.int64())), column="customer.id",
                    positions=frozenset({("orders", 0, 1, "")}))
    found = {(f.object, f.why, f.offset) for f in scan_leftovers(store, "acme", needle).leftovers}
    assert found == {(block_file_key(partition, partition.datasets[0].file), "value", 1),
                     (block_file_key(backup, backup.datasets[0].file), "position", 1), (letter, "position", 1)}


def test_an_object_deleted_between_the_list_and_its_read_holds_nothing(bucket: BucketConfig) -> None:
    """The leader deletes tombstoned blocks while the scan runs: an object gone when read is neither a leftover
    nor unreadable."""
    from shale.errors import NotFoundError
    from shale.objstore import BucketReader

    store = open_bucket(bucket)
    block = _block(store, "backup", "app", 0, 0, 20)
    gone = block_file_key(block, block.datasets[0].file)

    class Deleting(Metered):
        def get(self, key: str) -> bytes:
            if key == gone:
                raise NotFoundError(key)
            return super().get(key)

    row = {"tenant": "acme", "key_sha256": hashlib.sha256(ERASED).hexdigest(), "matched_by": "key",
           "topics": ["app"], "watermarks": [], "positions": []}
    reader: BucketReader = Deleting(store)
    scan = scan_leftovers(reader, "acme", Needle.of(row))
    assert (scan.leftovers, scan.unreadable, scan.gone) == ([], [], 1)


def test_a_receipt_after_a_crash_still_names_what_the_erasure_erased_outside_the_index(
        service: MetastoreService, bucket: BucketConfig, clock: Clock) -> None:
    """An attempt that erased a dead letter and stopped before writing the receipt: the next one finds nothing
    left, and its receipt names the dead letter all the same (from ``outside.json``)."""
    from shale.block import erasure_receipt_key
    from shale.erase.receipt import _erase_outside

    store = open_bucket(bucket)
    erasure = _erased(service, bucket, clock)
    letters = _dead_letters(bucket)
    row = service.erasures(erasure)[0]
    found = scan_leftovers(store, "acme", Needle.of(row)).leftovers
    _erase_outside(store, erasure, erasure_receipt_key("acme", erasure), Needle.of(row), found)  # then killed
    assert _holders(store, erasure) == set()
    (named,) = write_receipt(service, store, erasure)["leftover_scan"]["erased_outside_index"]
    assert (named["object"], named["kind"]) == (letters["erased"], "restore-dead-letter")
    assert named["sha256_after"] == hashlib.sha256(store.get(letters["erased"])).hexdigest()


def test_a_recreated_topics_older_incarnation_past_the_new_end_is_requested() -> None:
    """The leftover scan judges "produced after the request" by the request's own rule (``Watermarks``): a
    watermark bounds its incarnation only, so an older incarnation's record past the new end is the request's (a
    leftover while it stays), and a record of unknown incarnation past the end is the request's ``undecided``."""
    row = {"key_sha256": "0" * 64, "matched_by": "key", "topics": ["app"], "positions": [],
           "watermarks": [{"topic": "app", "partition": 0, "end": 5, "incarnation": "new"}]}
    needle = Needle.of(row)
    assert needle.requested("app", 0, "old", 10)
    assert needle.requested("app", 0, "new", 4)
    assert not needle.requested("app", 0, "new", 5)
    assert not needle.requested("app", 0, "", 10)
    assert not needle.requested("other", 0, "old", 1)
