"""Trino 476 with its Iceberg connector on an Iceberg REST catalog, for the interoperability script
(``bench/interop.py``) and the reading guide's test (``tests/integration/test_reading_trino.py``): the release
tarball fetched by ``fetch.py trino``, one coordinator that is also its worker, bound to loopback
(``node.bind-ip``), on Java 25 (Trino 476 needs Java >= 24) with a 1 GiB heap, loading only the Iceberg plugin, and
one catalog ``shale``. Its file's text is given: docs/READING.md's as written, or ``rest_catalog``'s (the REST
catalog with an OAuth2 client credential, the bucket through Trino's native S3 file system, endpoint and
path-style). The credentials reach the server in environment variables that the file names (``${ENV:...}``), never
in a file or on its command line.

Queries go through Trino's HTTP protocol (``POST /v1/statement``, then each ``nextUri``), so no CLI jar is needed.

Trino says it has started (``GET /v1/info``) before its node has announced itself and its catalog to its own
discovery service; a query in between fails with ``NO_NODES_AVAILABLE`` (a CI run of 2026-12-04 did). So the server
is ready only once a query on the catalog's ``information_schema`` answers, and a query that fails with
``NO_NODES_AVAILABLE`` (refused before any task ran) is sent again for up to ``NO_NODES_RETRY_S``: the failure
detector can mark the node gone for a moment on a loaded machine."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shale.dev.fetch import TRINO_VERSION, fetch_trino
from shale.process import ManagedProcess, free_port

READY_TIMEOUT_S = 300.0
NO_NODES_RETRY_S = 60.0
JAVA_25 = "/usr/lib/jvm/temurin-25-jdk-amd64/bin/java"
CATALOG = "shale"
# PARAMETRIC_DATETIME: a client that does not declare it gets every timestamp rounded to milliseconds.
HEADERS = {"X-Trino-User": "shale", "X-Trino-Client-Capabilities": "PARAMETRIC_DATETIME"}


class TrinoQueryError(RuntimeError):
    """Trino answered a statement with an error; the message is Trino's."""


def rest_catalog(catalog_uri: str, credential: str, s3_endpoint: str, access_key: str, secret_key: str,
                 region: str = "us-east-1") -> tuple[str, dict[str, str]]:
    """The catalog file of an Iceberg REST catalog (``credential`` is its OAuth2 client credential, ``id:secret``)
    and the bucket, and the environment holding the secrets the file names."""
    text = "\n".join([
        "connector.name=iceberg", "iceberg.catalog.type=rest", f"iceberg.rest-catalog.uri={catalog_uri}",
        "iceberg.rest-catalog.security=OAUTH2", "iceberg.rest-catalog.case-insensitive-name-matching=true",
        "iceberg.rest-catalog.oauth2.credential=${ENV:SHALE_TRINO_CATALOG_CREDENTIAL}",
        "fs.native-s3.enabled=true", f"s3.endpoint={s3_endpoint}", f"s3.region={region}",
        "s3.path-style-access=true", "s3.aws-access-key=${ENV:SHALE_TRINO_S3_ACCESS_KEY}",
        "s3.aws-secret-key=${ENV:SHALE_TRINO_S3_SECRET_KEY}", ""])
    return text, {"SHALE_TRINO_CATALOG_CREDENTIAL": credential, "SHALE_TRINO_S3_ACCESS_KEY": access_key,
                  "SHALE_TRINO_S3_SECRET_KEY": secret_key}


@dataclass
class TrinoServer:
    data_dir: Path
    catalog: str
    """The text of the catalog file ``etc/catalog/shale.properties``."""
    env: Mapping[str, str] = field(default_factory=dict)
    """The environment variables the catalog file reads (``${ENV:NAME}``): its secrets."""
    heap: str = "1G"
    port: int = 0
    process: ManagedProcess | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = READY_TIMEOUT_S) -> TrinoServer:
        home = fetch_trino()
        self.port = self.port or free_port()
        etc = self.data_dir / "etc"
        (etc / "catalog").mkdir(parents=True, exist_ok=True)
        plugins = self.data_dir / "plugin"
        plugins.mkdir(exist_ok=True)
        if not (plugins / "iceberg").exists():
            (plugins / "iceberg").symlink_to(home / "plugin" / "iceberg")
        (etc / "config.properties").write_text("\n".join([
            "coordinator=true", "node-scheduler.include-coordinator=true",
            f"http-server.http.port={self.port}", f"discovery.uri={self.url}",
            "node.environment=shale", "node.id=shale-interop",
            "node.bind-ip=127.0.0.1", "node.internal-address=127.0.0.1",
            f"plugin.dir={plugins}", f"catalog.config-dir={etc / 'catalog'}",
            "query.max-memory=512MB", "query.max-memory-per-node=256MB", ""]))
        (etc / "catalog" / f"{CATALOG}.properties").write_text(self.catalog)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **self.env}
        java = JAVA_25 if Path(JAVA_25).exists() else "java"
        command = [java, f"-Xmx{self.heap}", "-XX:+UseG1GC", "-XX:+ExitOnOutOfMemoryError",
                   "-Djdk.attach.allowAttachSelf=true", f"-Dconfig={etc / 'config.properties'}",
                   "-cp", f"{home}/lib/*", "io.trino.server.TrinoServer"]
        self.process = ManagedProcess(f"trino-{TRINO_VERSION}", command, self.data_dir / "trino.log", env=env,
                                      cwd=self.data_dir)
        self.process.start()
        self.process.wait_ready(self._ready, timeout, "ready (GET /v1/info: not starting)")
        return self

    def _ready(self) -> bool:
        with urllib.request.urlopen(f"{self.url}/v1/info", timeout=2) as response:  # noqa: S310 - loopback URL
            if json.loads(response.read()).get("starting") is not False:
                return False
        self._query_once(f"SELECT count(*) FROM {CATALOG}.information_schema.schemata")
        return True

    def query(self, sql: str) -> tuple[list[dict[str, Any]], list[list[Any]]]:
        """The columns (name, type) and rows of ``sql``, as Trino's protocol gives them (JSON values: a decimal
        or a timestamp as text)."""
        deadline = time.monotonic() + NO_NODES_RETRY_S
        while True:
            try:
                return self._query_once(sql)
            except TrinoQueryError as error:
                if not str(error).startswith("NO_NODES_AVAILABLE") or time.monotonic() > deadline:
                    raise
            time.sleep(1.0)

    def _query_once(self, sql: str) -> tuple[list[dict[str, Any]], list[list[Any]]]:
        request = urllib.request.Request(  # noqa: S310 - loopback URL
            f"{self.url}/v1/statement", data=sql.encode(), method="POST",
            headers={**HEADERS, "X-Trino-Catalog": CATALOG})
        columns: list[dict[str, Any]] = []
        rows: list[list[Any]] = []
        while True:
            with urllib.request.urlopen(request, timeout=120) as response:  # noqa: S310 - loopback URL
                page = json.loads(response.read())
            if "error" in page:
                raise TrinoQueryError(f"{page['error'].get('errorName')}: {page['error'].get('message')}")
            columns = page.get("columns") or columns
            rows += page.get("data") or []
            if not page.get("nextUri"):
                return columns, rows
            if not page["nextUri"].startswith(self.url + "/"):
                raise TrinoQueryError(f"Trino sent a next page elsewhere: {page['nextUri']}")
            request = urllib.request.Request(page["nextUri"], headers=HEADERS)  # noqa: S310

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
