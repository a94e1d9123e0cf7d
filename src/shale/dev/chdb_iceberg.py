"""Run SQL in ClickHouse (chDB, in process) over an Iceberg REST catalog: a standalone script for the Python of the
chDB environment (``shale.dev.fetch.fetch_chdb``), which has chDB but not Shale. It reads one JSON object on
stdin, so that no credential is on a command line:

    {"catalog": "http://127.0.0.1:PORT", "credential": "client_id:secret",
     "s3": {"endpoint": "http://127.0.0.1:PORT", "key_id": "...", "secret": "...", "region": "us-east-1"},
     "queries": {"name": "SELECT ... FROM shale.`tenant.topic`", ...}}

and prints ``{"name": {"columns": [[name, type], ...], "rows": [[value, ...], ...]}, ...}`` (or ``{"error": ...}``
for a query chDB refused): rows as ClickHouse's ``JSONCompact`` writes them, a decimal as text, a timestamp as
``YYYY-MM-DD hh:mm:ss.ffffff``. The catalog is a ``DataLakeCatalog`` database named ``shale`` (``catalog_type =
'rest'``), each table named ``namespace.table``; chDB runs in this process and listens on no port. Each query runs in a
session of its own (see ``_ask``).
"""

from __future__ import annotations

import json
import sys
import tempfile
from typing import Any

# Results as JSON: decimals as text (exact, with their scale's trailing zeros), 64-bit integers as numbers
# (Python's are exact); ClickHouse writes a double as its shortest round-trip form.
SETTINGS = ("allow_database_iceberg = 1", "output_format_json_quote_decimals = 1",
            "output_format_decimal_trailing_zeros = 1", "output_format_json_quote_64bit_integers = 0")


def _quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _ask(spec: dict[str, Any], sql: str) -> dict[str, Any]:
    """One query in a session of its own: chDB 4.4 keeps a failed query's partial output in its session's buffer,
    and hands it out before the next query's result."""
    from chdb import session  # type: ignore[import-not-found,unused-ignore]

    s3 = spec["s3"]
    catalog = spec["catalog"].rstrip("/")
    with tempfile.TemporaryDirectory(prefix="shale-chdb-") as path:
        sess = session.Session(path)
        try:
            for setting in SETTINGS:
                sess.query(f"SET {setting}")
            sess.query(
                f"CREATE DATABASE shale ENGINE = DataLakeCatalog({_quote(catalog + '/v1')}) SETTINGS "
                f"catalog_type = 'rest', warehouse = {_quote(spec.get('warehouse') or 'warehouse')}, "
                f"catalog_credential = {_quote(spec['credential'])}, "
                f"oauth_server_uri = {_quote(catalog + '/v1/oauth/tokens')}, "
                f"storage_endpoint = {_quote(s3['endpoint'])}, aws_access_key_id = {_quote(s3['key_id'])}, "
                f"aws_secret_access_key = {_quote(s3['secret'])}, region = {_quote(s3['region'])}")
            text = sess.query(sql, "JSONCompact").bytes().decode()
            answer = json.loads(text)
        except json.JSONDecodeError as exc:  # an error met while streaming is written after the result
            return {"error": f"{exc}: {text[exc.pos:][:2000]}", "sql": sql}
        except Exception as exc:  # one refused question does not hide the others' answers
            return {"error": f"{type(exc).__name__}: {exc}", "sql": sql}
        finally:
            sess.close()
    return {"columns": [[c["name"], c["type"]] for c in answer["meta"]], "rows": answer["data"]}


def main() -> int:
    spec = json.load(sys.stdin)
    json.dump({name: _ask(spec, sql) for name, sql in spec["queries"].items()}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
