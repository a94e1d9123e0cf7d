"""One unwritable item among good ones affects that item or its table alone (issue 54, point 12): a property over
which table and which position of the feed holds it.

Two kinds: a block with a decimal of more than 38 digits (Iceberg has no such type: the file is refused, its table
takes every other block), and a block whose object cannot be read (a table-level failure: that table is reported
and retried with a backoff, the others are published). Either way the change feed is trimmed, and once the object
is readable again the table catches up in one repair snapshot, in the same publisher or a new leader's."""

from __future__ import annotations

import decimal
import time

import pyarrow as pa
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tests.iceberg_helpers import commit, publisher_setup, typed_block

from shale.block import BlockMeta, block_file_key
from shale.iceberg import IcebergPublisher
from shale.iceberg.catalog import identifier
from shale.iceberg.failures import FAILING
from shale.iceberg.files import block_of
from shale.iceberg.publisher import REFUSED

TABLES = [("acme", "orders"), ("acme", "payments"), ("beta", "refunds")]
POSITIONS = 3


class Clock:
    def __init__(self) -> None:
        self.now = time.time()  # snapshots are stamped with the wall clock: no expiry by retention here

    def __call__(self) -> float:
        return self.now


def good_columns(start: int) -> dict[str, pa.Array]:
    return {"qty": pa.array([start, start + 1], pa.int64())}


def wide_decimal_columns(start: int) -> dict[str, pa.Array]:
    wide = decimal.Decimal(10**39 + start)  # 40 digits: Avro's and JSON Schema's decimals may be this wide
    return good_columns(start) | {"amount": pa.array([wide, -wide], pa.decimal256(40, 0))}


def held(publisher: IcebergPublisher, tenant: str, topic: str) -> set[str]:
    catalog = publisher.catalog
    if not catalog.table_exists(identifier(tenant, topic)):
        return set()
    table = catalog.load_table(identifier(tenant, topic))
    return {block_of(t.file.file_path) for t in table.scan().plan_files()}


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bad_table=st.sampled_from(range(len(TABLES))), bad_position=st.sampled_from(range(POSITIONS)),
       kind=st.sampled_from(["wide-decimal", "unreadable"]), new_leader=st.booleans())
@example(bad_table=0, bad_position=0, kind="wide-decimal", new_leader=False)
@example(bad_table=1, bad_position=1, kind="unreadable", new_leader=False)
@example(bad_table=2, bad_position=0, kind="unreadable", new_leader=True)
def test_one_unwritable_item_stops_only_its_table(tmp_path_factory, bad_table: int, bad_position: int, kind: str,
                                                  new_leader: bool) -> None:
    config, service, publisher, bucket = publisher_setup(tmp_path_factory.mktemp("blast"))
    clock = Clock()
    publisher.clock = clock
    blocks: dict[int, list[BlockMeta]] = {i: [] for i in range(len(TABLES))}
    bad: BlockMeta | None = None
    original = b""
    for position in range(POSITIONS):  # the tables' commits interleaved, one log entry each
        for i, (tenant, topic) in enumerate(TABLES):
            start = i * 100 + position * 2
            is_bad = (i, position) == (bad_table, bad_position)
            columns = wide_decimal_columns(start) if is_bad and kind == "wide-decimal" else good_columns(start)
            block = typed_block(bucket, tenant, topic, start, 2, columns)
            if is_bad:
                bad = block
                if kind == "unreadable":
                    key = block_file_key(block, block.datasets[0].file)
                    original = bucket.get(key)
                    bucket.put(key, b"\0" * len(original))  # its footer cannot be read
            blocks[i].append(block)
            commit(service, [block])
    assert bad is not None
    refused = REFUSED._value.get()

    publisher.run_once()  # never raises for one table's problem

    for i, (tenant, topic) in enumerate(TABLES):
        ids = {b.id for b in blocks[i]}
        if i != bad_table:
            assert held(publisher, tenant, topic) == ids, (tenant, topic)
    tenant, topic = TABLES[bad_table]
    assert publisher.reader.pending_change_entries() == 0  # the feed is trimmed all the same
    if kind == "wide-decimal":
        assert held(publisher, tenant, topic) == {b.id for b in blocks[bad_table]} - {bad.id}
        assert REFUSED._value.get() == refused + 1
        assert publisher.status()["failing_tables"] == []
        return

    # The failing table took the entries before its bad one, and nothing after; it is reported.
    assert held(publisher, tenant, topic) == {b.id for b in blocks[bad_table][:bad_position]}
    status = publisher.status()
    assert [(f["tenant"], f["topic"]) for f in status["failing_tables"]] == [(tenant, topic)]
    assert status["failing_tables"][0]["failures"] == 1
    assert "ArrowInvalid" in status["failing_tables"][0]["error"]
    assert FAILING._value.get() == 1
    publisher.run_once()  # not due yet: not tried again
    assert publisher.status()["failing_tables"][0]["failures"] == 1

    # Later entries of every table: the others publish them, the failing one waits for its retry.
    later = []
    for i, (t, top) in enumerate(TABLES):
        start = i * 100 + POSITIONS * 2
        block = typed_block(bucket, t, top, start, 2, good_columns(start))
        blocks[i].append(block)
        later.append(block)
        commit(service, [block])
    publisher.run_once()
    for i, (t, top) in enumerate(TABLES):
        if i != bad_table:
            assert held(publisher, t, top) == {b.id for b in blocks[i]}

    # The object is readable again: the table catches up in one snapshot, at its retry or a new leader's start.
    bucket.put(block_file_key(bad, bad.datasets[0].file), original)
    clock.now += 3600
    if new_leader:
        publisher = IcebergPublisher(config, publisher.reader, service.submit, bucket, clock=clock)
    before = len(publisher.catalog.load_table(identifier(tenant, topic)).snapshots())
    publisher.run_once()
    assert held(publisher, tenant, topic) == {b.id for b in blocks[bad_table]}
    assert len(publisher.catalog.load_table(identifier(tenant, topic)).snapshots()) == before + 1
    assert publisher.status()["failing_tables"] == []
    assert FAILING._value.get() == 0


def test_a_failing_tables_retry_backs_off_doubling_up_to_its_cap() -> None:
    from shale.iceberg.failures import RETRY_BASE, RETRY_MAX, FailingTables
    from shale.iceberg.plan import TableKey

    failing, key = FailingTables(), TableKey("acme", "orders")
    delays = [failing.record(key, 7 + n, OSError("boom"), 0.0).delay for n in range(12)]
    assert delays[:3] == [RETRY_BASE, 2 * RETRY_BASE, 4 * RETRY_BASE]
    assert max(delays) == RETRY_MAX
    assert failing.get(key).since == 7  # the first entry it did not take
    assert failing.due(RETRY_MAX - 1) == []
    assert failing.due(RETRY_MAX) == [key]
    assert failing.clear(key) is not None
    assert len(failing) == 0
