"""docs/READING.md's Trino steps run as written (the quickstart test's way): its catalog file
(``etc/catalog/shale.properties``) and its queries are taken from the document, and only its example hosts are
replaced, by this test's REST catalog (Apache Iceberg's server, an OAuth2 client credential) and MinIO; the secrets
go in the environment variables the file names. Trino 476 then answers each query as ``shale query`` does over the
same blocks: a decimal summed per level of tenant acme's topic orders, and a record type's table, whose name has
capitals. A step of the guide that changes or stops working breaks this test, not a reader's afternoon."""

from __future__ import annotations

import decimal
import re
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.iceberg_helpers import commit, record_type_blocks, typed_block, v1_columns
from tests.iceberg_questions import CREDENTIAL, END, RECORDS, SHOP, World, rest_config, with_level

from shale.config import BucketConfig
from shale.dev import MinioServer
from shale.dev.iceberg_rest import IcebergRestCatalog
from shale.dev.trino import TrinoServer
from shale.query import Query, run_query

ROOT = Path(__file__).resolve().parents[2]
READING = ROOT / "docs" / "READING.md"
CATALOG_HOST = "https://catalog.example.com/api/catalog"
S3_HOST = "https://s3.example.com"


def trino_section() -> str:
    text = READING.read_text()
    start = text.index("\n### Trino\n")
    return text[start:text.index("\n### ", start + 1)]


def catalog_file() -> str:
    (block,) = re.findall(r"^```properties\n(.*?)^```", trino_section(), re.DOTALL | re.MULTILINE)
    return str(block)


def queries() -> list[str]:
    """The guide's SQL statements, each without its comment and its semicolon (Trino's protocol takes one bare
    statement)."""
    (block,) = re.findall(r"^```sql\n(.*?)^```", trino_section(), re.DOTALL | re.MULTILINE)
    lines = [line.split("--", 1)[0].rstrip() for line in block.splitlines()]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


@pytest.fixture(scope="module")
def catalog(minio: MinioServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[IcebergRestCatalog]:
    """A REST catalog of this test's own: the guide's table names (acme.orders, default.shop__shop_Refund) are
    nobody else's in it."""
    name = f"reading-{uuid.uuid4().hex[:8]}"
    minio.create_bucket(name)
    server = IcebergRestCatalog(tmp_path_factory.mktemp("reading-catalog"), f"s3://{name}/warehouse",
                                minio.endpoint, minio.access_key, minio.secret_key).start()
    yield server
    server.stop()


def test_the_guide_has_a_catalog_file_and_queries_for_trino() -> None:
    properties = catalog_file()
    assert "connector.name=iceberg" in properties
    assert CATALOG_HOST in properties
    assert S3_HOST in properties
    assert len(queries()) == 2


def test_trino_configured_as_the_guide_says_answers_as_shale_query(
        minio: MinioServer, catalog: IcebergRestCatalog, tmp_path: Path) -> None:
    name = f"reading-{uuid.uuid4().hex[:8]}"
    minio.create_bucket(name)
    bucket = BucketConfig(url=f"s3://{name}", endpoint=minio.endpoint, access_key_id=minio.access_key,
                          secret_access_key=minio.secret_key, allow_http=True)
    w = World(rest_config(bucket, catalog.url, tmp_path), tmp_path)
    for start in (0, 3):
        commit(w.service, [typed_block(w.bucket, "acme", "orders", start, 3, with_level(v1_columns(start, 3), start))])
    commit(w.service, record_type_blocks(w.config, w.bucket, 0, 6))
    w.publisher.sync()

    def query(tenant: str, selector: str) -> list[dict[str, object]]:
        return list(run_query(Query(tenant, 0, END, selector), w.service, w.bucket).read_all().to_pylist())

    sums: dict[str, decimal.Decimal] = defaultdict(decimal.Decimal)
    for row in query("acme", '{topic="orders"}'):
        sums[str(row["level"])] += decimal.Decimal(str(row["amount"]))
    refunds = sorted([r["id"], r["why"]] for r in query(RECORDS, f'{{topic="{SHOP}", record="shop.Refund"}}'))
    assert len(sums) == 3
    assert len(refunds) == 2

    properties = catalog_file().replace(CATALOG_HOST, catalog.url).replace(S3_HOST, minio.endpoint)
    secrets = {"SHALE_CATALOG_CREDENTIAL": CREDENTIAL, "SHALE_S3_ACCESS_KEY": minio.access_key,
               "SHALE_S3_SECRET_KEY": minio.secret_key}
    assert set(re.findall(r"\$\{ENV:(\w+)\}", properties)) == set(secrets)
    trino = TrinoServer(tmp_path / "trino", properties, secrets).start()
    try:
        by_level, refund_rows = (trino.query(sql)[1] for sql in queries())
    finally:
        trino.stop()
    assert {level: decimal.Decimal(total) for level, total in by_level} == sums
    assert sorted(refund_rows) == refunds
