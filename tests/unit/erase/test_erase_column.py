"""Erasure by a typed column's value (``shale erase --column customer.id --value 42``): the canonical form of a
value and its hash, the scan of the partition group, and the erase jobs that remove the matching records from both
groups (the backup group's by their Kafka positions), against a real embedded metastore and an in-memory bucket."""

from __future__ import annotations

import datetime as dt
import decimal
import hashlib
import uuid
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
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
from shale.block.schemas import BACKUP_SCHEMA, partition_schema
from shale.compactor.worker import CompactionWorker
from shale.config import BucketConfig, CompactionConfig, RetentionConfig
from shale.erase import ColumnValueError, column_request, erase, erasure_status, write_receipt
from shale.erase.column import canonical_forms, matching, parse, request_hash, value_sha256
from shale.erase.receipt import final_scan
from shale.erase.scan import find_column_matches
from shale.metastore import AddBlocks, MetastoreService, SingleNodeLog, StateMachine
from shale.metastore.api.maintenance import Maintenance
from shale.objstore import Bucket, open_bucket

INT64 = pa.int64()
INTS = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint32(), pa.uint64()]


@given(st.integers(min_value=-(2**63), max_value=2**64 - 1), st.sampled_from([*INTS, pa.decimal128(38, 3)]))
def test_an_integer_has_one_canonical_form_in_every_numeric_type_that_holds_it(value: int, type_: pa.DataType) -> None:
    try:
        stored = pa.array([value], type_)
    except (pa.ArrowInvalid, OverflowError):
        with pytest.raises(ColumnValueError):
            parse(str(value), type_)
        return
    assert canonical_forms(stored) == [parse(str(value), type_)] == [f"number:{value}".encode()]


@given(st.decimals(min_value=-(10**9), max_value=10**9, places=2, allow_nan=False, allow_infinity=False))
def test_a_decimal_round_trips_whatever_its_scale(value: decimal.Decimal) -> None:
    forms = {canonical_forms(pa.array([value], t))[0] for t in (pa.decimal128(12, 2), pa.decimal128(20, 5))}
    assert forms == {parse(str(value), pa.decimal128(12, 2))}
    assert len(forms) == 1
    if value == int(value):  # a whole decimal is the integer
        assert forms == {parse(str(int(value)), pa.int64())}


@given(st.text())
def test_a_string_round_trips(text: str) -> None:
    assert canonical_forms(pa.array([text])) == [parse(text, pa.string())] == canonical_forms(
        pa.array([text], pa.large_string()))


@given(st.datetimes(min_value=dt.datetime(1900, 1, 1), max_value=dt.datetime(2200, 1, 1),
                    timezones=st.just(dt.UTC)), st.sampled_from(["ms", "us", "ns"]))
def test_an_instant_has_one_canonical_form_in_every_unit(when: dt.datetime, unit: str) -> None:
    when = when.replace(microsecond=when.microsecond // 1000 * 1000) if unit == "ms" else when
    stored = pa.array([when], pa.timestamp(unit, tz="UTC"))
    assert canonical_forms(stored) == [parse(when.isoformat(), pa.timestamp(unit, tz="UTC"))]
    other_zone = when.astimezone(dt.timezone(dt.timedelta(hours=5, minutes=30))).isoformat()
    assert parse(other_zone, pa.timestamp("us")) == parse(when.replace(tzinfo=None).isoformat(), pa.timestamp("us"))


@pytest.mark.parametrize(("text", "type_", "why"), [
    ("abc", pa.int64(), "not a number"),
    ("4.5", pa.int32(), "not a value of the column's type"),
    (str(2**40), pa.int32(), "not a value of the column's type"),
    ("-1", pa.uint64(), "not a value of the column's type"),
    ("42.123", pa.decimal128(12, 2), "not a value of the column.s type decimal128.12, 2."),
    ("NaN", pa.decimal128(12, 2), "not a finite number"),
    ("yesterday", pa.timestamp("us", tz="UTC"), "not an ISO 8601 timestamp"),
    ("maybe", pa.bool_(), "not a boolean"),
    ("1.5", pa.float64(), "cannot be matched by value"),
])
def test_a_value_that_is_not_one_of_the_columns_type_is_a_clear_error(text: str, type_: pa.DataType,
                                                                      why: str) -> None:
    with pytest.raises(ColumnValueError, match=why):
        parse(text, type_)


def test_the_request_hash_has_one_hash_per_kind_and_needs_a_column() -> None:
    assert request_hash("42", [pa.int32(), pa.int64()], "customer.id") == value_sha256(b"number:42")
    assert request_hash("42", [pa.int64(), pa.string()], "customer.id") == ",".join(sorted(
        [value_sha256(b"number:42"), value_sha256(b"string:42")]))
    assert request_hash("abc", [pa.int64(), pa.string()], "customer.id") == value_sha256(b"string:abc")
    with pytest.raises(ColumnValueError, match="not a value of the column's type int32"):
        request_hash(str(2**40), [pa.int32(), pa.int64(), pa.string()], "customer.id")  # one kind, partly
    with pytest.raises(ColumnValueError, match=r"none of the column customer\.id.s types"):
        request_hash("abc", [pa.int64(), pa.bool_()], "customer.id")
    with pytest.raises(ColumnValueError, match="no records dataset"):
        request_hash("42", [], "customer.id")


@given(st.one_of(st.integers(-(2**63), 2**63 - 1).map(str), st.text()))
@example("42")  # refused before: "types of different kinds"
def test_a_value_matches_each_kind_by_its_own_form_and_nothing_else(text: str) -> None:
    """A column ``string`` in old blocks and ``long`` in new ones (a JSON rule given ``types`` later): each
    dataset's rows are matched by the form of their own kind, and a form of one kind never matches another's."""
    hashes = request_hash(text, [pa.int64(), pa.string()], "customer.id")
    assert matching(pa.array([text, text + " ", None]), hashes).to_pylist() == [True, False, False]
    if text.lstrip("-").isascii() and text.lstrip("-").isdigit() and -(2**63) < int(text) < 2**63 - 1:
        number = int(text)
        assert matching(pa.array([number, number + 1], pa.int64()), hashes).to_pylist() == [True, False]
        assert hashes.count(",") == 1


# --- the scan and the erasure -------------------------------------------------------------------------------------

TARGET = 42


def _customer_type(id_type: pa.DataType) -> pa.DataType:
    return pa.struct([("id", id_type), ("name", pa.string())])


def _blocks(bucket: Bucket, topic: str, partition: int, start: int, ids: list[int | None],
            id_type: pa.DataType = INT64, generation: int = 1) -> list[BlockMeta]:
    """A backup block and a typed partition block of the same records; ``ids[i]`` is record ``start + i``'s
    ``customer.id`` (None: a null customer)."""
    count = len(ids)
    offsets = list(range(start, start + count))
    rows = {
        "topic": pa.array([topic] * count), "partition": pa.array([partition] * count, pa.int32()),
        "offset": pa.array(offsets, pa.int64()),
        "timestamp": pa.array([BASE_MS + o * 1000 for o in offsets], pa.timestamp("ms", tz="UTC")),
        "timestamp_type": pa.array([0] * count, pa.int8()),
        "key": pa.array([f"k{o % 3}".encode() for o in offsets], pa.binary()),  # keys say nothing of the customer
        "value": pa.array([f'{{"n": {o}}}'.encode() for o in offsets], pa.binary()),
        "headers": pa.array([[]] * count, BACKUP_SCHEMA.field("headers").type),
    }
    out = []
    for group in ("backup", "partition"):
        block_id = deterministic_block_id(BASE_MS + start * 1000, f"{group}/{generation}/{topic}/{partition}/{start}")
        spec = BlockSpec(id=block_id, tenant="acme", group=group, generation=generation,
                         kafka=[KafkaRange(topic=topic, partition=partition, start=start, end=start + count)])
        table = pa.table(rows, schema=BACKUP_SCHEMA)
        if group == "backup":
            out.append(write_block(bucket, spec, [DatasetInput("records", topic, table, "timestamp",
                                                               labels=[{"topic": topic}])]))
            continue
        customer = pa.array([None if i is None else {"id": i, "name": f"c{i}"} for i in ids], _customer_type(id_type))
        parsed = table.append_column("event_time", table.column("timestamp").cast(pa.timestamp("us", tz="UTC")))
        parsed = parsed.append_column("dt", pa.array(["2026-11-18"] * count))
        parsed = parsed.append_column("hour", pa.array([None] * count, pa.int8()))
        parsed = parsed.append_column("customer", customer)
        spec.partition_values = {"dt": "2026-11-18"}
        schema = partition_schema(["customer"], {"customer": _customer_type(id_type)})
        out.append(write_block(bucket, spec, [DatasetInput("records", topic, parsed.cast(schema), "event_time",
                                                           labels=[{"topic": topic}])]))
    return out


@settings(max_examples=25, deadline=None)
@given(st.lists(st.one_of(st.none(), st.sampled_from([TARGET, 7, -TARGET, 4200])), min_size=1, max_size=40),
       st.sampled_from([pa.int32(), pa.int64(), pa.decimal128(10, 0)]))
def test_the_scan_finds_exactly_the_records_whose_column_holds_the_value(ids: list[int | None],
                                                                         id_type: pa.DataType) -> None:
    bucket = open_bucket(BucketConfig(url=f"memory://erase-col-{uuid.uuid4().hex}"))
    half = len(ids) // 2
    blocks = _blocks(bucket, "orders", 0, 0, ids[:half], id_type) if half else []
    blocks += _blocks(bucket, "orders", 0, half, ids[half:], pa.int64())  # another schema version: int64
    request = request_hash(str(TARGET), [pa.int64(), id_type], "customer.id")
    scan = find_column_matches(bucket, blocks, "customer.id", request, ["orders"])
    want = [o for o, i in enumerate(ids) if i == TARGET]
    assert [p[2] for p in scan.positions] == want
    assert {b.group for b in scan.affected} == ({"backup", "partition"} if want else set())


ROWS = 10


def _ids(partition: int, start: int) -> list[int | None]:
    return [None if o % 11 == 5 else (TARGET if o % 7 == 3 else o % 5) for o in range(start, start + ROWS)]


@pytest.fixture
def bucket() -> BucketConfig:
    return BucketConfig(url=f"memory://erase-{uuid.uuid4().hex}")


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def service(tmp_path: Path, bucket: BucketConfig, clock: Clock) -> MetastoreService:
    """Topics orders (partitions 0 and 1) and other, both groups, 3 blocks of 10 records per partition; partition
    1's first block has customer.id as int32 (an older schema version); other holds customer 42 too."""
    state = StateMachine(tmp_path / "s.db")
    service = MetastoreService(state, SingleNodeLog(state, clock=clock), clock=clock,
                               compaction=CompactionConfig(blocks_per_job=[3]))
    store = open_bucket(bucket)
    blocks = [b for topic, p in (("orders", 0), ("orders", 1), ("other", 0)) for i in range(3)
              for b in _blocks(store, topic, p, i * ROWS, _ids(p, i * ROWS),
                               pa.int32() if (topic, p, i) == ("orders", 1, 0) else pa.int64())]
    service.submit(AddBlocks(blocks=blocks))
    return service


def _worker(service: MetastoreService, bucket: BucketConfig) -> CompactionWorker:
    return CompactionWorker(service, bucket, None, slots=64, poll_interval=0.01, runner=ThreadRunner(bucket))


def _stored(service: MetastoreService, bucket: BucketConfig) -> dict[tuple[str, str], Counter[tuple[int, int]]]:
    store = open_bucket(bucket)
    out: dict[tuple[str, str], Counter[tuple[int, int]]] = {}
    for meta in service.tenant_blocks("acme"):
        for d in meta.datasets:
            t = read_dataset(store, meta, d)
            for p, o in zip(t.column("partition").to_pylist(), t.column("offset").to_pylist(), strict=True):
                out.setdefault((meta.group, d.topic), Counter())[(p, o)] += 1
    return out


def _expected(topic: str, erased: bool) -> Counter[tuple[int, int]]:
    return Counter({(p, o): 1 for p in ((0, 1) if topic == "orders" else (0,)) for o in range(3 * ROWS)
                    if not (erased and _ids(p, o - o % ROWS)[o % ROWS] == TARGET)})


def test_a_dry_run_names_the_records_and_changes_nothing(service: MetastoreService, bucket: BucketConfig) -> None:
    before = service.state.state_hash()
    request = column_request(service, "acme", "customer.id", "42", ["orders"])
    report = erase(service, bucket, request, dry_run=True)
    assert service.state.state_hash() == before
    want = sum(1 for p in (0, 1) for o in range(3 * ROWS) if _ids(p, o - o % ROWS)[o % ROWS] == TARGET)
    assert report.matches == want > 0
    assert report.blocks_opened == 6  # the partition blocks of orders
    assert Counter(b["group"] for b in report.blocks) == {"backup": 6, "partition": 6}


def test_a_value_not_of_the_columns_type_or_an_unknown_column_is_refused(service: MetastoreService) -> None:
    with pytest.raises(ColumnValueError, match="not a number"):
        column_request(service, "acme", "customer.id", "forty-two")
    with pytest.raises(ColumnValueError, match="no records dataset"):
        column_request(service, "acme", "customer.email", "a@b.c")


def test_an_erasure_by_column_removes_the_matching_records_from_both_groups_and_nothing_else(
        service: MetastoreService, bucket: BucketConfig, clock: Clock) -> None:
    request = column_request(service, "acme", "customer.id", "42", ["orders"])
    report = erase(service, bucket, request, dry_run=False, by="tester")
    assert report.state == "rewriting"
    assert erase(service, bucket, column_request(service, "acme", "customer.id", "42.0", ["orders"]),
                 dry_run=True).previous == report.id  # the same value, written otherwise: the same request
    _worker(service, bucket).run(until_idle=True)
    assert erasure_status(service, report.id).state == "rewritten"
    stored = _stored(service, bucket)
    assert stored[("backup", "orders")] == _expected("orders", erased=True)
    assert stored[("partition", "orders")] == _expected("orders", erased=True)
    assert stored[("backup", "other")] == _expected("other", erased=False)
    assert stored[("partition", "other")] == _expected("other", erased=False)
    row = service.erasures(report.id)[0]
    assert row["matched_by"] == "column:customer.id"
    assert row["key_sha256"] == hashlib.sha256(b"number:42").hexdigest()
    clock.advance(1)
    store = open_bucket(bucket)
    Maintenance(service, store, RetentionConfig(), delete_delay=0, is_leader=lambda: True, term=lambda: 1,
                clock=clock, sync_delay=0).collect_tombstones()
    receipt = write_receipt(service, store, report.id)
    assert receipt["matched_by"] == "column:customer.id"
    assert receipt["final_scan"]["matches"] == 0
    assert receipt["records"] == report.matches


def test_the_final_scan_finds_a_value_left_behind(service: MetastoreService, bucket: BucketConfig) -> None:
    report = erase(service, bucket, column_request(service, "acme", "customer.id", "42", ["orders"]), dry_run=False)
    _worker(service, bucket).run(until_idle=True)
    left = _blocks(open_bucket(bucket), "orders", 9, 0, [TARGET, 1])
    scan = final_scan(open_bucket(bucket), [*service.tenant_blocks("acme"), *left], ["orders"],
                      hashlib.sha256(b"number:42").hexdigest(), [], column="customer.id")
    assert {(m["block"], m["why"]) for m in scan.matches} == {(left[1].id, "value")}  # the partition block
    assert erasure_status(service, report.id).state == "rewritten"


def test_a_column_whose_types_differ_in_kind_is_matched_in_each_dataset(tmp_path: Path, bucket: BucketConfig,
                                                                        clock: Clock) -> None:
    """In one topic, customer.id is a string in the old blocks and an int64 in the new ones: erasing 42 was
    refused ("types of different kinds"); it erases the string "42" and the number 42, not "042"."""
    state = StateMachine(tmp_path / "s.db")
    service = MetastoreService(state, SingleNodeLog(state, clock=clock), clock=clock)
    store = open_bucket(bucket)
    old = _blocks(store, "orders", 0, 0, ["42", "7", "042", "42"], pa.string())  # type: ignore[list-item]
    service.submit(AddBlocks(blocks=[*old, *_blocks(store, "orders", 0, 4, [42, 7, 42])]))
    request = column_request(service, "acme", "customer.id", "42", ["orders"])
    report = erase(service, bucket, request, dry_run=False)
    assert [r["offset"] for r in report.records] == [0, 3, 4, 6]
    _worker(service, bucket).run(until_idle=True)
    assert erasure_status(service, report.id).state == "rewritten"
    assert _stored(service, bucket)[("partition", "orders")] == Counter({(0, o): 1 for o in (1, 2, 5)})
