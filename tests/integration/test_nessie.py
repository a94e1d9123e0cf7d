"""Shale publishing through a production Iceberg REST catalog server: Project Nessie 0.99.0 (shale.dev.nessie: its
Iceberg REST API, a RocksDB version store, its warehouse on MinIO, authentication off). A typed topic and a topic of
several record types, published, then read back through Nessie by pyiceberg (a Polars scan): every answer equals
``shale query``'s over the same blocks. Apache Polaris and Lakekeeper are not tested: neither can be fetched here
(src/shale/dev/fetch.py says why)."""

from __future__ import annotations

import json
import urllib.request
import uuid

import pytest
from tests.iceberg_questions import ORDERS, RECORDS, SHOP, TYPED, World, polars_answers, shale_answers

from shale.config import BucketConfig, ShaleConfig
from shale.dev import MinioServer
from shale.dev.nessie import NessieServer
from shale.iceberg import open_catalog
from shale.iceberg.catalog import SUMMARY_INDEX


@pytest.fixture(scope="module")
def world(minio: MinioServer, nessie: NessieServer, tmp_path_factory: pytest.TempPathFactory) -> World:
    name = f"nessie-{uuid.uuid4().hex[:10]}"
    minio.create_bucket(name)
    bucket = BucketConfig(url=f"s3://{name}", endpoint=minio.endpoint, access_key_id=minio.access_key,
                          secret_access_key=minio.secret_key, allow_http=True)
    work = tmp_path_factory.mktemp("nessie")
    # What a user writes for Nessie (docs/DEPLOY.md), less the token its OIDC would want in production.
    config = ShaleConfig.model_validate({
        "bucket": bucket.model_dump(), "metastore": {"data_dir": str(work / "metastore")},
        "iceberg": {"enabled": True, "catalog": "rest", "catalog_uri": nessie.iceberg_uri, "warehouse": "warehouse"}})
    return World(config, work)


def test_tables_published_through_nessie_read_back_as_shale_query_answers(world: World, nessie: NessieServer) -> None:
    w = world
    w.version_1()
    w.publisher.sync()
    expected = shale_answers(w, evolved=False)
    assert expected["count"] == 6
    assert expected["amount_by_level"] == {"error": "7.50", "info": "3.50", "warn": "5.50"}
    assert len(expected["refunds"]) == 2
    assert polars_answers(w.config, evolved=False) == expected

    catalog = open_catalog(w.config)
    table = catalog.load_table((TYPED, ORDERS))
    assert table.metadata_location.startswith("s3://nessie/warehouse/")  # Nessie wrote it, in its warehouse
    assert table.properties["gc.enabled"] == "false"
    assert int(table.current_snapshot().summary.additional_properties[SUMMARY_INDEX]) > 0
    assert sorted(catalog.list_tables(RECORDS)) == [(RECORDS, f"{SHOP}__shop_Order"), (RECORDS, f"{SHOP}__shop_Refund")]
    with urllib.request.urlopen(f"{nessie.url}/api/v2/trees/main/entries") as response:
        entries = {".".join(e["name"]["elements"]) for e in json.loads(response.read())["entries"]}
    assert {f"{TYPED}.{ORDERS}", f"{RECORDS}.{SHOP}__shop_Refund"} <= entries
    # Nessie serves a table's current snapshot only: its history is Nessie's commit log, one commit per change
    # (Apache Iceberg's server shows this table's two changes as two snapshots; docs/design/iceberg.md 16.1).
    assert len(table.snapshots()) == 1
    with urllib.request.urlopen(f"{nessie.url}/api/v2/trees/main/history") as response:
        log = json.loads(response.read())["logEntries"]
    messages = [e["commitMeta"]["message"] for e in log]
    assert messages.count(f"Update ICEBERG_TABLE {TYPED}.{ORDERS}") >= 2  # its two appends, at least
