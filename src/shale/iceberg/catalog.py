"""The Iceberg catalog Shale publishes into (a SQLite catalog or a REST catalog service), and how engines reach it.

pyiceberg's ``SqlCatalog`` keeps tables in two SQL tables (``iceberg_tables``, ``iceberg_namespace_properties``)
with the same names and columns as Iceberg's Java ``JdbcCatalog`` (schema version V1, which has the
``iceberg_type`` column), so Spark, Trino or Flink configured with a JDBC catalog on the same database and catalog
name see the same tables. pyiceberg creates the two tables when they are absent; engines are configured with
``jdbc.schema-version=V1`` (``spark_catalog_conf``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from shale.config import BucketConfig, ShaleConfig
from shale.errors import ConfigError
from shale.failpoints import failpoint
from shale.objstore import local_path

SUMMARY_INDEX = "shale.applied-index"
"""Snapshot summary key: the metastore log index whose change this snapshot publishes."""
SUMMARY_RELEASED = "shale.released-copies"
"""Snapshot summary key: copies this snapshot stopped referencing (JSON list of bucket keys), deleted later."""
SUMMARY_ERASURES = "shale.erasures"
"""Snapshot summary key: the erasures this snapshot publishes (JSON list of ids; DESIGN 19.6)."""
SUMMARY_EXPIRES = "shale.erasure-expires"
"""Snapshot summary key: the snapshots expired because they name a file holding an erased record (JSON list)."""
SUMMARY_DELETE_DELAY = "shale.erasure-delete-delay-ms"
"""Snapshot summary key: the shortest delete delay its erasures asked for (ms): the copies it released go then."""
TABLE_PROPERTIES = {
    # Shale owns the data files: Iceberg must never delete them (docs/DESIGN.md 16.5).
    "gc.enabled": "false",
    # Old metadata.json files are Iceberg's own, and would otherwise pile up at one per snapshot.
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "50",
    # Appends merge small manifests, so a table of many snapshots plans from few manifests.
    "commit.manifest-merge.enabled": "true",
    "shale.owner": "shale",
}
METRICS_PROPERTIES = {
    # Manifests keep no bounds of a record's contents (key, value, headers, the parser's columns): a bound is a
    # value's first 16 bytes, and a data file's entry (its DELETED entry too, in the snapshot that removes it)
    # would keep an erased key or value in metadata no erasure rewrites. Counts only, except for the columns
    # engines prune by, which hold no content (docs/design/erasure.md 19.6).
    "write.metadata.metrics.default": "counts",
    **{f"write.metadata.metrics.column.{c}": "full"
       for c in ("topic", "partition", "offset", "timestamp", "timestamp_type", "event_time", "dt", "hour")},
}
TABLE_PROPERTIES.update(METRICS_PROPERTIES)
TABLE_OWNER = "shale.owner"
"""The property marking a table Shale created: a table without it is never written."""
FAILPOINT_BEFORE_CATALOG_COMMIT = "iceberg.before-catalog-commit"


def warehouse(config: ShaleConfig) -> str:
    return config.iceberg.warehouse or f"{object_uri(config.bucket, '')}_shale/iceberg"


def object_uri(bucket: BucketConfig, key: str) -> str:
    """The URI engines read an object by: ``s3://bucket/prefix/key``, or ``file:///abs/path/key``."""
    scheme = urlparse(bucket.url).scheme
    if scheme == "file":
        return f"file://{local_path(bucket.url)}/{key}"
    if scheme in ("s3", "gs"):
        return f"{bucket.url.rstrip('/')}/{key}"
    raise ConfigError(f"Iceberg tables need an s3://, gs:// or file:// bucket; bucket.url is {bucket.url}")


def io_properties(bucket: BucketConfig) -> dict[str, str]:
    """pyiceberg FileIO properties for the bucket (the same credentials Shale uses)."""
    props: dict[str, str] = {}
    if urlparse(bucket.url).scheme == "s3":
        props["s3.region"] = bucket.region
        if bucket.endpoint:
            props["s3.endpoint"] = bucket.endpoint
        if bucket.access_key_id:
            props["s3.access-key-id"] = bucket.access_key_id
            props["s3.secret-access-key"] = bucket.secret_access_key.get_secret_value()
    return props


def rest_properties(config: ShaleConfig) -> dict[str, str]:
    """pyiceberg ``RestCatalog`` properties: the URI, the warehouse when one is set, the credential or token, the
    bucket's FileIO properties (pyiceberg writes manifests itself), then ``iceberg.rest_options``."""
    iceberg = config.iceberg
    props = {"uri": iceberg.catalog_uri, **io_properties(config.bucket)}
    if iceberg.warehouse:
        props["warehouse"] = iceberg.warehouse
    if iceberg.credential.get_secret_value():
        props["credential"] = iceberg.credential.get_secret_value()
    if iceberg.token.get_secret_value():
        props["token"] = iceberg.token.get_secret_value()
    if iceberg.oauth2_server_uri:
        props["oauth2-server-uri"] = iceberg.oauth2_server_uri
    if iceberg.scope:
        props["scope"] = iceberg.scope
    return {**props, **iceberg.rest_options}


def open_catalog(config: ShaleConfig) -> Any:
    """The catalog: pyiceberg's ``RestCatalog`` (``iceberg.catalog = "rest"``) or ``SqlCatalog``, whose tables are
    created if absent (a SQLite file's folder too)."""
    if config.iceberg.catalog == "rest":
        return _rest_catalog(config)
    from pyiceberg.catalog.sql import SqlCatalog

    class ShaleSqlCatalog(SqlCatalog):
        """pyiceberg's SQL catalog with one failpoint: after the new metadata.json is written, before the catalog
        row points to it (the moment a crash leaves an unreferenced metadata file behind)."""

        @staticmethod
        def _write_metadata(metadata: Any, io: Any, metadata_path: str) -> None:
            SqlCatalog._write_metadata(metadata, io, metadata_path)
            failpoint(FAILPOINT_BEFORE_CATALOG_COMMIT)

    uri = config.iceberg.catalog_uri
    if uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).expanduser().resolve().parent.mkdir(parents=True, exist_ok=True)
    return ShaleSqlCatalog(config.iceberg.catalog_name, uri=uri, warehouse=warehouse(config),
                           **io_properties(config.bucket))


def _rest_catalog(config: ShaleConfig) -> Any:
    from pyiceberg.catalog.rest import RestCatalog
    from pyiceberg.table.update import AddSchemaUpdate

    class ShaleRestCatalog(RestCatalog):
        """pyiceberg's REST catalog with the failpoint before the commit request (the catalog writes the metadata),
        and each ``add-schema`` update sent with its ``last-column-id``. The REST specification made that field
        optional (deprecated) and pyiceberg 0.12 no longer sends it, but Project Nessie (0.99.0 and later; its
        issue 11341) refuses an update without it: HTTP 400, "Cannot build AddSchema, some of required attributes
        are not set [lastColumnId]". The value sent is the table's, never lower (a dropped column's id stays used).
        Not thread-safe, as the publisher that commits is not: the session's ``post`` is wrapped for one call."""

        def commit_table(self, table: Any, requirements: Any, updates: Any) -> Any:
            failpoint(FAILPOINT_BEFORE_CATALOG_COMMIT)
            added = [u for u in updates if isinstance(u, AddSchemaUpdate)]
            if not added:
                return super().commit_table(table, requirements, updates)
            last = max([table.metadata.last_column_id, *(u.schema_.highest_field_id for u in added)])
            post = self._session.post

            def post_with_last_column_id(url: str, data: bytes, **kwargs: Any) -> Any:
                body = json.loads(data)
                for update in body.get("updates", []):
                    if update.get("action") == "add-schema":
                        update.setdefault("last-column-id", last)
                return post(url, data=json.dumps(body).encode(), **kwargs)

            self._session.post = post_with_last_column_id  # type: ignore[method-assign,assignment]
            try:
                return super().commit_table(table, requirements, updates)
            finally:
                del self._session.post  # the session's own method again

    return ShaleRestCatalog(config.iceberg.catalog_name, **rest_properties(config))


def _jdbc_url(uri: str) -> str:
    """The SQLite catalog's SQLAlchemy URL as a JDBC URL."""
    if not uri.startswith("sqlite:///"):
        raise ConfigError(f"iceberg.catalog_uri {uri!r}: the sql catalog is a SQLite file, sqlite:///PATH")
    return f"jdbc:sqlite:{Path(uri.removeprefix('sqlite:///')).expanduser().resolve()}"


def spark_catalog_conf(config: ShaleConfig, name: str | None = None) -> dict[str, str]:
    """Spark configuration of Iceberg's own ``SparkCatalog`` over the same catalog (JDBC, or REST with the same
    credential) and bucket (S3FileIO),
    credentials included: pass it as Spark conf (``SparkSession.builder.config``), never on a command line. The
    jars are ``shale.dev.fetch.iceberg_jars()``. Every key is a runtime setting (``spark.conf.set`` on a running
    session works too). Spark's default redaction misses the catalog's credential and headers: build the session
    with ``spark.redaction.regex`` set to ``shale.config.spark_redaction_regex()`` (a static setting, so it is not
    among these keys: a running session refuses it), as Shale's own sessions do (``shale.spark.session_conf``)."""
    name = name or config.iceberg.catalog_name
    prefix = f"spark.sql.catalog.{name}"
    # Every query sees the latest snapshot (Iceberg caches a loaded table for 30 s by default).
    conf = {prefix: "org.apache.iceberg.spark.SparkCatalog", f"{prefix}.cache-enabled": "false"}
    if config.iceberg.catalog == "rest":
        conf[f"{prefix}.type"] = "rest"
        conf.update({f"{prefix}.{k}": v for k, v in rest_properties(config).items() if not k.startswith("s3.")})
    else:
        conf.update({f"{prefix}.catalog-impl": "org.apache.iceberg.jdbc.JdbcCatalog",
                     f"{prefix}.uri": _jdbc_url(config.iceberg.catalog_uri), f"{prefix}.jdbc.schema-version": "V1",
                     f"{prefix}.warehouse": warehouse(config)})
    bucket = config.bucket
    if urlparse(bucket.url).scheme == "s3":
        conf[f"{prefix}.io-impl"] = "org.apache.iceberg.aws.s3.S3FileIO"
        conf[f"{prefix}.client.region"] = bucket.region
        if bucket.endpoint:
            conf[f"{prefix}.s3.endpoint"] = bucket.endpoint
            conf[f"{prefix}.s3.path-style-access"] = "true"
        if bucket.access_key_id:
            conf[f"{prefix}.s3.access-key-id"] = bucket.access_key_id
            conf[f"{prefix}.s3.secret-access-key"] = bucket.secret_access_key.get_secret_value()
    return conf


_IDENT = re.compile(r"^[A-Za-z0-9_.\-]+$")


def identifier(tenant: str, topic: str, record: str | None = None) -> tuple[str, str]:
    """The table of a tenant's topic: namespace = tenant, table = topic (quote it in SQL: `a.b`); for one record
    type of a topic of several (``Dataset.record``), table = ``<topic>__<record with '.' as '_'>``."""
    if not _IDENT.match(topic):
        raise ConfigError(f"topic {topic!r} cannot name an Iceberg table")
    return (tenant, topic if record is None else f"{topic}__{record.replace('.', '_')}")


TABLE_TOPIC, TABLE_RECORD = "shale.topic", "shale.record"
"""Table properties naming what a record type's table holds (its name alone is ambiguous: a topic may hold '__')."""
