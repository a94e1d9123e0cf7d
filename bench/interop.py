"""Interoperability: Trino 476 and ClickHouse (chDB 4.4) read Shale's typed Iceberg tables through the Iceberg REST
catalog and answer the same questions as ``shale query`` over the same blocks, value for value; DuckDB 1.5.5 and
Polars (pyiceberg) answer beside them, as in ``tests/integration/test_iceberg_rest.py``.

The setup is that test's (``tests/iceberg_questions.py``): MinIO, Apache Iceberg 1.11's REST catalog server on
loopback with an OAuth2 client credential, an embedded metastore and Shale's Iceberg publisher. The typed topic is
published at schema version 1 (with a topic of two record types), then evolved to version 2, then compacted; after
each change every engine answers the questions: the row count, a decimal summed per level, two timestamps as
microseconds since the epoch, a nested field, every row's typed columns of each schema version, and each record
type's table. Trino runs as a server (one coordinator, loopback only, 1 GiB heap, only its Iceberg plugin: the
``shale.dev.trino`` catalog ``shale`` with ``iceberg.catalog.type=rest`` and the native S3 file system on MinIO,
path-style), queried over its HTTP protocol; chDB runs in its own virtual environment as a subprocess, the catalog
a ``DataLakeCatalog`` database (``catalog_type = 'rest'``). The result lists, per engine, each question's answer and
whether it agrees with ``shale query``, and the type each engine shows for the typed columns. Figures: questions
each engine answered as ``shale query`` did (baseline: the questions asked); ratios: the share.

Outside ``make test`` and ``make bench`` (chDB's environment is about 900 MB, Trino's server 900 MB, both fetched
into the cache on first run): ``python -m bench interop``. It takes the integration lock itself while its services
run (do not wrap it in ``flock``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import subprocess
import tempfile
import traceback
import zoneinfo
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tests.iceberg_questions import (
    CREDENTIAL,
    ORDERS,
    RECORDS,
    ROOT,
    SHOP,
    TYPED,
    TYPED_COLUMNS,
    World,
    duckdb_answers,
    duckdb_types,
    iceberg_and_polars_types,
    plain,
    polars_answers,
    questions_sql,
    rest_config,
    shale_answers,
)

from bench.common import progress, timed, write_result
from shale.config import BucketConfig
from shale.dev import MinioServer
from shale.dev.fetch import CHDB_VERSION, TRINO_VERSION, fetch_chdb
from shale.dev.iceberg_rest import IcebergRestCatalog
from shale.dev.trino import TrinoServer, rest_catalog

LOCK = Path("/tmp/shale-integration.lock")
ENGINES = ("trino", "chdb", "duckdb", "polars")
STAGES = ("version 1", "after an evolution", "after a compaction")


@contextlib.contextmanager
def _integration_lock() -> Iterator[None]:
    with open(LOCK, "a") as handle:
        progress(f"waiting for {LOCK}")
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# -- Trino -------------------------------------------------------------------------------------------------------------

def _trino_micros(value: str | None) -> int | None:
    """Trino's text of a ``timestamp(6) with time zone`` (``2026-01-01 12:00:00.000001 UTC``) as microseconds since
    the epoch: its protocol has no integer form, and ``to_unixtime`` is a double."""
    if value is None:
        return None
    stamp, zone = value.rsplit(" ", 1)
    local = dt.datetime.fromisoformat(stamp).replace(tzinfo=zoneinfo.ZoneInfo(zone))
    delta = local - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _trino_questions(evolved: bool) -> dict[str, str]:
    c = "shale"
    return questions_sql(f"{c}.{TYPED}.{ORDERS}", f'{c}."{RECORDS}".{SHOP}__shop_Order',
                         f'{c}."{RECORDS}".{SHOP}__shop_Refund', '"', "{}", evolved)


def trino_rows(trino: TrinoServer, evolved: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, sql in _trino_questions(evolved).items():
        try:
            rows = trino.query(sql)[1]
        except Exception as exc:  # an engine's refusal is a finding, recorded with its message
            out[name] = {"error": f"{type(exc).__name__}: {exc}", "sql": sql}
            continue
        if name == "times":
            rows = [[o, _trino_micros(p), _trino_micros(e)] for o, p, e in rows]
        out[name] = rows
    return out


def trino_types(trino: TrinoServer) -> dict[str, str]:
    return {row[0]: row[1] for row in trino.query(f"DESCRIBE shale.{TYPED}.{ORDERS}")[1]}


# -- ClickHouse (chDB) ---------------------------------------------------------------------------------------------

def _chdb(catalog: IcebergRestCatalog, bucket: BucketConfig, queries: dict[str, str]) -> dict[str, Any]:
    spec = {"catalog": catalog.url, "credential": CREDENTIAL,
            "s3": {"endpoint": bucket.endpoint, "key_id": bucket.access_key_id,
                   "secret": bucket.secret_access_key.get_secret_value(), "region": bucket.region},
            "queries": queries}
    script = ROOT / "src" / "shale" / "dev" / "chdb_iceberg.py"
    done = subprocess.run([str(fetch_chdb()), str(script)], input=json.dumps(spec), capture_output=True, text=True,
                          timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"chdb_iceberg.py exited {done.returncode}: {done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _chdb_questions(evolved: bool) -> dict[str, str]:
    return questions_sql(f"shale.`{TYPED}.{ORDERS}`", f"shale.`{RECORDS}.{SHOP}__shop_Order`",
                         f"shale.`{RECORDS}.{SHOP}__shop_Refund`", "`", "toUnixTimestamp64Micro({})", evolved)


def chdb_rows(catalog: IcebergRestCatalog, bucket: BucketConfig, evolved: bool) -> dict[str, Any]:
    answers = _chdb(catalog, bucket, _chdb_questions(evolved))
    return {name: a if "error" in a else a["rows"] for name, a in answers.items()}


def chdb_types(catalog: IcebergRestCatalog, bucket: BucketConfig) -> dict[str, str]:
    answer = _chdb(catalog, bucket, {"types": f"DESCRIBE TABLE shale.`{TYPED}.{ORDERS}`"})["types"]
    if "error" in answer:
        raise RuntimeError(answer["error"])
    return {row[0]: " ".join(row[1].split()) for row in answer["rows"]}  # ClickHouse breaks a Tuple's lines


# -- comparing ---------------------------------------------------------------------------------------------------------

def _compare(rows: dict[str, Any], expected: dict[str, Any]) -> dict[str, Any]:
    """Each question: the engine's answer (in ``shale_answers``'s shape) and whether it is ``shale query``'s."""
    failed = {name: r for name, r in rows.items() if isinstance(r, dict) and "error" in r}
    answered = plain({name: ([[None]] if name == "count" else []) if name in failed else r
                      for name, r in rows.items()})
    return {name: ({"error": failed[name]["error"], "agrees": False} if name in failed
                   else {"answer": answered[name], "agrees": answered[name] == value})
            for name, value in expected.items()}


def _ask(what: str, ask: Callable[[], dict[str, Any]], expected: dict[str, Any]) -> dict[str, Any]:
    try:
        return _compare(ask(), expected)
    except Exception as exc:  # an engine that cannot answer at all: every question records why
        progress(f"{what} failed: {exc}")
        error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}"[-3000:]
        return {name: {"error": error, "agrees": False} for name in expected}


def _as_rows(answers: dict[str, Any]) -> dict[str, Any]:
    """Polars's answers are already in ``shale_answers``'s shape: as rows for ``_compare``."""
    return {**answers, "count": [[answers["count"]]], "amount_by_level": list(answers["amount_by_level"].items())}


def run() -> dict[str, Any]:
    with _integration_lock(), tempfile.TemporaryDirectory(prefix="shale-bench-interop-") as tmp:
        work = Path(tmp)
        fetch_chdb()  # before any service starts: a first run installs about 900 MB
        minio = MinioServer(work / "minio").start()
        services: list[Any] = [minio]
        try:
            minio.create_bucket("iceberg-rest")
            minio.create_bucket("interop")
            bucket = BucketConfig(url="s3://interop", endpoint=minio.endpoint, access_key_id=minio.access_key,
                                  secret_access_key=minio.secret_key, allow_http=True)
            catalog = IcebergRestCatalog(work / "iceberg-rest", "s3://iceberg-rest/warehouse", minio.endpoint,
                                         minio.access_key, minio.secret_key).start()
            services.append(catalog)
            progress(f"starting Trino {TRINO_VERSION}")
            with timed() as trino_start:
                trino = TrinoServer(work / "trino", *rest_catalog(catalog.url, CREDENTIAL, minio.endpoint,
                                                                  minio.access_key, minio.secret_key)).start()
            services.append(trino)
            w = World(rest_config(bucket, catalog.url, work), work)
            expected: dict[str, Any] = {}
            stages: dict[str, dict[str, Any]] = {e: {} for e in ENGINES}
            for stage, change, evolved in ((STAGES[0], w.version_1, False), (STAGES[1], w.evolve, True),
                                           (STAGES[2], w.compact_all, True)):
                change()
                w.publisher.sync()
                expected[stage] = shale_answers(w, evolved)
                progress(f"{stage}: asking {', '.join(ENGINES)}")
                stages["trino"][stage] = _ask("trino", lambda e=evolved: trino_rows(trino, e), expected[stage])
                stages["chdb"][stage] = _ask("chdb", lambda e=evolved: chdb_rows(catalog, bucket, e), expected[stage])
                stages["duckdb"][stage] = _ask("duckdb", lambda e=evolved: _as_rows(duckdb_answers(w, catalog.url, e)),
                                               expected[stage])
                stages["polars"][stage] = _ask("polars", lambda e=evolved: _as_rows(polars_answers(w.config, e)),
                                               expected[stage])
            types = iceberg_and_polars_types(w.config)
            for engine, shown in (("trino", lambda: trino_types(trino)), ("chdb", lambda: chdb_types(catalog, bucket)),
                                  ("duckdb", lambda: duckdb_types(w, catalog.url))):
                try:
                    seen = shown()
                    for column in TYPED_COLUMNS:
                        types[column][engine] = seen.get(column, "(absent)")
                except Exception as exc:  # recorded, as an answer would be
                    for column in TYPED_COLUMNS:
                        types[column][engine] = f"error: {exc}"[:500]
        finally:
            for service in reversed(services):
                service.stop()
    asked = sum(len(v) for v in expected.values())
    agreeing = {e: sum(q["agrees"] for s in stages[e].values() for q in s.values()) for e in ENGINES}
    figures: dict[str, float] = {f"{e}_agreeing": float(agreeing[e]) for e in ENGINES}
    figures["trino_start_s"] = round(trino_start[0], 1)
    details = {
        "versions": {"trino": TRINO_VERSION, "chdb": CHDB_VERSION},
        "shale_query": expected,
        "engines": stages,
        "disagreements": {e: [f"{stage}: {q}" for stage, s in stages[e].items() for q, a in s.items()
                              if not a["agrees"]] for e in ENGINES},
        "types": types,
    }
    return write_result("interop", figures, {"questions": float(asked)},
                        {f"{e}_agreement": round(agreeing[e] / asked, 3) for e in ENGINES}, __doc__ or "",
                        details=details)
