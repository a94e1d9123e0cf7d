"""A real Schema Registry: Apicurio Registry 3.0.9 (Maven Central's runnable ``zip:all``) on a loopback port, its
storage an H2 database file in its data folder (so a registry killed and started again keeps its schemas and ids,
as a production registry does). Its Confluent-compatible API is under ``/apis/ccompat/v7``, what Shale and the standard
serializers talk to."""

from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from shale.dev.fetch import apicurio_runner_jar
from shale.process import ManagedProcess, free_port

READY_TIMEOUT_S = 180.0  # a Quarkus start on two loaded cores takes tens of seconds
CCOMPAT_PATH = "/apis/ccompat/v7"


@dataclass
class SchemaRegistry:
    data_dir: Path
    port: int = 0
    process: ManagedProcess | None = None

    @property
    def url(self) -> str:
        """The Confluent-compatible API's base URL (what ``ingest.schema_registry.url`` takes)."""
        return f"http://127.0.0.1:{self.port}{CCOMPAT_PATH}"

    def start(self, timeout: float = READY_TIMEOUT_S) -> SchemaRegistry:
        """Start it (again on the same port and with the same schemas after a stop or a kill)."""
        jar = apicurio_runner_jar()
        self.port = self.port or free_port()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # C1 only: a test's registry answers a few hundred requests, and C2's compilations cost it more CPU than
        # they save (its start: 10.2 -> 7.0 CPU-seconds, 2026-12-02).
        command = ["java", "-Xmx384m", "-XX:TieredStopAtLevel=1", "-Dquarkus.http.host=127.0.0.1",
                   f"-Dquarkus.http.port={self.port}",
                   f"-Dapicurio.datasource.url=jdbc:h2:file:{self.data_dir / 'registry-db'}",
                   "-Dquarkus.log.level=WARN", "-jar", str(jar)]
        self.process = ManagedProcess("schema-registry", command, self.data_dir / "registry.log")
        self.process.start()
        self.process.wait_ready(self._ready, timeout, f"ready (GET {CCOMPAT_PATH}/subjects)")
        return self

    def _ready(self) -> bool:
        with urllib.request.urlopen(f"{self.url}/subjects", timeout=2) as response:  # noqa: S310 - loopback URL
            return bool(response.status == 200)

    def set_compatibility(self, subject: str, level: str) -> None:
        """Set a subject's compatibility rule (BACKWARD, FORWARD, FULL, NONE, ...)."""
        request = urllib.request.Request(  # noqa: S310 - loopback URL we built
            f"{self.url}/config/{subject}", method="PUT", data=json.dumps({"compatibility": level}).encode(),
            headers={"Content-Type": "application/vnd.schemaregistry.v1+json"})
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - loopback URL we built
            response.read()

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def kill9(self) -> None:
        if self.process is not None:
            self.process.kill9()
