"""Shale expires its own tables' old snapshots on a schedule (metadata only): the data files stay, the table reads
the same rows, the newest snapshot Shale wrote survives another writer's on top, and nothing is published twice."""

from __future__ import annotations

import time
from pathlib import Path

from tests.iceberg_helpers import HOUR, T0, commit, query_rows, rows, write_records_block

from shale.config import ShaleConfig
from shale.iceberg import IcebergPublisher
from shale.iceberg.catalog import SUMMARY_INDEX, identifier, open_catalog
from shale.metastore import MetastoreService, SingleNodeLog, StateMachine
from shale.objstore import open_bucket

TENANT, TOPIC = "acme", "app"
DAY = 86_400.0


def test_old_snapshots_are_expired_and_no_data_file_is_deleted(tmp_path: Path) -> None:
    config = ShaleConfig.model_validate({
        "bucket": {"url": f"file://{tmp_path}/bucket"}, "metastore": {"data_dir": str(tmp_path / "ms")},
        "iceberg": {"enabled": True, "catalog_uri": f"sqlite:///{tmp_path}/catalog.db",
                    "snapshot_retention": "1d", "expire_interval": "1h"},
        "block": {"delete_delay": 0, "sync_delay": 0}, "bucket_index": {"max_stale_period": 0}})
    state = StateMachine(tmp_path / "ms" / "state.db")
    service = MetastoreService(state, SingleNodeLog(state))
    bucket = open_bucket(config.bucket)
    offset = [0.0]
    publisher = IcebergPublisher(config, state.reader, service.submit, bucket, clock=lambda: time.time() + offset[0])
    blocks = [write_records_block(bucket, TENANT, TOPIC, 0, i * 10, 10, T0 + i * 1000) for i in range(3)]
    for b in blocks:
        commit(service, [b])
    assert publisher.run_once() == 3
    catalog = open_catalog(config)
    assert len(catalog.load_table(identifier(TENANT, TOPIC)).snapshots()) == 3

    offset[0] = 0.5 * DAY  # younger than the retention: nothing expires
    commit(service, [write_records_block(bucket, TENANT, TOPIC, 0, 30, 10, T0 + 3000)])
    assert publisher.run_once() == 1
    assert len(catalog.load_table(identifier(TENANT, TOPIC)).snapshots()) == 4

    # another writer's snapshot on top of Shale's newest, then the retention passes
    table = catalog.load_table(identifier(TENANT, TOPIC))
    with table.transaction() as tx, tx.update_snapshot(snapshot_properties={"writer": "other"}).fast_append():
        pass
    offset[0] = 2 * DAY
    assert publisher.run_once() == 0
    table = catalog.load_table(identifier(TENANT, TOPIC))
    left = [s.summary.additional_properties for s in table.snapshots()]
    assert [s.get(SUMMARY_INDEX) for s in left] == [str(publisher.published_through), None]  # Shale's newest kept
    assert publisher.status()["expired_snapshots"] == 3
    assert rows(table.scan().to_arrow()) == query_rows(service, bucket, TENANT, TOPIC, 0, T0 + HOUR)
    assert all(bucket.head(f.file.file_path.split("/bucket/", 1)[1]) for f in table.scan().plan_files())

    # publishing goes on from the kept snapshot: the next entry is one more snapshot, no entry again
    commit(service, [write_records_block(bucket, TENANT, TOPIC, 0, 40, 10, T0 + 4000)])
    assert publisher.run_once() == 1
    fresh = IcebergPublisher(config, state.reader, service.submit, bucket)
    assert fresh.sync()["snapshots"] == 0
    table = catalog.load_table(identifier(TENANT, TOPIC))
    assert rows(table.scan().to_arrow()) == query_rows(service, bucket, TENANT, TOPIC, 0, T0 + HOUR)
    assert len(list(table.scan().plan_files())) == 5
