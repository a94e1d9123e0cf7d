"""The peer: a Kafka Connect worker (standalone mode) running the Apache Iceberg sink, and a reader of its table.

The worker's classpath is ``src/shale/dev/fetch.py iceberg-kafka-connect`` (``make bench-deps``): Kafka Connect's
runtime, the sink, its transforms, ``iceberg-aws-bundle`` (S3FileIO at MinIO), Hadoop's shaded client and the
SQLite JDBC driver. The sink writes one table through a JDBC catalog on a SQLite file; records are schemaless JSON
(``JsonConverter`` with ``schemas.enable=false``) and the table is created by the sink from the first records
(``iceberg.tables.auto-create-enabled``). ``KafkaMetadataTransform``, the sink's own SMT, adds each record's topic,
partition, offset and timestamp as columns, so that the table can be checked record by record against the topic.

The MinIO secret key is written to the connector's properties file (mode 0600), never on a command line.
"""

from __future__ import annotations

import collections
import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table

from shale.config import BucketConfig
from shale.dev.fetch import ICEBERG_KC_VERSION, KAFKA_VERSION, fetch_iceberg_kafka_connect
from shale.dev.kafka import java_binary
from shale.process import ManagedProcess, free_port

NAMESPACE = "bench"
DEFAULT_COMMIT_INTERVAL_MS = 300_000
"""``iceberg.control.commit.interval-ms``: "Commit interval in msec, default is 300,000 (5 min)"."""
META = "_kafka_metadata_"
SINK_CATALOG = "iceberg"
"""The sink's catalog name (``iceberg.catalog``, default "iceberg"): Iceberg's JDBC catalog keys tables by it."""
logging.getLogger("pyiceberg.catalog.sql").setLevel(logging.ERROR)  # "v0 schema": Iceberg's JDBC catalog layout

_LOG4J = """\
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c{{1}})%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.kafka.name = org.apache.kafka
logger.kafka.level = WARN
logger.connect.name = org.apache.kafka.connect
logger.connect.level = INFO
logger.iceberg.name = org.apache.iceberg
logger.iceberg.level = INFO
"""


@dataclass
class IcebergSink:
    """One connector: its name (also its table's and its control topic's), the topic it reads and its commit
    interval (None: the sink's default)."""

    name: str
    topic: str
    commit_interval_ms: int | None = None
    offset_flush_ms: int | None = None
    """The worker's ``offset.flush.interval.ms`` (None: Connect's default, 60 s). It also bounds how long the task
    waits in an idle poll before ``put()``, and the sink's worker answers a commit request only inside ``put()``:
    with no new records, a commit waits for it (the sink's commit then times out after 30 s and the files go into
    a later commit)."""

    @property
    def table(self) -> str:
        return f"{NAMESPACE}.{self.name.replace('-', '_')}"

    @property
    def control_topic(self) -> str:
        return f"control-iceberg-{self.name}"

    def properties(self, catalog_db: Path, warehouse: str, bucket: BucketConfig) -> dict[str, str]:
        props = {
            "name": self.name,
            "connector.class": "org.apache.iceberg.connect.IcebergSinkConnector",
            "tasks.max": "1",
            "topics": self.topic,
            "iceberg.tables": self.table,
            "iceberg.tables.auto-create-enabled": "true",
            "iceberg.control.topic": self.control_topic,
            "iceberg.catalog.catalog-impl": "org.apache.iceberg.jdbc.JdbcCatalog",
            "iceberg.catalog.uri": f"jdbc:sqlite:{catalog_db}",
            "iceberg.catalog.warehouse": warehouse,
            "iceberg.catalog.io-impl": "org.apache.iceberg.aws.s3.S3FileIO",
            "iceberg.catalog.s3.endpoint": bucket.endpoint or "",
            "iceberg.catalog.s3.path-style-access": "true",
            "iceberg.catalog.s3.access-key-id": bucket.access_key_id or "",
            "iceberg.catalog.s3.secret-access-key": bucket.secret_access_key.get_secret_value(),
            "iceberg.catalog.client.region": bucket.region,
            "transforms": "kafka",
            "transforms.kafka.type": "org.apache.iceberg.connect.transforms.KafkaMetadataTransform",
        }
        if self.commit_interval_ms is not None:
            props["iceberg.control.commit.interval-ms"] = str(self.commit_interval_ms)
        return props


def _write_properties(path: Path, values: dict[str, str]) -> Path:
    path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    path.chmod(0o600)
    return path


@dataclass
class ConnectWorker:
    """``ConnectStandalone`` with one Iceberg sink connector; restartable (its offsets file stays in ``work``)."""

    work: Path
    bootstrap: str
    bucket: BucketConfig
    sink: IcebergSink
    heap: str = "1g"
    process: ManagedProcess | None = None
    starts: int = 0

    @property
    def catalog_db(self) -> Path:
        return self.work / "catalog.db"

    @property
    def warehouse(self) -> str:
        return f"s3://{self.bucket.url.removeprefix('s3://')}/iceberg-kc"

    @property
    def log_path(self) -> Path:
        return self.work / "connect.log"

    def start(self) -> ConnectWorker:
        jars = fetch_iceberg_kafka_connect()
        self.work.mkdir(parents=True, exist_ok=True)
        worker = _write_properties(self.work / "worker.properties", {
            "bootstrap.servers": self.bootstrap,
            "key.converter": "org.apache.kafka.connect.storage.StringConverter",
            "value.converter": "org.apache.kafka.connect.json.JsonConverter",
            "value.converter.schemas.enable": "false",
            "offset.storage.file.filename": str(self.work / "connect.offsets"),
            "listeners": f"http://127.0.0.1:{free_port()}",
            "plugin.discovery": "only_scan",
            **({"offset.flush.interval.ms": str(self.sink.offset_flush_ms)} if self.sink.offset_flush_ms else {}),
        })
        connector = _write_properties(self.work / "iceberg-sink.properties",
                                      self.sink.properties(self.catalog_db, self.warehouse, self.bucket))
        log4j = self.work / "log4j2.properties"
        log4j.write_text(_LOG4J.format(log=self.log_path))
        command = [java_binary(), f"-Xmx{self.heap}", "-XX:+UseG1GC", "-Djava.awt.headless=true",
                   f"-Dlog4j2.configurationFile={log4j}", "-cp", f"{jars}/*",
                   "org.apache.kafka.connect.cli.ConnectStandalone", str(worker), str(connector)]
        self.process = ManagedProcess(f"connect-{self.sink.name}", command, self.work / "connect.out")
        self.process.start()
        self.starts += 1
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.alive()

    def kill9(self) -> None:
        if self.process is not None:
            self.process.kill9()

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(timeout=30)

    def log_excerpt(self, lines: int = 30) -> str:
        """The worker's log lines about its start, the sink's leader election, commits that wrote data, commit
        timeouts, warnings and errors: the first third and the last two thirds of ``lines``."""
        text = "\n".join(p.read_text(errors="replace") for p in (self.log_path, self.work / "connect.out")
                         if p.exists())
        wanted = re.compile(r"Kafka Connect started|elected leader|committed to [1-9]\d* table|Commit timeout|"
                            r"ERROR|WARN|Exception|Stopping|Exiting")
        picked = [line[:400] for line in text.splitlines() if wanted.search(line)]
        if len(picked) <= lines:
            return "\n".join(picked)
        head = lines // 3
        return "\n".join([*picked[:head], f"... {len(picked) - lines} lines ...", *picked[-(lines - head):]])

    def describe(self) -> str:
        return (f"Kafka Connect {KAFKA_VERSION} (ConnectStandalone) with the Apache Iceberg sink "
                f"{ICEBERG_KC_VERSION}, connector {self.sink.name}")


@dataclass
class SinkTable:
    """Reads the sink's table through pyiceberg's SQL catalog on the same SQLite file (Iceberg's JDBC catalog
    layout) and S3 at MinIO; data files are read once each (they are immutable; the sink only appends)."""

    catalog_db: Path
    bucket: BucketConfig
    table_name: str
    read_files: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    _catalog: SqlCatalog | None = None

    def _load(self) -> Table | None:
        """The table as the catalog has it now (None before the sink created it)."""
        if self._catalog is None:
            if not self.catalog_db.exists():
                return None
            self._catalog = SqlCatalog(
                SINK_CATALOG, uri=f"sqlite:///{self.catalog_db}", warehouse="s3://unused", init_catalog_tables="false",
                **{"s3.endpoint": self.bucket.endpoint or "", "s3.access-key-id": self.bucket.access_key_id or "",
                   "s3.secret-access-key": self.bucket.secret_access_key.get_secret_value(),
                   "s3.region": self.bucket.region, "s3.force-virtual-addressing": "false"})
        try:
            return self._catalog.load_table(self.table_name)
        except NoSuchTableError:
            self._catalog = None  # the worker may still be creating the catalog's own tables
            return None
        except Exception:
            # pyiceberg picks its schema version when it connects; if the worker's tables were half made then,
            # every query fails: connect again next time.
            self._catalog = None
            raise

    def committed_records(self) -> int:
        """``total-records`` of the current snapshot (0 before the first commit)."""
        try:
            table = self._load()
        except Exception as exc:  # SQLite busy while the worker writes, or its tables half made: ask again
            self.errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")
            return -1
        snapshot = table.current_snapshot() if table is not None else None
        if snapshot is None or snapshot.summary is None:
            return 0
        return int(snapshot.summary.get("total-records", "0"))

    def snapshots(self) -> int:
        table = self._load()
        return 0 if table is None else len(table.metadata.snapshots)

    def new_rows(self, columns: list[str]) -> pa.Table | None:
        """The rows of the data files committed since the last call (None before the first commit)."""
        table = self._load()
        if table is None or table.current_snapshot() is None:
            return None
        pieces = []
        for task in table.scan().plan_files():
            path = task.file.file_path
            if path in self.read_files:
                continue
            with table.io.new_input(path).open() as f:
                pieces.append(pq.read_table(f, columns=columns))
            self.read_files.add(path)
        return pa.concat_tables(pieces) if pieces else pa.table({c: [] for c in columns})

    def all_rows(self, columns: list[str]) -> pa.Table:
        self.read_files.clear()
        rows = self.new_rows(columns)
        return rows if rows is not None else pa.table({c: [] for c in columns})


def multiset_check(pairs: list[tuple[int, int]], end_offsets: dict[int, int]) -> dict[str, int]:
    """Against a topic whose partition p holds offsets 0 .. end_offsets[p] - 1: rows, missing records and
    duplicates (rows beyond the first of the same record), and rows of offsets the topic does not hold."""
    counts = collections.Counter(pairs)
    expected = {(p, o) for p, end in end_offsets.items() for o in range(end)}
    return {"rows": len(pairs), "missing": len(expected - set(counts)),
            "duplicates": sum(n - 1 for n in counts.values() if n > 1),
            "unexpected": len(set(counts) - expected)}


def wait_for(condition: Any, timeout: float, what: str, worker: ConnectWorker | None = None) -> float:
    """Poll ``condition`` every 0.25 s; the seconds it took. Fails with the worker's log if the worker died."""
    began = time.monotonic()
    while not condition():
        if worker is not None and not worker.alive():
            raise RuntimeError(f"the Connect worker exited while waiting for {what}:\n{worker.log_excerpt(60)}")
        if time.monotonic() - began > timeout:
            extra = f"\n{worker.log_excerpt(60)}" if worker is not None else ""
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}{extra}")
        time.sleep(0.25)
    return time.monotonic() - began

