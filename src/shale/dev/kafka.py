"""A real single-node Apache Kafka broker in KRaft mode, from jars fetched from Maven Central.

``security`` picks what clients connect with: ``plaintext`` (the default), ``sasl`` (SASL_PLAINTEXT with
SCRAM-SHA-512: a user ``shale`` with a random password) or ``ssl`` (TLS with a CA and a broker certificate made
here with the JDK's keytool). Secrets go through files and the environment, never a command line. A secured
broker also listens on a loopback PLAINTEXT listener of its own (``internal_bootstrap``): its inter-broker traffic
and the set-up of the SCRAM user go there; clients use the secured listener.
"""

from __future__ import annotations

import base64
import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from shale.dev.fetch import fetch_kafka
from shale.errors import ServiceStartError
from shale.process import ManagedProcess, free_port, port_open

READY_TIMEOUT_S = 90.0

_SERVER_PROPERTIES = """\
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:{controller_port}
{listeners}
controller.listener.names=CONTROLLER
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
log.cleaner.backoff.ms=1000
message.max.bytes=16777216
replica.fetch.max.bytes=16777216
"""

_PLAINTEXT = """\
listeners=PLAINTEXT://{host}:{port},CONTROLLER://127.0.0.1:{controller_port}
advertised.listeners=PLAINTEXT://{host}:{port},CONTROLLER://127.0.0.1:{controller_port}
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
inter.broker.listener.name=PLAINTEXT"""

_SECURED = """\
listeners={name}://127.0.0.1:{port},INTERNAL://127.0.0.1:{internal_port},CONTROLLER://127.0.0.1:{controller_port}
advertised.listeners={name}://127.0.0.1:{port},INTERNAL://127.0.0.1:{internal_port},CONTROLLER://127.0.0.1:{controller_port}
listener.security.protocol.map=CONTROLLER:PLAINTEXT,INTERNAL:PLAINTEXT,{name}:{name}
inter.broker.listener.name=INTERNAL"""

_SASL = """
sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.sasl_plaintext.sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config=\
org.apache.kafka.common.security.scram.ScramLoginModule required;"""

_SSL = """
ssl.keystore.type=PKCS12
ssl.keystore.location={keystore}
ssl.keystore.password={password}
ssl.key.password={password}
ssl.client.auth=none"""


def java_binary() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and Path(home, "bin", "java").exists():
        return str(Path(home, "bin", "java"))
    found = shutil.which("java")
    if found is None:
        raise ServiceStartError("kafka: java is not on PATH; install OpenJDK 17 (Debian: openjdk-17-jre-headless)")
    return found


def make_tls(folder: Path, host: str = "127.0.0.1") -> tuple[Path, Path, str]:
    """A CA and a broker key pair signed by it, made with the JDK's keytool: (CA PEM, broker PKCS12 keystore,
    keystore password). Passwords reach keytool through the environment (``-storepass:env``), never argv."""
    keytool = str(Path(java_binary()).parent / "keytool")
    folder.mkdir(parents=True, exist_ok=True)
    password = secrets.token_urlsafe(18)
    env = {**os.environ, "SHALE_KEYTOOL_PASS": password}
    ca, keystore, csr, crt, pem = (folder / n for n in ("ca.p12", "broker.p12", "broker.csr", "broker.crt", "ca.pem"))
    for path in (ca, keystore, csr, crt, pem):
        path.unlink(missing_ok=True)
    store = ["-storetype", "PKCS12", "-storepass:env", "SHALE_KEYTOOL_PASS"]
    san = f"SAN=IP:{host},DNS:localhost"
    steps = [
        ["-genkeypair", "-alias", "ca", "-dname", "CN=Shale test CA", "-keyalg", "RSA", "-keysize", "2048",
         "-validity", "3650", "-ext", "bc:c", "-keystore", str(ca), *store],
        ["-exportcert", "-rfc", "-alias", "ca", "-keystore", str(ca), *store, "-file", str(pem)],
        ["-genkeypair", "-alias", "broker", "-dname", f"CN={host}", "-keyalg", "RSA", "-keysize", "2048",
         "-validity", "3650", "-ext", san, "-keystore", str(keystore), *store],
        ["-certreq", "-alias", "broker", "-keystore", str(keystore), *store, "-file", str(csr)],
        ["-gencert", "-alias", "ca", "-keystore", str(ca), *store, "-infile", str(csr), "-outfile", str(crt),
         "-rfc", "-ext", san, "-validity", "3650"],
        ["-importcert", "-alias", "ca", "-file", str(pem), "-keystore", str(keystore), *store, "-noprompt"],
        ["-importcert", "-alias", "broker", "-file", str(crt), "-keystore", str(keystore), *store, "-noprompt"],
    ]
    for step in steps:
        proc = subprocess.run([keytool, *step], capture_output=True, text=True, env=env, check=False)
        if proc.returncode != 0:
            raise ServiceStartError(f"kafka: keytool {step[0]} failed:\n{proc.stdout}{proc.stderr}")
    return pem, keystore, password


@dataclass
class KafkaBroker:
    """One broker+controller process. ``bootstrap_servers`` is what clients connect to: ``host`` (loopback unless a
    test's network namespaces must reach it; plaintext only), its controller stays on loopback."""

    data_dir: Path
    port: int = 0
    controller_port: int = 0
    heap: str = "768m"
    security: Literal["plaintext", "sasl", "ssl"] = "plaintext"
    internal_port: int = 0
    process: ManagedProcess | None = None
    sasl_username: str = "shale"
    sasl_password: str = field(default_factory=lambda: secrets.token_urlsafe(18), repr=False)
    ca_file: Path | None = None
    host: str = "127.0.0.1"
    quick_jit: bool = True
    """Compile with C1 only (``-XX:TieredStopAtLevel=1``): a test's or the demo's broker lives minutes, and C2's
    compilations cost it more CPU than they save (measured 2026-12-02: start 4.7 -> 2.9 CPU-seconds, a 100,000-record
    produce 1.1 -> 0.7; brokers were the integration suite's largest CPU user on 2 cores). Benchmarks pass False: a
    long run's steady state is C2's."""

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def internal_bootstrap(self) -> str:
        return f"127.0.0.1:{self.internal_port}" if self.internal_port else self.bootstrap_servers

    def kafka_config(self) -> dict[str, Any]:
        """The ``[kafka]`` section that reaches this broker (the password included: keep it out of argv)."""
        if self.security == "sasl":
            return {"bootstrap_servers": self.bootstrap_servers, "security_protocol": "SASL_PLAINTEXT",
                    "sasl_mechanism": "SCRAM-SHA-512", "sasl_username": self.sasl_username,
                    "sasl_password": self.sasl_password}
        if self.security == "ssl":
            return {"bootstrap_servers": self.bootstrap_servers, "security_protocol": "SSL",
                    "ssl_ca_file": str(self.ca_file)}
        return {"bootstrap_servers": self.bootstrap_servers}

    def _listeners(self) -> str:
        if self.security == "plaintext":
            return _PLAINTEXT.format(host=self.host, port=self.port, controller_port=self.controller_port)
        if self.host != "127.0.0.1":
            raise ValueError("a secured broker listens on loopback only")
        name = "SASL_PLAINTEXT" if self.security == "sasl" else "SSL"
        text = _SECURED.format(name=name, port=self.port, internal_port=self.internal_port,
                               controller_port=self.controller_port)
        if self.security == "sasl":
            return text + _SASL
        pem, keystore, password = make_tls(self.data_dir / "tls")
        self.ca_file = pem
        return text + _SSL.format(keystore=keystore, password=password)

    def start(self, timeout: float = READY_TIMEOUT_S) -> KafkaBroker:
        jars = fetch_kafka()
        self.port = self.port or free_port(self.host)
        self.controller_port = self.controller_port or free_port()
        if self.security != "plaintext":
            self.internal_port = self.internal_port or free_port()
        log_dir = self.data_dir / "kraft-logs"
        config = self.data_dir / "server.properties"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        config.write_text(_SERVER_PROPERTIES.format(listeners=self._listeners(), controller_port=self.controller_port,
                                                    log_dir=log_dir))
        config.chmod(0o600)  # it may hold the keystore password
        java = java_binary()
        classpath = f"{jars}/*"
        if not (log_dir / "meta.properties").exists():
            # A fresh log directory must be formatted once with a cluster id (KRaft's replacement for ZooKeeper).
            # An id starting with "-" reads as an option to the tool (one start in 64 failed): draw again, as
            # Kafka's own Uuid.randomUuid does.
            cluster_id = "-"
            while cluster_id.startswith("-"):
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
                   *(["-XX:TieredStopAtLevel=1"] if self.quick_jit else []), "-cp", classpath, "kafka.Kafka",
                   str(config)]
        self.process = ManagedProcess("kafka", command, self.data_dir / "kafka.log")
        self.process.start()
        self.process.wait_ready(self._ready, timeout, "accepting clients")
        if self.security == "sasl":
            self._add_scram_user()
        return self

    def _add_scram_user(self) -> None:
        from confluent_kafka.admin import (
            AdminClient,
            ScramCredentialInfo,
            ScramMechanism,
            UserScramCredentialUpsertion,
        )

        admin = AdminClient({"bootstrap.servers": self.internal_bootstrap})
        upsert = UserScramCredentialUpsertion(self.sasl_username, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512,
                                                                                       4096),
                                              self.sasl_password.encode())
        for future in admin.alter_user_scram_credentials([upsert]).values():
            future.result(timeout=30)

    def _ready(self) -> bool:
        internal_host, internal_port = self.internal_bootstrap.rsplit(":", 1)
        if not port_open(self.port, self.host) or not port_open(int(internal_port), internal_host):
            return False
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.internal_bootstrap})
        metadata = admin.list_topics(timeout=2)
        return len(metadata.brokers) > 0

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def kill9(self) -> None:
        if self.process is not None:
            self.process.kill9()
