"""``shale dev up | down | status``: a local Kafka broker, a MinIO server and, with ``--spark-workers N``, a Spark
standalone cluster (a master and N workers), with ``--schema-registry`` a registry and with ``--iceberg-catalog``
an Iceberg REST catalog, all outliving the command.

The state (pids, ports, endpoints) is kept in ``<dir>/state.json`` so that ``status`` and ``down`` find the
processes again; every process runs in its own session, and ``down`` kills each whole process group (a Spark
worker's group holds its executors). ``StackState.env`` is the configuration handed out: the endpoints, the
bucket's credentials, the cached Kafka connector jars on ``spark.jars`` and, with a cluster, ``spark.master``.
``DevStack.exports`` is what may be printed of it: a secret stays in a file of the stack's folder readable by its
owner only (``secrets/<VARIABLE>``), and the printed line reads it from there (``"$(cat FILE)"``).
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path

from shale.dev.iceberg_rest import IcebergRestCatalog
from shale.dev.kafka import KafkaBroker
from shale.dev.minio import MinioServer
from shale.dev.registry import SchemaRegistry
from shale.dev.spark_cluster import SparkStandalone, connector_conf, driver_conf
from shale.process import pid_alive, port_open, stop_process_group

DEV_BUCKET = "shale"
SECRET_ENV = frozenset({"SHALE_BUCKET__SECRET_ACCESS_KEY"})
"""The variables of ``StackState.env`` whose values are secrets: never printed, read from their file."""
Service = KafkaBroker | MinioServer | SparkStandalone | SchemaRegistry | IcebergRestCatalog


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


@dataclass
class StackState:
    kafka_pid: int
    kafka_bootstrap: str
    minio_pid: int
    minio_endpoint: str
    bucket: str
    access_key: str
    secret_key: str
    spark_conf: dict[str, str] = field(default_factory=dict)
    spark_master: str = ""  # spark://127.0.0.1:PORT when a standalone cluster runs
    spark_ui: str = ""
    spark_pids: list[int] = field(default_factory=list)  # the master's, then each worker's
    registry_pid: int = 0  # the Schema Registry (Apicurio), when `up --schema-registry` started one
    registry_url: str = ""
    catalog_pid: int = 0  # the Iceberg REST catalog, when `up --iceberg-catalog` started one
    catalog_url: str = ""

    def env(self) -> dict[str, str]:
        """Environment overrides that point a Shale process at this stack."""
        out = {
            "SHALE_KAFKA__BOOTSTRAP_SERVERS": self.kafka_bootstrap,
            "SHALE_BUCKET__URL": f"s3://{self.bucket}",
            "SHALE_BUCKET__ENDPOINT": self.minio_endpoint,
            "SHALE_BUCKET__ACCESS_KEY_ID": self.access_key,
            "SHALE_BUCKET__SECRET_ACCESS_KEY": self.secret_key,
            "SHALE_BUCKET__ALLOW_HTTP": "true",
            # A TOML inline table, as the configuration loader reads environment values.
            "SHALE_SPARK__CONF": "{" + ", ".join(f"{json.dumps(k)} = {json.dumps(v)}"
                                                 for k, v in sorted(self.spark_conf.items())) + "}",
        }
        if self.spark_master:
            out["SHALE_SPARK__MASTER"] = self.spark_master
        if self.registry_url:
            out["SHALE_INGEST__SCHEMA_REGISTRY__URL"] = self.registry_url
        if self.catalog_url:
            out.update({"SHALE_ICEBERG__CATALOG": "rest", "SHALE_ICEBERG__CATALOG_URI": self.catalog_url})
        return out

    def services(self) -> dict[str, tuple[int, str]]:
        """Each process: its pid and where it is reached."""
        out = {"kafka": (self.kafka_pid, self.kafka_bootstrap), "minio": (self.minio_pid, self.minio_endpoint)}
        if self.registry_pid:
            out["schema-registry"] = (self.registry_pid, self.registry_url)
        if self.catalog_pid:
            out["iceberg-catalog"] = (self.catalog_pid, self.catalog_url)
        if self.spark_pids:
            out["spark-master"] = (self.spark_pids[0], f"{self.spark_master} (status {self.spark_ui})")
            for i, pid in enumerate(self.spark_pids[1:]):
                out[f"spark-worker-{i}"] = (pid, "")
        return out


class DevStack:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.state_file = directory / "state.json"

    def secret_file(self, variable: str) -> Path:
        return self.directory / "secrets" / variable

    def exports(self, state: StackState, extra: dict[str, str] | None = None) -> list[str]:
        """``export NAME=VALUE`` lines for a shell (``eval``), safe to print: a secret's line reads it from its
        file (written here, owner-only, if missing) instead of holding it."""
        lines = []
        for key, value in {**state.env(), **(extra or {})}.items():
            if key in SECRET_ENV:
                path = self.secret_file(key)
                _write_private(path, value)
                lines.append(f'export {key}="$(cat {shlex.quote(str(path.resolve()))})"')
            else:
                lines.append(f"export {key}={shlex.quote(value)}")
        return lines

    def load(self) -> StackState | None:
        try:
            return StackState(**json.loads(self.state_file.read_text()))
        except FileNotFoundError:
            return None

    def up(self, spark_workers: int = 0, schema_registry: bool = False,
           iceberg_catalog: bool = False) -> tuple[StackState, list[str]]:
        """Bring the stack to what is asked, adding to a running one rather than replacing it: return its state and
        a line per service saying what was done ("running", "added", "restarted because ...").

        Kafka and MinIO are the stack's ground: if either is gone, everything is started again (on new ports).
        A running registry or Spark cluster is kept when it is not asked for; a cluster with another number of
        workers than asked is restarted."""
        state = self.load()
        running = self.status(state) if state is not None else {}
        done: list[str] = []
        if state is not None and not (running["kafka"] and running["minio"]):
            gone = " and ".join(name for name in ("kafka", "minio") if not running[name])
            # What the old stack had is started again with it.
            schema_registry = schema_registry or bool(state.registry_pid)
            iceberg_catalog = iceberg_catalog or bool(state.catalog_pid)
            spark_workers = spark_workers or len(state.spark_pids[1:])
            self.down()
            state, running = None, {}
            done.append(f"restarted the stack because {gone} was not running (its ports change)")
        started: list[Service] = []
        try:
            if state is None:
                state = self._start_ground(started)
                if not done:
                    done.append(f"started kafka ({state.kafka_bootstrap}) and minio ({state.minio_endpoint})")
            else:
                done.append("kafka and minio: running")
            if state.registry_pid and running.get("schema-registry"):
                done.append("schema registry: running")
            elif schema_registry or state.registry_pid:
                why = "added" if not state.registry_pid else "restarted because it was not running"
                registry = SchemaRegistry(self.directory / "registry").start()
                started.append(registry)
                assert registry.process is not None
                state.registry_pid, state.registry_url = registry.process.pid, registry.url
                done.append(f"schema registry: {why} ({registry.url})")
            if state.catalog_pid and running.get("iceberg-catalog"):
                done.append("iceberg rest catalog: running")
            elif iceberg_catalog or state.catalog_pid:
                why = "added" if not state.catalog_pid else "restarted because it was not running"
                catalog = self._start_catalog(state)
                started.append(catalog)
                done.append(f"iceberg rest catalog: {why} ({catalog.url})")
            self._bring_spark(state, running, spark_workers, started, done)
        except Exception:
            for service in reversed(started):
                service.stop()
            raise
        _write_private(self.state_file, json.dumps(asdict(state), indent=2))  # it holds the bucket's secret key
        for key, value in state.env().items():
            if key in SECRET_ENV:
                _write_private(self.secret_file(key), value)
        return state, done

    def _start_catalog(self, state: StackState) -> IcebergRestCatalog:
        """Apache Iceberg's REST catalog on loopback (again on its port and with its tables when restarted), its
        warehouse in the stack's bucket."""
        port = int(state.catalog_url.rsplit(":", 1)[1]) if state.catalog_url else 0
        catalog = IcebergRestCatalog(self.directory / "iceberg-catalog", f"s3://{state.bucket}/_shale/iceberg",
                                     state.minio_endpoint, state.access_key, state.secret_key, port=port).start()
        assert catalog.process is not None
        state.catalog_pid, state.catalog_url = catalog.process.pid, catalog.url
        return catalog

    def _start_ground(self, started: list[Service]) -> StackState:
        conf = connector_conf()  # fetches the jars now rather than at the first ingest
        broker = KafkaBroker(self.directory / "kafka").start()
        started.append(broker)
        minio = MinioServer(self.directory / "minio").start()
        started.append(minio)
        minio.create_bucket(DEV_BUCKET)
        assert broker.process is not None
        assert minio.process is not None
        return StackState(broker.process.pid, broker.bootstrap_servers, minio.process.pid, minio.endpoint,
                          DEV_BUCKET, minio.access_key, minio.secret_key, spark_conf=conf)

    def _bring_spark(self, state: StackState, running: dict[str, bool], workers: int,
                     started: list[Service], done: list[str]) -> None:
        have = len(state.spark_pids[1:])
        alive = bool(state.spark_pids) and all(running.get(name, False) for name in state.services()
                                               if name.startswith("spark-"))
        if have and alive and workers in (0, have):
            done.append(f"spark cluster: running ({have} workers)")
            return
        if not workers:
            if have:
                done.append("spark cluster: dropped because it was not running (start it with --spark-workers)")
                state.spark_master, state.spark_ui, state.spark_pids = "", "", []
                state.spark_conf = connector_conf()
            return
        if have:
            for pid in reversed(state.spark_pids):
                if pid_alive(pid):
                    stop_process_group(pid)
            why = (f"restarted because it had {have} workers and {workers} were asked for" if alive
                   else "restarted because it was not running")
        else:
            why = "added"
        cluster = SparkStandalone(self.directory / "spark", workers=workers).start()
        started.append(cluster)
        state.spark_conf = {**connector_conf(), **driver_conf()}
        state.spark_master, state.spark_ui = cluster.master_url, cluster.ui_url
        state.spark_pids = [p.pid for p in cluster.processes()]
        done.append(f"spark cluster: {why} ({workers} workers, {cluster.master_url})")

    def status(self, state: StackState | None = None) -> dict[str, bool]:
        state = state or self.load()
        if state is None:
            return {"kafka": False, "minio": False}
        out = {name: pid_alive(pid) for name, (pid, _) in state.services().items()}
        out["kafka"] = out["kafka"] and port_open(_port(state.kafka_bootstrap))
        out["minio"] = out["minio"] and port_open(_port(state.minio_endpoint))
        if state.registry_url:
            out["schema-registry"] = out["schema-registry"] and port_open(
                int(state.registry_url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1]))
        if state.catalog_url:
            out["iceberg-catalog"] = out["iceberg-catalog"] and port_open(_port(state.catalog_url))
        if state.spark_master:
            out["spark-master"] = out["spark-master"] and port_open(_port(state.spark_master))
        return out

    def down(self) -> list[str]:
        """Stop every process this stack started; return the names of those that were running."""
        state = self.load()
        stopped: list[str] = []
        if state is None:
            return stopped
        for name, (pid, _) in reversed(list(state.services().items())):  # Spark workers first, Kafka last
            if pid_alive(pid):
                stop_process_group(pid)
                stopped.append(name)
        self.state_file.unlink(missing_ok=True)
        for key in SECRET_ENV:
            self.secret_file(key).unlink(missing_ok=True)
        return sorted(stopped)


def _write_private(path: Path, text: str) -> None:
    """Write ``path`` readable and writable by its owner only (its folder created likewise)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # a file left by an older version may have had wider permissions
    with os.fdopen(fd, "w") as out:
        out.write(text)
