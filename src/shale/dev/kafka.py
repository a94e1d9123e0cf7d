"""A real single-node Apache Kafka broker in KRaft mode, from jars fetched from Maven Central."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from shale.dev.fetch import fetch_kafka
from shale.errors import ServiceStartError
from shale.process import ManagedProcess, free_port, port_open

READY_TIMEOUT_S = 90.0

_SERVER_PROPERTIES = """\
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:{controller_port}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}
advertised.listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs={log_dir}
num.partitions=1
auto.create.topics.enable=false
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
log.retention.check.interval.ms=5000
log.segment.delete.delay.ms=1000
"""


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and Path(home, "bin", "java").exists():
        return str(Path(home, "bin", "java"))
    found = shutil.which("java")
    if found is None:
        raise ServiceStartError("kafka: java is not on PATH; install OpenJDK 17 (Debian: openjdk-17-jre-headless)")
    return found


@dataclass
class KafkaBroker:
    """One broker+controller process. ``bootstrap_servers`` is what clients connect to."""

    data_dir: Path
    port: int = 0
    controller_port: int = 0
    heap: str = "768m"
    process: ManagedProcess | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = READY_TIMEOUT_S) -> KafkaBroker:
        jars = fetch_kafka()
        self.port = self.port or free_port()
        self.controller_port = self.controller_port or free_port()
        log_dir = self.data_dir / "kraft-logs"
        config = self.data_dir / "server.properties"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        config.write_text(
            _SERVER_PROPERTIES.format(port=self.port, controller_port=self.controller_port, log_dir=log_dir)
        )
        java = _java()
        classpath = f"{jars}/*"
        if not (log_dir / "meta.properties").exists():
            # A fresh log directory must be formatted once with a cluster id (KRaft's replacement for ZooKeeper).
            cluster_id = base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
            fmt = [java, "-cp", classpath, "kafka.tools.StorageTool", "format", "--standalone",
                   "-t", cluster_id, "-c", str(config)]
            proc = subprocess.run(fmt, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise ServiceStartError(
                    f"kafka: formatting the KRaft log directory failed.\ncommand: {' '.join(fmt)}\n"
                    f"output:\n{proc.stdout}{proc.stderr}"
                )
        command = [java, f"-Xmx{self.heap}", f"-Xms{self.heap}", "-XX:+UseG1GC", "-Djava.awt.headless=true",
                   "-cp", classpath, "kafka.Kafka", str(config)]
        self.process = ManagedProcess("kafka", command, self.data_dir / "kafka.log")
        self.process.start()
        self.process.wait_ready(self._ready, timeout, "accepting clients")
        return self

    def _ready(self) -> bool:
        if not port_open(self.port):
            return False
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers})
        metadata = admin.list_topics(timeout=2)
        return len(metadata.brokers) > 0

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def kill9(self) -> None:
        if self.process is not None:
            self.process.kill9()
