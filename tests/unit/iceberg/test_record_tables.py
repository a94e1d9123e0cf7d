"""A topic of several record types (subject_name_strategy record): one Iceberg table per (tenant, topic, record),
named ``<topic>__<record with '.' as '_'>``, each holding only its type's rows and columns, through ingest,
compaction, a generation switch and a publisher restarted on the same catalog."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.iceberg_helpers import IDS, KINDS, T0, commit, publisher_setup, record_type_blocks, write_records_block

from shale.compactor.merge import merge_blocks
from shale.config import ShaleConfig
from shale.iceberg import IcebergPublisher
from shale.iceberg.catalog import identifier
from shale.iceberg.plan import TableKey
from shale.metastore import MetastoreService, ReplaceBlocks, SetActiveGeneration, StateMachine
from shale.objstore import Bucket


@pytest.fixture
def setup(tmp_path: Path) -> tuple[ShaleConfig, MetastoreService, IcebergPublisher, Bucket]:
    return publisher_setup(tmp_path)


def _ids_in(publisher: IcebergPublisher, record: str) -> list[int]:
    table = publisher.catalog.load_table(identifier("default", "shop", record))
    return sorted(table.scan().to_arrow().column("id").to_pylist())


def _want(shift: int = 0) -> dict[str, list[int]]:
    return {k: [n + shift for n, kind in enumerate(KINDS) if kind == k] for k in IDS}


def test_each_record_type_is_its_own_table_through_compaction_a_switch_and_a_restart(setup, tmp_path) -> None:
    config, service, publisher, bucket = setup
    first, second = record_type_blocks(config, bucket, 0, 3), record_type_blocks(config, bucket, 3, 6)
    commit(service, first)
    commit(service, second)
    publisher.run_once()
    assert identifier("default", "shop", "shop.Order") == ("default", "shop__shop_Order")
    assert sorted(publisher.catalog.list_tables("default")) == [("default", "shop__shop_Order"),
                                                                ("default", "shop__shop_Refund")]
    assert {k: _ids_in(publisher, k) for k in IDS} == _want()
    order = publisher.catalog.load_table(identifier("default", "shop", "shop.Order")).schema()
    assert "amount" in {f.name for f in order.fields}
    assert "why" not in {f.name for f in order.fields}

    merged = merge_blocks(bucket, [*first, *second], job="j", token=1, level=0).output
    assert sorted(d.record or "" for d in merged.datasets) == sorted(IDS)
    service.submit(ReplaceBlocks(tenant="default", sources=[m.id for m in [*first, *second]], blocks=[merged])
                   ).raise_for_rejection()
    publisher.run_once()
    assert {k: _ids_in(publisher, k) for k in IDS} == _want()

    commit(service, record_type_blocks(config, bucket, 0, 6, generation=2, shift=100), generation=2)
    service.submit(SetActiveGeneration(tenant="default", topic="shop", generation=2, start=0, end=2**62)
                   ).raise_for_rejection()
    publisher.run_once()
    assert {k: _ids_in(publisher, k) for k in IDS} == _want(100)  # the switch reached every type's table

    state = StateMachine(tmp_path / "ms" / "state.db")
    restarted = IcebergPublisher(config, state.reader, service.submit, bucket)
    # what a publisher that lost the blocks' metadata reads the catalog's tables as: by their properties
    assert sorted(restarted._catalog_tables("default")) == [TableKey("default", "shop", k) for k in sorted(IDS)]
    report = restarted.sync(full=True)
    assert report["repaired"] == 0
    assert report["tables"] == 2  # found by what their properties say they hold, never as a topic of that name
    assert {k: _ids_in(restarted, k) for k in IDS} == _want(100)


@pytest.mark.parametrize("plain_first", [False, True])
def test_a_topic_named_like_a_record_type_s_table_is_never_mixed_into_it(setup, plain_first: bool) -> None:
    """Topic ``shop`` with record ``shop.Order`` and a topic literally named ``shop__shop_Order`` want the same
    table: whichever comes second is not published (logged, counted, in the status), and the first table keeps
    exactly its own rows, whichever order they come in."""
    _, service, publisher, bucket = setup
    typed = record_type_blocks(setup[0], bucket, 0, 6)
    plain = [write_records_block(bucket, "default", "shop__shop_Order", 0, 0, 4, T0)]
    for blocks in ([plain, typed] if plain_first else [typed, plain]):
        commit(service, blocks)
        publisher.run_once()
    table = publisher.catalog.load_table(("default", "shop__shop_Order"))
    offsets = sorted(table.scan().to_arrow().column("offset").to_pylist())
    if plain_first:
        assert offsets == [0, 1, 2, 3]  # the plain topic's four records, no order among them
        assert TableKey("default", "shop", "shop.Order") in publisher.conflicts
    else:
        assert _ids_in(publisher, "shop.Order") == _want()["shop.Order"]
        assert TableKey("default", "shop__shop_Order") in publisher.conflicts
    assert _ids_in(publisher, "shop.Refund") == _want()["shop.Refund"]  # the other type's table is unaffected
    [conflict] = publisher.status()["table_name_conflicts"]
    assert "shop__shop_Order" in conflict
    assert "not published" in conflict
    publisher.run_once()  # again: still refused, still once
    assert len(publisher.status()["table_name_conflicts"]) == 1
