"""Run SQL in ClickHouse (chDB, in process) over an Iceberg REST catalog: a standalone script for the Python of the
chDB environment (``shale.dev.fetch.fetch_chdb``), which has chDB but not Shale. It reads one JSON object on
stdin, so that no credential is on a command line:

    {"catalog": "http://127.0.0.1:PORT", "credential": "client_id:secret",
     "s3": {"endpoint": "http://127.0.0.1:PORT", "key_id": "...", "secret": "...", "region": "us-east-1"},
     "queries": {"name": "SELECT ... FROM shale.`tenant.topic`", ...}}

and prints ``{"name": {"columns": [[name, type], ...], "rows": [[value, ...], ...]}, ...}`` (or ``{"error": ...}``
for a query chDB refused): rows as ClickHouse's ``JSONCompact`` writes them, a decimal as text, a timestamp as
``YYYY-MM-DD hh:mm:ss.ffffff``. The catalog is a ``DataLakeCatalog`` database named ``shale`` (``catalog_type =
'rest'``), each table named ``namespace.table``; chDB runs in this process and listens on no port. (JSON rather
than chDB's Arrow result: chDB 4.4's ``ArrowTable`` format failed now and then on these queries with "ArrowInvalid:
Message metadata too long" or "Old metadata version not supported", a different query each run.)
"""

from __future__ import annotations

import json
import sys
import tempfile

# Results as JSON: decimals as text (exact), 64-bit integers as numbers (Python's are exact); ClickHouse writes a
# double as its shortest round-trip form.
SETTINGS = ("allow_database_iceberg = 1", "output_format_json_quote_decimals = 1",
            "output_format_json_quote_64bit_integers = 0")


def _quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def main() -> int:
    from chdb import session  # type: ignore[import-not-found,unused-ignore]

    spec = json.load(sys.stdin)
    s3 = spec["s3"]
    catalog = spec["catalog"].rstrip("/")
    with tempfile.TemporaryDirectory(prefix="shale-chdb-") as path:
        sess = session.Session(path)
        for setting in SETTINGS:
            sess.query(f"SET {setting}")
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
                text = sess.query(sql, "JSONCompact").bytes().decode()
                answer = json.loads(text)
            except json.JSONDecodeError as exc:  # an error met while streaming is written after the result
                out[name] = {"error": f"{exc}: {text[exc.pos:][:2000]}", "sql": sql}
                continue
            except Exception as exc:  # one refused question does not hide the others' answers
                out[name] = {"error": f"{type(exc).__name__}: {exc}", "sql": sql}
                continue
            out[name] = {"columns": [[c["name"], c["type"]] for c in answer["meta"]], "rows": answer["data"]}
        sess.close()
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
