"""Run SQL in DuckDB over an Iceberg REST catalog: a standalone script for the Python of the DuckDB environment
(``shale.dev.fetch.fetch_duckdb``), which has DuckDB and its Iceberg extension but not Shale. It reads one JSON
object on stdin, so that no credential is on a command line:

    {"catalog": "http://127.0.0.1:PORT", "client_id": "...", "client_secret": "...",
     "s3": {"endpoint": "127.0.0.1:PORT", "key_id": "...", "secret": "...", "region": "us-east-1"},
     "queries": {"name": "SELECT ... FROM shale.tenant.topic", ...}}

and prints ``{"name": [[value, ...], ...], ...}``: the catalog is attached as ``shale``; decimals print as text,
timestamps in ISO 8601. Without ``catalog``, queries read tables directly (``iceberg_scan('s3://.../x.metadata.json')``;
without ``s3``, tables in local folders). ``"copies": {"path": "SELECT ..."}`` writes each query's answer to a
Parquet file at its path instead (every value in DuckDB's own type, for a caller to compare exactly).
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import sys
from typing import Any


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


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
    import duckdb  # type: ignore[import-not-found,unused-ignore]
    from duckdb_extensions import import_extension  # type: ignore[import-not-found,unused-ignore]

    spec = json.load(sys.stdin)
    con = duckdb.connect()
    for extension in ("httpfs", "avro", "iceberg"):
        import_extension(extension, con=con)
        con.execute(f"LOAD {extension}")
    s3 = spec.get("s3")
    if s3:
        con.execute(f"CREATE SECRET s3 (TYPE S3, KEY_ID {_quote(s3['key_id'])}, SECRET {_quote(s3['secret'])}, "
                    f"REGION {_quote(s3['region'])}, ENDPOINT {_quote(s3['endpoint'])}, URL_STYLE 'path', "
                    f"USE_SSL {str(s3.get('use_ssl', False)).lower()})")
    if spec.get("catalog"):
        auth = "AUTHORIZATION_TYPE 'none'"
        if spec.get("client_id"):
            con.execute(f"CREATE SECRET catalog (TYPE ICEBERG, CLIENT_ID {_quote(spec['client_id'])}, "
                        f"CLIENT_SECRET {_quote(spec['client_secret'])}, "
                        f"OAUTH2_SERVER_URI {_quote(spec['catalog'].rstrip('/') + '/v1/oauth/tokens')})")
            auth = "SECRET catalog"
        con.execute(f"ATTACH {_quote(spec.get('warehouse') or 'warehouse')} AS shale (TYPE ICEBERG, "
                    f"ENDPOINT {_quote(spec['catalog'])}, {auth}, ACCESS_DELEGATION_MODE 'none')")
    for path, sql in spec.get("copies", {}).items():
        con.execute(f"COPY ({sql}) TO {_quote(path)} (FORMAT parquet)")
    out = {name: [_plain(list(row)) for row in con.execute(sql).fetchall()]
           for name, sql in spec.get("queries", {}).items()}
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
