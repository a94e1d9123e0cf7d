"""The publisher on a local-filesystem bucket and a SQLite catalog (real pyiceberg, real metastore state): every
change becomes one snapshot, and the table holds exactly the rows ``shale query`` returns."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from tests.iceberg_helpers import HOUR, T0, commit, compact, publisher_setup, query_rows, rows, write_records_block

from shale.config import ShaleConfig
from shale.iceberg import IcebergPublisher
from shale.iceberg.catalog import SUMMARY_INDEX, identifier
from shale.metastore import MetastoreService, SetActiveGeneration, TruncateIndex
from shale.metastore.rules.commands import CommitIngestBatch, OffsetRange, PartitionKey, Result
from shale.objstore import open_bucket

TENANT, TOPIC = "acme", "app"


@pytest.fixture
def setup(tmp_path: Path) -> tuple[ShaleConfig, MetastoreService, IcebergPublisher]:
    return publisher_setup(tmp_path)[:3]


def table_rows(publisher: IcebergPublisher) -> object:
    table = publisher.catalog.load_table(identifier(TENANT, TOPIC))
    return rows(table.scan().to_arrow())


def snapshots(publisher: IcebergPublisher) -> list[int]:
    table = publisher.catalog.load_table(identifier(TENANT, TOPIC))
    return [int(s.summary[SUMMARY_INDEX]) for s in table.snapshots()]


def test_ingest_compaction_retention_and_switch_each_make_one_snapshot(setup) -> None:
    config, service, publisher = setup
    bucket = open_bucket(config.bucket)
    blocks = [write_records_block(bucket, TENANT, TOPIC, 0, i * 100, 100, T0 + i * HOUR // 2) for i in range(4)]
    for b in blocks:
        commit(service, [b])
    assert publisher.run_once() == 4
    everything = (0, T0 + 10 * HOUR)
    assert table_rows(publisher) == query_rows(service, bucket, TENANT, TOPIC, *everything)
    assert len(snapshots(publisher)) == 4

    merged = compact(service, bucket, blocks[:2])
    assert publisher.run_once() == 1
    assert table_rows(publisher) == query_rows(service, bucket, TENANT, TOPIC, *everything)
    table = publisher.catalog.load_table(identifier(TENANT, TOPIC))
    assert table.current_snapshot().summary.operation.value == "overwrite"
    assert sorted(f.file.file_path.split("/")[-2] for f in table.scan().plan_files()) == sorted(
        [merged.id, blocks[2].id, blocks[3].id])

    # A generation switch over the middle of block 3 (a straddling block: its rows are split).
    g2 = write_records_block(bucket, TENANT, TOPIC, 0, 0, 400, T0, step_ms=(2 * HOUR) // 400, generation=2)
    commit(service, [g2], generation=2)
    assert publisher.run_once() == 0  # generation 2 is active nowhere yet: nothing visible changed
    switch_start = T0 + HOUR + HOUR // 4
    service.submit(SetActiveGeneration(tenant=TENANT, topic=TOPIC, generation=2, start=switch_start,
                                       end=T0 + 10 * HOUR)).raise_for_rejection()
    assert publisher.run_once() == 1
    assert table_rows(publisher) == query_rows(service, bucket, TENANT, TOPIC, *everything)

    partitions = service.state.reader.partitions(TENANT)
    service.submit(TruncateIndex(prepared_term=1, cutoffs={TENANT: 2**62}, partitions=[
        PartitionKey(tenant=p.tenant, shard=p.shard, window_start=p.window_start) for p in partitions[:1]])
    ).raise_for_rejection()
    assert publisher.run_once() == 1
    assert table_rows(publisher) == query_rows(service, bucket, TENANT, TOPIC, *everything)
    assert snapshots(publisher) == sorted(snapshots(publisher))
    assert publisher.run_once() == 0


def test_a_restarted_publisher_publishes_nothing_twice(setup, tmp_path: Path) -> None:
    config, service, _ = setup
    bucket = open_bucket(config.bucket)
    for i in range(3):
        commit(service, [write_records_block(bucket, TENANT, TOPIC, 0, i * 10, 10, T0 + i * 1000)])
    # The first publisher dies after its Iceberg commits, before its trim: the feed still holds the entries.
    dying = IcebergPublisher(config, service.state.reader, lambda cmd: Result(ok=True), bucket)
    assert dying.run_once() == 3
    # Three commits, and the topic's first one also recorded generation 1 as the active one: four changes.
    assert service.state.reader.conn.execute("SELECT count(*) FROM block_changes").fetchone()[0] == 4
    fresh = IcebergPublisher(config, service.state.reader, service.submit, bucket)
    commit(service, [write_records_block(bucket, TENANT, TOPIC, 0, 30, 10, T0 + 5000)])
    assert fresh.run_once() == 1
    assert len(snapshots(fresh)) == 4
    assert table_rows(fresh) == query_rows(service, bucket, TENANT, TOPIC, 0, T0 + HOUR)


def test_a_copy_released_and_added_again_is_not_swept(setup) -> None:
    """Issue 26 case 6: switching A -> B -> A within the delete delay releases a copy and adds it again (the same
    rows make the same copy); once the delay passed, the sweep deleted it although the current snapshot held it."""
    config, service, _ = setup
    config = config.model_copy(update={"block": config.block.model_copy(update={"delete_delay": 60.0})})
    now = [time.time()]
    publisher = IcebergPublisher(config, service.state.reader, service.submit, open_bucket(config.bucket),
                                 clock=lambda: now[0])
    bucket = open_bucket(config.bucket)
    commit(service, [write_records_block(bucket, TENANT, TOPIC, 0, 0, 100, T0, step_ms=HOUR // 100)])
    commit(service, [write_records_block(bucket, TENANT, TOPIC, 0, 0, 100, T0, step_ms=HOUR // 100, generation=2)],
           generation=2)
    publisher.run_once()
    middle = T0 + HOUR // 2
    for generation in (2, 1, 2):  # generation 2 from the middle on, then back, then again
        service.submit(SetActiveGeneration(tenant=TENANT, topic=TOPIC, generation=generation, start=middle,
                                           end=T0 + 10 * HOUR)).raise_for_rejection()
        assert publisher.run_once() == 1
    assert [o.key for o in bucket.list(f"{TENANT}/iceberg-copies/")]  # the straddling blocks show through copies
    now[0] += 120  # the delete delay has passed for the snapshot that released them
    assert publisher.run_once() == 0
    assert table_rows(publisher) == query_rows(service, bucket, TENANT, TOPIC, 0, T0 + 10 * HOUR)  # all readable


def test_case9_an_upgrade_changes_the_table_only_when_the_new_generation_has_caught_up(setup) -> None:
    """Issue 39 case 9, in the Iceberg tables: generation 2 (``ingest.generation`` raised) ingesting beside
    generation 1 made the table show its first small commit from its first record's time on (100 rows of 400). The
    table now keeps generation 1's rows while generation 2 catches up, and turns to generation 2's in one snapshot at
    the commit that catches up."""
    config, service, publisher = setup
    bucket = open_bucket(config.bucket)
    for i in range(4):
        commit(service, [write_records_block(bucket, TENANT, TOPIC, 0, i * 100, 100, T0 + i * HOUR // 2)])
    assert publisher.run_once() == 4
    everything = (0, T0 + 10 * HOUR)
    before = table_rows(publisher)
    assert sum(before.values()) == 400

    def upgrade(i: int) -> Result:
        block = write_records_block(bucket, TENANT, TOPIC, 0, i * 100, 100, T0 + i * HOUR // 2, generation=2)
        return service.submit(CommitIngestBatch(
            group="partition", generation=2, writer="ingest", blocks=[block],
            ranges=[OffsetRange(topic=TOPIC, partition=0, start=i * 100, end=i * 100 + 100)])).raise_for_rejection()

    for i in range(3):
        upgrade(i)
        assert publisher.run_once() == 0  # nothing visible changed
        assert table_rows(publisher) == before == query_rows(service, bucket, TENANT, TOPIC, *everything)
    assert upgrade(3).data["switches"] == {TENANT: [[TOPIC, 0, 2**62, 2]]}
    assert publisher.run_once() == 1
    after = table_rows(publisher)
    assert after == query_rows(service, bucket, TENANT, TOPIC, *everything)
    assert sum(after.values()) == 400
    assert all("-g2-" in str(row) for row in after)


def test_a_table_created_before_the_metrics_properties_gets_them_with_its_next_snapshot(setup) -> None:
    """Manifests keep no bounds of a record's contents (an erased key would stay in them): a table of an earlier
    release, which kept every column's bounds, gets the properties with its next snapshot, and the files registered
    from then on keep bounds of the columns engines prune by only."""
    from shale.iceberg.catalog import METRICS_PROPERTIES

    config, service, publisher = setup
    bucket = open_bucket(config.bucket)
    commit(service, [write_records_block(bucket, TENANT, TOPIC, 0, 0, 10, T0)])
    assert publisher.run_once() == 1
    table = publisher.catalog.load_table(identifier(TENANT, TOPIC))
    with table.transaction() as tx:  # as an earlier release created it
        tx.remove_properties(*METRICS_PROPERTIES)
    fresh = publisher_setup(Path(config.bucket.url.removeprefix("file://")).parent)[2]  # a new process: no cache
    commit(service, [write_records_block(bucket, TENANT, TOPIC, 0, 10, 10, T0 + 1000)])
    assert fresh.run_once() == 1
    table = publisher.catalog.load_table(identifier(TENANT, TOPIC))
    assert {k: table.properties.get(k) for k in METRICS_PROPERTIES} == METRICS_PROPERTIES
    newest = max(table.scan().plan_files(), key=lambda t: t.file.file_path.split("/")[-2]).file
    names = {f.field_id: f.name for f in table.schema().fields}
    assert {names[i] for i in newest.upper_bounds} <= {"topic", "partition", "offset", "timestamp",
                                                        "timestamp_type", "event_time", "dt", "hour"}
    assert "offset" in {names[i] for i in newest.upper_bounds}
