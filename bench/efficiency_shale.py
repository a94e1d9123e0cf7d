"""The efficiency benchmark's ``shale run`` (``bench.freshness.deployment``) and how its CPU is told apart from
the services beside it: what one case's window cost, by service and by kind of process."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import efficiency_cpu as cpu
from bench import freshness as fr
from shale.config import BucketConfig, ShaleConfig, load_config
from shale.dev import connector_conf
from shale.kafka import offset_bounds
from shale.launcher import lower_autogroup_priority
from shale.metastore import MetastoreClient
from shale.process import free_port

TIMEOUT = 1800.0
POLL = 0.5
PARTITIONS = 4
"""Partitions of every topic of the benchmark."""


@dataclass(frozen=True)
class ServiceRoots:
    """The processes the benchmark starts beside the systems it measures, counted apart."""

    roots: dict[str, int]

    @classmethod
    def of(cls, broker: Any, bucket: BucketConfig, registry: Any) -> ServiceRoots:
        """The broker's and the registry's pids; MinIO's is this process's child running ``minio`` (the bucket
        fixture keeps its server to itself)."""
        snap, me = cpu.snapshot(), os.getpid()
        minio = [pid for pid, p in snap.processes.items() if p.parent == me and "minio" in p.command.split(" ")[0]]
        if len(minio) != 1:
            raise RuntimeError(f"expected one MinIO process under this one for {bucket.endpoint}, found {minio}")
        return cls({"kafka": broker.process.pid, "minio": minio[0], "registry": registry.process.pid})

    @property
    def services(self) -> list[int]:
        return list(self.roots.values())

    def apart(self, window: cpu.Window) -> dict[str, float]:
        """CPU seconds of each service, and the whole machine's busy cores, in the window."""
        assert window.after is not None
        out = {f"cpu_s_{name}": round(window.total([pid]), 2) for name, pid in self.roots.items()}
        out["machine_busy_cores"] = round((window.after.busy - window.before.busy) /
                                          (window.after.at - window.before.at), 2)
        return out


def kind_of(command: str) -> str:
    """``jvm``, ``python_workers`` (Spark's Python daemon, ``shale.spark_daemon``, and the workers it forks) or
    ``drivers`` (the services' Python processes: ``shale run``, the metastore, the groups' drivers, the compaction
    worker)."""
    if command.split(" ", 1)[0].endswith("java"):
        return "jvm"
    return "python_workers" if "spark_daemon" in command or "pyspark.daemon" in command else "drivers"


@dataclass
class CaseRun:
    topic: str
    records: int
    seconds: float
    shale_cpu: float
    by_service: dict[str, float] = field(default_factory=dict)
    by_kind: dict[str, float] = field(default_factory=dict)
    apart: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {k: round(v, 2) if isinstance(v, float) else v for k, v in asdict(self).items()}


@dataclass
class Deployment:
    """A running ``shale run`` of the benchmark's topics; its config, its metastore's client and its pids."""

    work: Path
    config: ShaleConfig
    client: MetastoreClient
    root: int
    roots: ServiceRoots

    @classmethod
    @contextmanager
    def start(cls, work: Path, bootstrap: str, bucket: BucketConfig, registry_url: str, topics: list[str],
              roots: ServiceRoots) -> Iterator[Deployment]:
        work.mkdir(parents=True)
        port = free_port()
        file = write_config(work, bootstrap, bucket, registry_url, topics, port)
        secret = bucket.secret_access_key.get_secret_value()
        config = load_config(file, env={fr.SECRET_ENV: secret})
        services = 1 + len(config.run.ingest_groups) + config.run.compaction_workers
        with fr.deployment(file, work, secret, services) as run:
            token = (work / "metastore" / "admin.token").read_text().strip()
            client = MetastoreClient([f"http://127.0.0.1:{port}"], deadline=30, token=token)
            yield cls(work, config, client, run.pid, roots)

    def services(self) -> dict[str, int]:
        manifest = json.loads((self.work / "logs" / "deployment.json").read_text())
        return {name: s["pid"] for name, s in manifest["services"].items()}

    def group_pids(self) -> dict[str, int]:
        return {name.removeprefix("ingest-"): pid for name, pid in self.services().items()
                if name.startswith("ingest-")}

    def tree_roots(self) -> list[int]:
        return [self.root, *self.services().values()]

    def wait_committed(self, topic: str, records: int) -> None:
        """Until ``topic`` holds ``records`` records up to its last stable offsets (a transaction's commit markers
        reach the partitions after its producer's commit returns), then until every group's committed offsets of it
        reach those offsets."""
        deadline = time.monotonic() + TIMEOUT
        while True:
            bounds = offset_bounds(self.config.kafka, [(topic, p) for p in range(PARTITIONS)])
            if sum(end - start for start, end in bounds.values()) >= records:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{topic}: {records:,} records not visible after {TIMEOUT:.0f} s: {bounds}")
            time.sleep(0.1)
        ends = {p: end for (_, p), (_, end) in bounds.items() if end}
        groups = self.config.run.ingest_groups

        def behind() -> list[str]:
            try:
                rows = [o for o in self.client.offsets() if o.topic == topic]
            except Exception:  # the metastore busy answering: ask again
                return ["(metastore)"]
            done = {(o.group, o.partition) for o in rows if o.committed_end >= ends.get(o.partition, 0)}
            return [f"{g}/{p}" for g in groups for p in ends if (g, p) not in done]

        while late := behind():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{topic}: {records:,} records not committed by {late} after {TIMEOUT:.0f} s")
            time.sleep(POLL)

    def unnice(self) -> None:
        """Every thread of the deployment, and each service's scheduler autogroup, at nice 0. ``shale run`` starts
        the backup group and the compaction workers at ``BACKGROUND_NICE`` so that the partition group wins on a
        busy machine; on this shared machine the backup group then waited minutes behind other engineers' work for
        each case. CPU seconds per record do not depend on it. Threads started later inherit their creator's nice.
        """
        for pid in self.services().values():  # the session's scheduler autogroup, where the kernel has them
            lower_autogroup_priority(pid, 0)
        snap = cpu.snapshot()
        for pid in cpu.members({p: s.parent for p, s in snap.processes.items()}, self.tree_roots()):
            for task in Path(f"/proc/{pid}/task").glob("*"):
                with contextlib.suppress(OSError):  # exited meanwhile
                    os.setpriority(os.PRIO_PROCESS, int(task.name), 0)

    def idle_cores(self, seconds: float) -> float:
        with cpu.sampled() as window:
            time.sleep(seconds)
        return window.total(self.tree_roots()) / seconds

    def measure(self, topic: str, records: int, commit: Callable[[], object]) -> CaseRun:
        """``commit`` makes the case's records visible; the window ends when both groups committed them."""
        self.unnice()
        roots = self.tree_roots()
        with cpu.sampled() as window:
            commit()
            self.wait_committed(topic, records)
        assert window.after is not None
        total = window.total(roots)
        if total <= 0:
            raise RuntimeError(f"{topic}: no CPU seen in shale run's process tree {roots}: is it running?")
        services = {name: round(window.total([pid]), 2) for name, pid in self.services().items()}
        kinds = {k: round(v, 2) for k, v in sorted(window.used(roots, key=lambda p: kind_of(p.command)).items())}
        return CaseRun(topic, records, window.after.at - window.before.at, total, services, kinds,
                       self.roots.apart(window))


def write_config(work: Path, bootstrap: str, bucket: BucketConfig, registry_url: str, topics: list[str],
                 port: int) -> Path:
    """The freshness benchmark's config (``fr.write_config``) with the benchmark's topics and a parser per format;
    the bucket's secret key is not in it (the children get it through their environment)."""
    def toml(value: Any) -> str:
        return json.dumps(value)

    time_field = {"time_field": "ts", "label_fields": ["level"]}
    parsers = [("eff-avro-.*", "avro", time_field), ("eff-protobuf-.*", "protobuf", time_field),
               (".*", "json", {**time_field, "time_format": "epoch_ms", "fields": ["host", "msg"]})]
    lines = ["[bucket]", f"url = {toml(bucket.url)}", f"endpoint = {toml(bucket.endpoint)}",
             f"access_key_id = {toml(bucket.access_key_id)}", "allow_http = true",
             "[kafka]", f"bootstrap_servers = {toml(bootstrap)}",
             "[metastore]", f"listen = {toml(f'127.0.0.1:{port}')}", f"data_dir = {toml(str(work / 'metastore'))}",
             "[run]", "metrics_base_port = 0",
             "[ingest]", f"topics = {toml(topics)}", 'backup_trigger_interval = "5s"',
             "[ingest.schema_registry]", f"url = {toml(registry_url)}",
             "[spark.conf]", f'"spark.jars" = {toml(connector_conf()["spark.jars"])}']
    for pattern, parser, options in parsers:
        inline = ", ".join(f"{k} = {toml(v)}" for k, v in options.items())
        lines += ["[[ingest.parsers]]", f"topic_pattern = {toml(pattern)}", f"parser = {toml(parser)}",
                  f"options = {{{inline}}}"]
    path = work / "shale.toml"
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o600)
    return path
