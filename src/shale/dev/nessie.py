"""Project Nessie 0.99.0, a production Iceberg REST catalog server, for the test that publishes through one
(``tests/integration/test_nessie.py``): the runner jar fetched by ``fetch.py nessie``, on Java 25 (it needs 21 or
newer), its HTTP and management interfaces bound to loopback on free ports. Its version store is RocksDB in its data
folder (so a server stopped and started again keeps its tables); a production deployment runs JDBC (PostgreSQL) or
another database (docs/DEPLOY.md). Its one warehouse, ``warehouse``, is on the bucket through MinIO's endpoint,
path-style. The bucket's keys reach the server in environment variables that its properties name (``${...}``),
never on its command line; authentication is off, as on a development machine (production turns on OIDC).

Shale reaches its Iceberg REST API at ``<url>/iceberg`` (``iceberg.catalog_uri``)."""

from __future__ import annotations

import json
import os
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from shale.dev.fetch import NESSIE_VERSION, fetch_nessie
from shale.process import ManagedProcess, free_port

READY_TIMEOUT_S = 180.0
JAVA_25 = "/usr/lib/jvm/temurin-25-jdk-amd64/bin/java"
WAREHOUSE = "warehouse"


@dataclass
class NessieServer:
    data_dir: Path
    location: str
    """The warehouse's location, ``s3://bucket/prefix``."""
    s3_endpoint: str
    access_key: str
    secret_key: str
    region: str = "us-east-1"
    port: int = 0
    management_port: int = 0
    process: ManagedProcess | None = None

    @property
    def url(self) -> str:
        """The server's base URL; its Iceberg REST API is ``iceberg_uri``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def iceberg_uri(self) -> str:
        """What ``iceberg.catalog_uri`` takes with ``iceberg.catalog = "rest"``."""
        return f"{self.url}/iceberg"

    def start(self, timeout: float = READY_TIMEOUT_S) -> NessieServer:
        """Start it (again on the same ports and with the same tables after a stop)."""
        jar = fetch_nessie()
        self.port = self.port or free_port()
        self.management_port = self.management_port or free_port()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        s3 = "nessie.catalog.service.s3.default-options"
        properties = {
            "quarkus.http.host": "127.0.0.1", "quarkus.http.port": self.port,
            "quarkus.management.host": "127.0.0.1", "quarkus.management.port": self.management_port,
            "nessie.version.store.type": "ROCKSDB",
            "nessie.version.store.persist.rocks.database-path": self.data_dir / "rocksdb",
            "nessie.catalog.default-warehouse": WAREHOUSE,
            f"nessie.catalog.warehouses.{WAREHOUSE}.location": self.location,
            f"{s3}.endpoint": self.s3_endpoint, f"{s3}.path-style-access": "true", f"{s3}.region": self.region,
            # A secret's URN names two properties, <name>.name and <name>.secret, here read from the environment.
            f"{s3}.access-key": "urn:nessie-secret:quarkus:shale.bucket-key",
            "shale.bucket-key.name": "${SHALE_NESSIE_S3_ACCESS_KEY}",
            "shale.bucket-key.secret": "${SHALE_NESSIE_S3_SECRET_KEY}",
        }
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
               "SHALE_NESSIE_S3_ACCESS_KEY": self.access_key, "SHALE_NESSIE_S3_SECRET_KEY": self.secret_key}
        java = JAVA_25 if Path(JAVA_25).exists() else "java"
        command = [java, "-Xmx512m", "-XX:+ExitOnOutOfMemoryError", "--enable-native-access=ALL-UNNAMED",
                   *(f"-D{k}={v}" for k, v in properties.items()), "-jar", str(jar)]
        self.process = ManagedProcess(f"nessie-{NESSIE_VERSION}", command, self.data_dir / "nessie.log", env=env,
                                      cwd=self.data_dir)
        self.process.start()
        self.process.wait_ready(self._ready, timeout, "ready (GET /q/health/ready: UP, its warehouse reached)")
        return self

    def _ready(self) -> bool:
        url = f"http://127.0.0.1:{self.management_port}/q/health/ready"
        with urllib.request.urlopen(url, timeout=2) as response:
            status: str = json.loads(response.read()).get("status", "")
        return status == "UP"

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
