"""Another writer changing the rows of a table Shale owns (real pyiceberg on a SQLite catalog; its DELETE is
copy-on-write: new data files in place of Shale's. DuckDB's position deletes and Spark's procedures are tested
with the real engines in tests/integration/test_iceberg_maintenance.py): the publisher stops writing that table,
with the snapshot named in its status, log and gauge, leaves the other writer's snapshot current, keeps publishing
every other table and trimming the feed, and deletes nothing; once the table is rolled back to Shale's snapshot,
a full sync repairs it with one snapshot."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from tests.iceberg_helpers import HOUR, T0, commit, publisher_setup, query_rows, rows, write_records_block

from shale.block import block_file_key
from shale.iceberg.catalog import SUMMARY_INDEX, identifier, open_catalog
from shale.iceberg.publisher import STOPPED

TENANT, TOPIC, OTHER = "acme", "app", "web"


def test_a_delete_by_another_writer_stops_publishing_that_table_and_nothing_else(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config, service, publisher, bucket = publisher_setup(tmp_path)
    for i, topic in enumerate((TOPIC, OTHER)):
        commit(service, [write_records_block(bucket, TENANT, topic, 0, 0, 10, T0 + i)])
    assert publisher.run_once() == 2
    own = open_catalog(config).load_table(identifier(TENANT, TOPIC)).current_snapshot().snapshot_id

    theirs = open_catalog(config).load_table(identifier(TENANT, TOPIC))
    theirs.delete("offset < 3")  # copy-on-write: Shale's file replaced by a copy without three rows
    theirs = open_catalog(config).load_table(identifier(TENANT, TOPIC))
    left = rows(theirs.scan().to_arrow())
    assert sum(left.values()) == 7

    later = [write_records_block(bucket, TENANT, topic, 0, 10, 10, T0 + HOUR) for topic in (TOPIC, OTHER)]
    commit(service, later)
    with caplog.at_level(logging.ERROR, logger="shale.iceberg.publisher"):
        assert publisher.run_once() == 1  # the other topic's table only
    stopped = publisher.status()["stopped_tables"]
    assert len(stopped) == 1
    assert f"{TENANT}.{TOPIC}" in stopped[0]
    assert str(theirs.current_snapshot().snapshot_id) in stopped[0]
    assert "rollback_to_snapshot" in stopped[0]
    assert STOPPED._value.get() == 1
    assert any("changed by another writer" in r.message for r in caplog.records)
    assert service.state.reader.pending_change_entries() == 0  # the feed is trimmed all the same

    table = open_catalog(config).load_table(identifier(TENANT, TOPIC))
    assert table.current_snapshot().snapshot_id == theirs.current_snapshot().snapshot_id  # theirs stays current
    assert rows(table.scan().to_arrow()) == left
    other = open_catalog(config).load_table(identifier(TENANT, OTHER))
    assert rows(other.scan().to_arrow()) == query_rows(service, bucket, TENANT, OTHER, 0, 2 * T0)
    for block in service.state.reader.tenant_blocks(TENANT):  # every block still stored: nothing deleted
        for dataset in block.datasets:
            bucket.head(block_file_key(block, dataset.file))  # raises when missing
    assert publisher.run_once() == 0  # stays stopped, and is not looked at again until a full sync

    with table.manage_snapshots() as manage:  # the owner hands the table back: rolled back to Shale's snapshot
        manage.rollback_to_snapshot(own)
    result = publisher.sync(full=True)
    assert result["repaired"] == 1
    assert publisher.status()["stopped_tables"] == []
    assert STOPPED._value.get() == 0
    table = open_catalog(config).load_table(identifier(TENANT, TOPIC))
    assert rows(table.scan().to_arrow()) == query_rows(service, bucket, TENANT, TOPIC, 0, 2 * T0)
    assert SUMMARY_INDEX in table.current_snapshot().summary.additional_properties
    assert theirs.current_snapshot().snapshot_id in {s.snapshot_id for s in table.snapshots()}  # never dropped


def test_an_empty_commit_or_a_property_change_by_another_writer_does_not_stop_publishing(tmp_path: Path) -> None:
    config, service, publisher, bucket = publisher_setup(tmp_path)
    commit(service, [write_records_block(bucket, TENANT, TOPIC, 0, 0, 10, T0)])
    assert publisher.run_once() == 1
    table = open_catalog(config).load_table(identifier(TENANT, TOPIC))
    with table.transaction() as tx:
        tx.set_properties({"comment": "the orders"})
        with tx.update_snapshot(snapshot_properties={"writer": "other"}).fast_append():
            pass
    commit(service, [write_records_block(bucket, TENANT, TOPIC, 0, 10, 10, T0 + 1000)])
    assert publisher.run_once() == 1
    assert publisher.status()["stopped_tables"] == []
    table = open_catalog(config).load_table(identifier(TENANT, TOPIC))
    assert rows(table.scan().to_arrow()) == query_rows(service, bucket, TENANT, TOPIC, 0, 2 * T0)
