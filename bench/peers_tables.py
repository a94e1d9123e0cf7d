"""The peer benchmark's correctness check through Spark SQL: both systems' tables read as Iceberg tables by Apache
Iceberg's own Spark runtime (``iceberg-spark-runtime-4.1_2.13``, ``iceberg-aws-bundle`` for S3FileIO at MinIO and
the SQLite JDBC driver: ``shale.dev.fetch.iceberg_jars()``), each through a ``SparkCatalog`` with Iceberg's
``JdbcCatalog`` on the SQLite file its writer used.

* Shale's table: the one its metastore leader publishes (``[iceberg] enabled``, docs/DESIGN.md section 16), through
  ``shale.iceberg.spark_catalog_conf``, as the integration tests read it.
* The sink's table: the JDBC catalog the Connect worker wrote (its schema version left to Iceberg to detect).

Iceberg's ``JdbcCatalog`` keys every table by its catalog's name, so each Spark catalog has the name its writer
used (``shale``; the sink's ``iceberg``), and each table is read in its own session (``newSession()``: its own
catalogs and runtime conf, the same SparkContext).

Each table is checked against the topic in Spark SQL, not by collecting it: rows, records missing, duplicate rows
(rows beyond the first of one (partition, offset)), rows of offsets the topic does not hold, and rows whose ``msg``
is not the one the topic holds at that (partition, offset). Catalog settings (credentials included) go to the
session at run time as Spark conf, never on a command line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shale.config import BucketConfig, SparkConfig
from shale.dev.fetch import iceberg_jars
from shale.spark import spark_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass
class TableRef:
    """One table to check: its Spark catalog's conf, its name in SQL and its partition, offset and message
    columns."""

    conf: dict[str, str]
    table: str
    partition: str
    offset: str
    msg: str = "msg"


def sink_catalog_conf(name: str, catalog_db: Path, warehouse: str, bucket: BucketConfig) -> dict[str, str]:
    """A ``SparkCatalog`` over the Connect worker's JDBC catalog and S3FileIO at the bucket's endpoint."""
    prefix = f"spark.sql.catalog.{name}"
    conf = {prefix: "org.apache.iceberg.spark.SparkCatalog",
            f"{prefix}.catalog-impl": "org.apache.iceberg.jdbc.JdbcCatalog",
            f"{prefix}.uri": f"jdbc:sqlite:{catalog_db}", f"{prefix}.warehouse": warehouse,
            f"{prefix}.cache-enabled": "false",
            f"{prefix}.io-impl": "org.apache.iceberg.aws.s3.S3FileIO",
            f"{prefix}.client.region": bucket.region, f"{prefix}.s3.path-style-access": "true"}
    if bucket.endpoint:
        conf[f"{prefix}.s3.endpoint"] = bucket.endpoint
    if bucket.access_key_id:
        conf[f"{prefix}.s3.access-key-id"] = bucket.access_key_id
        conf[f"{prefix}.s3.secret-access-key"] = bucket.secret_access_key.get_secret_value()
    return conf


def open_spark() -> SparkSession:
    """A local Spark session (``local[2]``) with Iceberg's runtime; catalogs are added per table."""
    jars = ",".join(str(p) for p in iceberg_jars())
    return spark_session("shale-bench-peers-check", SparkConfig(master="local[2]"), kafka=False,
                         extra_conf={"spark.jars": jars})


def check_sql(ref: TableRef, ends: dict[int, int], expected_msg: str) -> str:
    """One aggregate query over the table; ``expected_msg`` is a SQL expression of ``p`` and ``o``."""
    end = "CASE p " + " ".join(f"WHEN {p} THEN {e}" for p, e in sorted(ends.items())) + " ELSE 0 END"
    return (f"WITH t AS (SELECT CAST({ref.partition} AS BIGINT) AS p, CAST({ref.offset} AS BIGINT) AS o, "
            f"{ref.msg} AS msg FROM {ref.table}), "
            f"k AS (SELECT *, o >= 0 AND o < {end} AS known FROM t) "
            "SELECT count(*) AS rows, count(DISTINCT p, o) AS pairs, "
            "count(DISTINCT CASE WHEN known THEN struct(p, o) END) AS known_pairs, "
            f"sum(CASE WHEN known AND msg IS DISTINCT FROM ({expected_msg}) THEN 1 ELSE 0 END) AS mismatched "
            "FROM k")


def check_table(spark: SparkSession, ref: TableRef, ends: dict[int, int], expected_msg: str) -> dict[str, int]:
    """Rows, missing, duplicates, unexpected and mismatched rows of the table against the topic."""
    session = spark.newSession()
    for key, value in ref.conf.items():
        session.conf.set(key, value)
    row = session.sql(check_sql(ref, ends, expected_msg)).collect()[0]
    rows, pairs, known = int(row["rows"]), int(row["pairs"]), int(row["known_pairs"])
    return {"rows": rows, "missing": sum(ends.values()) - known, "duplicates": rows - pairs,
            "unexpected": pairs - known, "mismatched": int(row["mismatched"] or 0)}


def check_tables(refs: dict[str, TableRef], ends: dict[str, dict[int, int]],
                 expected_msg: str) -> dict[str, Any]:
    """Every table of ``refs`` (by key) against its topic's end offsets (same keys), in one Spark session; a table
    Spark cannot read is reported as an error, not hidden."""
    spark = open_spark()
    out: dict[str, Any] = {}
    try:
        for key, ref in refs.items():
            try:
                out[key] = check_table(spark, ref, ends[key], expected_msg)
            except Exception as exc:  # reported with the figures: the other tables still count
                out[key] = {"error": f"{type(exc).__name__}: {str(exc)[:400]}"}
    finally:
        spark.stop()
    return out
