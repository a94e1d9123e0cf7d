"""Commits the catalog does not accept (real pyiceberg on a SQLite catalog; the REST catalog raises the same
``CommitFailedException`` on its 409, tested with the real server in tests/integration/test_iceberg_rest.py): the
change is planned again against the reloaded table and is still one snapshot; a table another writer created is
never written; the published point survives another writer's snapshot on top of Shale's."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyiceberg.exceptions import CommitStateUnknownException
from tests.iceberg_helpers import HOUR, T0, commit, publisher_setup, query_rows, rows, write_records_block

from shale.config import ShaleConfig
from shale.iceberg.catalog import SUMMARY_INDEX, identifier, open_catalog
from shale.iceberg.publisher import RETRIES

TENANT, TOPIC = "acme", "app"


def other_writer_appends_nothing(config: ShaleConfig) -> None:
    """Another writer (its own catalog client) commits a snapshot of its own on the table: an empty append."""
    table = open_catalog(config).load_table(identifier(TENANT, TOPIC))
    with table.transaction() as tx, tx.update_snapshot(snapshot_properties={"writer": "other"}).fast_append():
        pass


def indexes(config: ShaleConfig) -> list[str | None]:
    table = open_catalog(config).load_table(identifier(TENANT, TOPIC))
    return [s.summary.additional_properties.get(SUMMARY_INDEX) for s in table.snapshots()]


def test_another_writer_between_load_and_commit_costs_a_retry_not_a_duplicate(tmp_path: Path) -> None:
    config, service, publisher, bucket = publisher_setup(tmp_path)
    commit(service, [write_records_block(bucket, TENANT, TOPIC, 0, 0, 10, T0)])
    assert publisher.run_once() == 1  # the publisher now holds the table as loaded
    other_writer_appends_nothing(config)  # ... which another writer advances
    commit(service, [write_records_block(bucket, TENANT, TOPIC, 0, 10, 10, T0 + 1000)])
    retries = RETRIES._value.get()
    assert publisher.run_once() == 1
    assert RETRIES._value.get() == retries + 1
    published = indexes(config)
    assert published[1] is None  # the other writer's
    assert len([i for i in published if i is not None]) == 2 == len(set(published) - {None})
    table = open_catalog(config).load_table(identifier(TENANT, TOPIC))
    assert rows(table.scan().to_arrow()) == query_rows(service, bucket, TENANT, TOPIC, 0, T0 + HOUR)
    assert "commit.retry.num-retries" not in table.properties  # pyiceberg's retry is off in memory only


def test_a_commit_whose_answer_is_lost_is_not_committed_again(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    config, service, publisher, bucket = publisher_setup(tmp_path)
    commit(service, [write_records_block(bucket, TENANT, TOPIC, 0, 0, 10, T0)])
    assert publisher.run_once() == 1
    catalog = publisher.catalog
    real = catalog.commit_table
    lost = []

    def commit_then_lose_the_answer(*args: object, **kwargs: object) -> object:
        response = real(*args, **kwargs)
        if not lost:
            lost.append(response)
            raise CommitStateUnknownException("the catalog answered 504")
        return response

    monkeypatch.setattr(catalog, "commit_table", commit_then_lose_the_answer)
    commit(service, [write_records_block(bucket, TENANT, TOPIC, 0, 10, 10, T0 + 1000)])
    assert publisher.run_once() == 0  # committed, though the publisher could not know: found on reload
    assert lost
    other_writer_appends_nothing(config)
    commit(service, [write_records_block(bucket, TENANT, TOPIC, 0, 20, 10, T0 + 2000)])
    assert publisher.run_once() == 1
    published = indexes(config)
    assert len(published) == 4
    assert published[2] is None
    assert len(set(published) - {None}) == 3
    table = open_catalog(config).load_table(identifier(TENANT, TOPIC))
    assert rows(table.scan().to_arrow()) == query_rows(service, bucket, TENANT, TOPIC, 0, T0 + HOUR)


def test_a_table_shale_did_not_create_is_never_written(tmp_path: Path) -> None:
    config, service, publisher, bucket = publisher_setup(tmp_path)
    catalog = open_catalog(config)
    catalog.create_namespace(TENANT)
    theirs = catalog.create_table(identifier(TENANT, TOPIC), schema=publisher_schema())
    commit(service, [write_records_block(bucket, TENANT, TOPIC, 0, 0, 10, T0)])
    assert publisher.run_once() == 0
    assert theirs.refresh().current_snapshot() is None
    assert any("not created by Shale" in m for m in publisher.status()["table_name_conflicts"])


def publisher_schema() -> object:
    from shale.iceberg.types import table_schema

    return table_schema([])
