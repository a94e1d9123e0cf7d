"""Run SQL in ClickHouse (chDB, in process) over an Iceberg REST catalog: a standalone script for the Python of the
chDB environment (``shale.dev.fetch.fetch_chdb``), which has chDB but not Shale. It reads one JSON object on
stdin, so that no credential is on a command line:

    {"catalog": "http://127.0.0.1:PORT", "credential": "client_id:secret",
     "s3": {"endpoint": "http://127.0.0.1:PORT", "key_id": "...", "secret": "...", "region": "us-east-1"},
     "queries": {"name": "SELECT ... FROM shale.`tenant.topic`", ...}}

and prints ``{"name": {"columns": [[name, type], ...], "rows": [[value, ...], ...]}, ...}`` (or ``{"error": ...}``
for a query chDB refused). The catalog is a
``DataLakeCatalog`` database named ``shale`` (``catalog_type = 'rest'``), each table named ``namespace.table``;
decimals print as text, timestamps in ISO 8601. chDB runs in this process and listens on no port.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import sys
import tempfile
from typing import Any


def _quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _plain(value: Any) -> Any:
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def main() -> int:
    from chdb import session  # type: ignore[import-not-found,unused-ignore]

    spec = json.load(sys.stdin)
    s3 = spec["s3"]
    catalog = spec["catalog"].rstrip("/")
    with tempfile.TemporaryDirectory(prefix="shale-chdb-") as path:
        sess = session.Session(path)
        sess.query("SET allow_database_iceberg = 1")
        sess.query(
            f"CREATE DATABASE shale ENGINE = DataLakeCatalog({_quote(catalog + '/v1')}) SETTINGS "
            f"catalog_type = 'rest', warehouse = {_quote(spec.get('warehouse') or 'warehouse')}, "
            f"catalog_credential = {_quote(spec['credential'])}, "
            f"oauth_server_uri = {_quote(catalog + '/v1/oauth/tokens')}, "
            f"storage_endpoint = {_quote(s3['endpoint'])}, aws_access_key_id = {_quote(s3['key_id'])}, "
            f"aws_secret_access_key = {_quote(s3['secret'])}, region = {_quote(s3['region'])}")
        out = {}
        for name, sql in spec["queries"].items():
            try:
                table = sess.query(sql, "ArrowTable")
            except Exception as exc:  # one refused question does not hide the others' answers
                out[name] = {"error": f"{type(exc).__name__}: {exc}", "sql": sql}
                continue
            columns = [c.to_pylist() for c in table.columns]
            out[name] = {"columns": [[f.name, str(f.type)] for f in table.schema],
                         "rows": [_plain(list(row)) for row in zip(*columns, strict=True)]}
        sess.close()
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
