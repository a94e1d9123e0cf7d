"""A real Iceberg REST catalog: Apache Iceberg 1.11's own ``RESTCatalogServer`` pieces (iceberg-open-api's test
fixtures, fetched by ``fetch.py iceberg-rest``) on Java 17, bound to loopback (``LoopbackRESTCatalogServer``), its
store a SQLite file in its data folder (so a catalog stopped and started again keeps its tables) and its warehouse
on the bucket through S3FileIO (endpoint, path-style access). The bucket's credentials reach the server in the AWS
SDK's environment variables, never in its properties (which it logs) or on its command line.

A development and test catalog: its JDBC store is not what a production deployment runs (docs/DEPLOY.md: Polaris,
Lakekeeper, Nessie, Glue)."""

from __future__ import annotations

import json
import os
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from shale.dev.fetch import REST_LAUNCHER, fetch_iceberg_rest
from shale.process import ManagedProcess, free_port

READY_TIMEOUT_S = 120.0
JAVA_17 = "/usr/lib/jvm/java-17-openjdk-amd64/bin/java"


@dataclass
class IcebergRestCatalog:
    data_dir: Path
    warehouse: str
    """Where new tables' metadata goes, ``s3://bucket/prefix``."""
    s3_endpoint: str
    access_key: str
    secret_key: str
    region: str = "us-east-1"
    port: int = 0
    process: ManagedProcess | None = None

    @property
    def url(self) -> str:
        """The catalog's base URL (what ``iceberg.catalog_uri`` takes with ``iceberg.catalog = "rest"``)."""
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = READY_TIMEOUT_S) -> IcebergRestCatalog:
        """Start it (again on the same port and with the same tables after a stop or a kill)."""
        classpath = fetch_iceberg_rest()
        self.port = self.port or free_port()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        java = JAVA_17 if Path(JAVA_17).exists() else "java"
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
               # RCKUtils.environmentCatalogConfig: CATALOG_X_Y -> x.y, CATALOG_X__Y -> x-y.
               "CATALOG_CATALOG__IMPL": "org.apache.iceberg.jdbc.JdbcCatalog",
               "CATALOG_URI": f"jdbc:sqlite:{self.data_dir / 'catalog.db'}",
               "CATALOG_JDBC_SCHEMA__VERSION": "V1",
               "CATALOG_WAREHOUSE": self.warehouse,
               "CATALOG_IO__IMPL": "org.apache.iceberg.aws.s3.S3FileIO",
               "CATALOG_S3_ENDPOINT": self.s3_endpoint,
               "CATALOG_S3_PATH__STYLE__ACCESS": "true",
               "CATALOG_CLIENT_REGION": self.region,
               "CATALOG_REST_HOST": "127.0.0.1",
               "CATALOG_REST_PORT": str(self.port),
               "AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key,
               "AWS_REGION": self.region}
        command = [java, "-Xmx256m", "-XX:TieredStopAtLevel=1", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                   "-cp", f"{classpath}:{classpath}/*", REST_LAUNCHER]
        self.process = ManagedProcess("iceberg-rest-catalog", command, self.data_dir / "catalog.log", env=env)
        self.process.start()
        self.process.wait_ready(self._ready, timeout, "ready (GET /v1/config)")
        return self

    def _ready(self) -> bool:
        with urllib.request.urlopen(f"{self.url}/v1/config", timeout=2) as response:  # noqa: S310 - loopback URL
            return "endpoints" in json.loads(response.read())

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def kill9(self) -> None:
        if self.process is not None:
            self.process.kill9()
