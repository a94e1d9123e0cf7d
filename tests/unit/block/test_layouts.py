"""Blocks of both layouts side by side: each group under its own prefix (written now) and ``<tenant>/blocks/``
(written before): found, read, verified, compacted into the new layout, cleaned and recovered alike."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.factories import BASE_MS, Clock, backup_table, write_backup_block

from shale.block import (
    BlockFetcher,
    BlockSpec,
    BlockState,
    Cleaner,
    DatasetInput,
    KafkaRange,
    MetastoreView,
    Place,
    block_file_key,
    block_prefix,
    deterministic_block_id,
    meta_key,
    read_dataset,
    write_block,
    write_deletion_mark,
)
from shale.block.layout import (
    LAYOUT,
    LEGACY_LAYOUT,
    NO_DAY,
    parse_block_key,
    tenant_group_prefix,
)
from shale.block.verify import verify_tenant
from shale.compactor.merge import merge_blocks
from shale.objstore import ObstoreBucket, open_bucket_url

DELETE = 120.0


@pytest.fixture
def bucket() -> ObstoreBucket:
    return open_bucket_url(f"memory://layouts-{uuid.uuid4().hex}")


def _partition_block(bucket: ObstoreBucket, start: int, pv: dict[str, str], layout: int = LAYOUT):
    table = backup_table("app", 0, start, 10)
    table = table.append_column("event_time", table.column("timestamp"))
    spec = BlockSpec(id=deterministic_block_id(BASE_MS, f"p/{start}/{pv}"), tenant="acme", group="partition",
                     kafka=[KafkaRange(topic="app", partition=0, start=start, end=start + 10)],
                     partition_values=pv, layout=layout)
    return write_block(bucket, spec, [DatasetInput("records", "app", table, "event_time", labels=[{"topic": "app"}])])


def test_each_group_has_its_prefix_and_a_partition_block_its_day(bucket: ObstoreBucket) -> None:
    backup = write_backup_block(bucket, "acme", "app", 0, 0, 10)
    day = _partition_block(bucket, 0, {"dt": "2026-11-27", "hour": "13"})
    days = _partition_block(bucket, 10, {})  # compacted across days: no single day
    assert meta_key(backup).startswith(tenant_group_prefix("acme", "backup"))
    assert meta_key(day) == f"group=partition/tenant=acme/dt=2026-11-27/{day.id}/meta.json"
    assert meta_key(days) == f"group=partition/tenant=acme/dt={NO_DAY}/{days.id}/meta.json"
    assert {b.layout for b in (backup, day, days)} == {LAYOUT}
    assert not list(bucket.list("acme/"))  # nothing of a block under the tenant's own folder
    assert BlockFetcher(bucket, 0).tenants() == ["acme"]


def test_blocks_written_before_are_found_read_verified_cleaned_and_compacted_into_the_new_layout(
        bucket: ObstoreBucket) -> None:
    old = [write_backup_block(bucket, "acme", "app", 0, start, 10, layout=LEGACY_LAYOUT) for start in (0, 10)]
    new = write_backup_block(bucket, "acme", "app", 0, 20, 10)
    assert all(meta_key(m) == f"acme/blocks/{m.id}/meta.json" for m in old)
    result = BlockFetcher(bucket, 0).sync("acme")
    assert {v.id: v.state for v in result.blocks.values()} == {m.id: BlockState.HEALTHY for m in (*old, new)}
    assert [read_dataset(bucket, m, "records/app").num_rows for m in (*old, new)] == [10, 10, 10]
    assert verify_tenant(bucket, BlockFetcher(bucket, 0).sync("acme")).ok

    merged = merge_blocks(bucket, [*old, new], job="j", token=1, level=0).output
    assert merged.layout == LAYOUT
    assert meta_key(merged).startswith(tenant_group_prefix("acme", "backup"))
    assert sorted(read_dataset(bucket, merged, "records/app").column("offset").to_pylist()) == list(range(30))

    clock = Clock()
    for meta in (*old, new):
        write_deletion_mark(bucket, "acme", meta.id, clock(), "compacted")
    clock.advance(DELETE)
    Cleaner(bucket, BlockFetcher(bucket, 0, clock=clock), DELETE, clock=clock).run("acme")
    left = {p.block_id for i in bucket.list("") if (p := parse_block_key(i.key)) is not None}
    assert left == {merged.id}
    assert not list(bucket.list("acme/blocks/"))


def test_a_meta_json_that_places_its_block_elsewhere_is_not_trusted(bucket: ObstoreBucket) -> None:
    meta = write_backup_block(bucket, "acme", "app", 0, 0, 10)
    moved = Place("acme", meta.id, layout=LEGACY_LAYOUT)
    for info in list(bucket.list(block_prefix(meta))):  # copied under <tenant>/blocks/ without being rewritten
        bucket.put(block_prefix(moved) + info.key.rsplit("/", 1)[1], bucket.get(info.key))
        bucket.delete(info.key)
    (view,) = BlockFetcher(bucket, 0).sync("acme").blocks.values()
    assert view.state is BlockState.PARTIAL
    assert view.error is not None
    assert "places it at" in view.error


def test_a_lost_meta_json_is_recovered_where_its_objects_are_in_either_layout(bucket: ObstoreBucket) -> None:
    metas = [write_backup_block(bucket, "acme", "app", 0, 0, 10, layout=LEGACY_LAYOUT),
             _partition_block(bucket, 10, {"dt": "2026-11-27"})]
    for meta in metas:
        bucket.delete(meta_key(meta))
    clock = Clock()
    report = Cleaner(bucket, BlockFetcher(bucket, 0, clock=clock), DELETE, clock=clock).run(
        "acme", metastore=lambda: MetastoreView(frozenset(m.id for m in metas)))
    assert sorted(report.recovered) == sorted(m.id for m in metas)
    assert all(bucket.head(meta_key(m)) for m in metas)


@given(st.sampled_from(["backup", "partition"]), st.sampled_from([LAYOUT, LEGACY_LAYOUT]),
       st.one_of(st.none(), st.dates().map(lambda d: d.isoformat()), st.text(max_size=12)),
       st.sampled_from(["acme", "team-7", "a_b", "0"]), st.sampled_from(["records-0.parquet", "quarantine-3.parquet"]))
def test_every_key_parses_back_to_its_block(group: str, layout: int, day: str | None, tenant: str,
                                            name: str) -> None:
    place = Place(tenant, deterministic_block_id(BASE_MS, f"{group}{day}"), group,
                  {} if day is None else {"dt": day}, layout)
    key = block_file_key(place, name)
    parsed = parse_block_key(key)
    assert parsed is not None
    assert (parsed.tenant, parsed.block_id, parsed.name, parsed.prefix) == (tenant, place.id, name,
                                                                            block_prefix(place))
    assert parse_block_key(meta_key(place)) is not None
    if layout == LAYOUT and group == "partition" and day is not None and day[:4].isdigit() and len(day) == 10:
        assert f"/dt={day}/" in key


def test_a_table_in_the_new_layout_reads_like_one_in_the_old(bucket: ObstoreBucket) -> None:
    old = write_backup_block(bucket, "acme", "app", 0, 0, 10, layout=LEGACY_LAYOUT)
    new = write_backup_block(bucket, "beta", "app", 0, 0, 10)
    tables = [read_dataset(bucket, m, "records/app") for m in (old, new)]
    assert tables[0].equals(tables[1])
