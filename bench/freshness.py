"""Freshness: how long after a record is produced it can be queried, through the metastore and through the
bucket index, on default settings and in the low-latency profile; and how many objects that costs per hour.

A producer process (confluent-kafka, rate-limited in 10 ms ticks, ``linger.ms`` 5) writes 20,000 JSON records/s to
a topic of 8 partitions into a real ``shale run`` deployment: a child process started with a config file, which
starts the metastore (embedded state, with the status page), both ingest groups and a compaction worker, each its
own process and Spark application (``spark.master`` default ``local[*]``); MinIO is the bucket, its secret key
goes to the children through their environment, never on a command line. The config holds only what must be
said (bucket, Kafka, topic and JSON parser, the cached connector jars, free ports); every tuning key is at its
default. Once the deployment has committed a first 2,000 records, the producer runs for 60 s (``WARMUP``: the JVMs
compile the Kafka-to-Arrow path and the groups reach their steady batch size; the first minute after start-up is
not what a running deployment shows) and then 120 s more (``DURATION``), the measured window. In the window, every
100 ms one record per partition is a sample: its JSON ``ts`` (its event time) is the wall-clock time of its
``produce()`` call and its ``level`` is ``probe`` (9,600 samples). The other records are about 130 bytes. Samples
are at most ``MAX_SAMPLES_PER_S`` (2,560, 256 partitions every 100 ms): over more partitions each partition's come
further apart (2,048 partitions: every 0.8 s), so that most records are still the load, not samples.

Three readers in the benchmark process record when each sample first becomes visible:

* metastore: every 250 ms, the ``shale query`` Python API (``run_query``) with the source the CLI picks for the
  deployment's config (``--source metastore``: a read-only view of the metastore's state), selector
  ``{level="probe"}``. Blocks are immutable, so each poll reads only the blocks it has not read before (a
  wrapper of the source drops them): polling costs the same at the end of the run as at its start. A sample is
  visible at the end of the first poll whose rows hold it.
* bucket index: the same every 250 ms through ``--source bucket-index``: a ``BucketIndexReader`` refreshed before
  every poll (one GET of ``<tenant>/bucket-index.json.gz``), i.e. a querier whose refresh interval is the poll
  interval. The metastore leader rewrites a changed tenant's index ``bucket_index.debounce`` after it sees the
  change (it looks every ``debounce``).
* baseline (the floor): a plain confluent-kafka consumer of the topic: produce-to-Kafka-visible latency.

The run fails unless the producer kept at least 97 % of the rate (the achieved rate is reported) and every sample
became visible on every path.

The two profiles run in three interleaved rounds (default, low latency, default, low latency, ...), each a fresh
deployment, topic and bucket prefix on the same Kafka and MinIO; for each profile the round with the lowest p99
through the metastore is reported, and every round's p99 is in the notes (this machine's timings vary from run to
run).

Cold start (issue 32): before the rounds, one more fresh deployment on defaults is measured from its start. The
topic holds ``WARMUP_RECORDS`` records before ``shale run`` is launched (a restart finds records waiting); once
every ingest group has logged "ingest started" (its driver warmed, its lease taken), the producer runs for
``COLD_DURATION`` s (90 s) with samples from its first tick, and every sample counts: ``p99_ms_from_start``. From
the partition group's "batch committed" lines: ``first_batch_seconds`` (its first batch with records: read, write
and commit) and ``steady_batch_seconds`` (the median batch that began in the second half of the producing time);
``start_seconds`` is from the launch to its "ingest started". The notes give the warm-up's phases and the first
batches' task time by phase (``task.PHASES``, summed over tasks that run two at a time). When the machine cannot
keep up with the rate, batches grow through the run and the "steady" batch is a large one: read the ratio with
the records of each batch (notes). ``p99_ms_low_latency_worst_round`` is the highest p99 of the low-latency
rounds (``FRESHNESS_ROUNDS``, default 3). ``FRESHNESS_COLD_ONLY=1`` runs only cold starts and prints them (with
``FRESHNESS_BASELINE_SRC``, another version's ``src`` interleaved: the before/after comparison).

Objects per hour: every object of every block in the bucket is listed (``BlockFetcher``, both groups).
``objects_per_hour_l0`` = objects (data files and meta.json) of every level-0 block written while the producer
ran x 3600 / 180 s. ``objects_per_hour_after_compaction`` = objects of the blocks still live (Healthy: not
compacted into another, not marked) once the compactor in ``shale run``, which compacts during the run, has had no
job left for 10 s after it, x 3600 / 180 s. This is an upper bound: queues shorter than a job
(``compaction.blocks_per_job``: 20 blocks at level 0, 10 above) wait up to ``compaction.max_age`` (1 h), and in an
hour of steady load the level-1 outputs would compact 10 to 1 again, which a three-minute run cannot show.
Compacted blocks stay in the bucket for ``block.delete_delay`` (2 h) before they are deleted: a constant, not a
growth per hour.

Low-latency profile (``LOW_LATENCY``; docs/OPERATING.md, "Configuration"): ``ingest.trigger_interval = "0s"`` (the
next batch is planned as soon as the last one committed), ``bucket_index.debounce = "1s"``, and ``run.ingest_groups
= ["partition"]``: on this 2-core machine the partition group, the one queries read, gets the machine (with the
metastore and the compaction worker); the backup group runs on another machine (``run.services``, docs/DEPLOY.md).
With both groups on two cores, planning batches back to back saturates the machine (the partition group alone then
uses more than one core) and latency grows instead.

Where the time goes (appended below for each run): from the partition group's "batch committed" log lines in the
window, the gap before a batch (the trigger wait and the plan), the Spark batch (reading Kafka, parsing, writing
the blocks: one task per partition, two at a time) and the commit (``CommitIngestBatch`` over HTTP and the
bucket-index delta); the readers' mean poll (a sample also waits half a poll interval on average); and the cores
each process used in the window (whole sessions: Spark JVMs and Python workers included; "other" is the rest of
the machine's busy time, other users of this shared machine; "steal" is time the hypervisor gave to other virtual
machines; ``cores_other_*`` is their sum). A record waits on average half a cycle (gap + batch) for the next plan,
then the batch it is in, then the poll.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from tests.integration.ingest_helpers import create_topic
from tests.producing import CheckedProducer

from bench.common import ROOT, CpuSnapshot, cpu_snapshot, progress, write_result
from bench.services import kafka_broker, minio_bucket
from shale.block import BlockFetcher, BlockMeta, BlockState
from shale.bucketindex import BucketIndexReader
from shale.config import BucketConfig, ShaleConfig, load_config
from shale.dev import connector_conf
from shale.errors import ShaleError
from shale.metastore import MetastoreClient, read_only_index
from shale.metastore.api.server import state_path
from shale.objstore import Bucket, BucketReader, open_bucket
from shale.process import ManagedProcess, free_port
from shale.query import Query, run_query
from shale.query.plan import BlockSource
from shale.query.sources import BucketIndexSource, open_source

DURATION = 120.0
RATE = 20_000
PARTITIONS = 8
SAMPLE_INTERVAL = 0.1
MAX_SAMPLES_PER_S = 2_560
POLL_INTERVAL = 0.25
TICK = 0.01
WARMUP_RECORDS = 2_000
WARMUP = 60.0
ROUNDS = int(os.environ.get("FRESHNESS_ROUNDS", "3"))
COLD_DURATION = 90.0
COLD_ONLY = os.environ.get("FRESHNESS_COLD_ONLY", "") == "1"
MIN_RATE_SHARE = 0.97
TENANT = "default"
SECRET_ENV = "SHALE_BUCKET__SECRET_ACCESS_KEY"
LOW_LATENCY = {"ingest": {"trigger_interval": "0s"}, "bucket_index": {"debounce": "1s"},
               "run": {"ingest_groups": ["partition"]}}
"""The low-latency profile: the settings it changes from the defaults (docs/OPERATING.md, "Configuration")."""


# -- bookkeeping -------------------------------------------------------------------------------------------------

def percentile(values: Sequence[float], p: float) -> float:
    """The nearest-rank percentile (``p`` in (0, 100]): the smallest value with at least p % of the values at or
    below it. Raises ``ValueError`` on no values."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


@dataclass
class Visibility:
    """When each sample (topic partition, offset) was first seen by one reader, and its latency from produce.
    Thread-safe: the consumer and the pollers record from their own threads."""

    first_ms: dict[tuple[int, int], float] = field(default_factory=dict)
    latency_ms: dict[tuple[int, int], float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def saw(self, sample: tuple[int, int], produced_ms: float, now_ms: float) -> None:
        """Record a sighting; only the first one of a sample counts."""
        with self._lock:
            if sample not in self.first_ms:
                self.first_ms[sample] = now_ms
                self.latency_ms[sample] = now_ms - produced_ms

    def __len__(self) -> int:
        with self._lock:
            return len(self.first_ms)

    def missing(self, expected: set[tuple[int, int]]) -> set[tuple[int, int]]:
        with self._lock:
            return expected - set(self.first_ms)

    def summary(self) -> dict[str, float]:
        """p50, p99 and max latency in whole milliseconds."""
        with self._lock:
            values = list(self.latency_ms.values())
        return {"p50": round(percentile(values, 50)), "p99": round(percentile(values, 99)),
                "max": round(max(values))}


# -- the producer (its own process, so that its pace does not depend on this one's threads) ----------------------

def produce_steadily(bootstrap: str, topic: str, rate: int, warmup: float, duration: float,
                     partitions: int = PARTITIONS) -> dict[str, Any]:
    """Produce ``rate`` records/s round-robin over ``partitions`` for ``warmup + duration`` s in ticks of 10 ms, and
    after ``warmup`` one sample per partition every 100 ms (further apart past ``MAX_SAMPLES_PER_S``); return the
    counts, the elapsed seconds and the largest lag behind schedule."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "compression.type": "lz4",
                         "queue.buffering.max.messages": 1_000_000})
    errors: list[str] = []

    def on_delivery(err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    def send(value: bytes, partition: int) -> None:
        while True:
            try:
                producer.produce(topic, value, partition=partition, on_delivery=on_delivery)
                return
            except BufferError:
                producer.poll(0.01)

    filler = "x" * 80
    sent = samples = 0
    behind = 0.0
    start = time.monotonic()
    next_sample = start + warmup
    interval = max(SAMPLE_INTERVAL, partitions / MAX_SAMPLES_PER_S)
    while (now := time.monotonic()) < start + warmup + duration:
        ms = int(time.time() * 1000)
        if now >= next_sample:
            for p in range(partitions):
                send(b'{"ts": %d, "level": "probe", "msg": "sample %d"}' % (ms, samples), p)
                samples += 1
                sent += 1
            next_sample += interval
        due = int((now - start) * rate)
        behind = max(behind, (due - sent) / rate)
        value = b'{"ts": %d, "level": "INFO", "msg": "%s"}' % (ms, filler.encode())
        while sent < due:
            send(value, sent % partitions)
            sent += 1
        producer.poll(0)
        time.sleep(max(0.0, TICK - (time.monotonic() - now)))
    elapsed = time.monotonic() - start
    left = producer.flush(60)
    return {"sent": sent, "samples": samples, "elapsed": elapsed, "undelivered": left, "errors": errors[:3],
            "max_behind_s": behind, "cpu_s": time.process_time()}


# -- the readers --------------------------------------------------------------------------------------------------

def _floor_consumer(bootstrap: str, topic: str, book: Visibility, stop: threading.Event,
                    partitions: int = PARTITIONS) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex}",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    try:
        while not stop.is_set():
            for message in consumer.consume(10_000, timeout=0.05):
                value = message.value()
                if message.error() is None and value is not None and b'"probe"' in value:
                    book.saw((message.partition(), message.offset()), json.loads(value)["ts"], time.time() * 1000)
    finally:
        consumer.close()


class _NewBlocks:
    """A source that answers only the blocks this reader has not read yet: blocks are immutable, so a poll needs
    to read only those. Compacted blocks are read too: their sources may have been compacted before a poll (or an
    index write) listed them."""

    def __init__(self, source: BlockSource, done: set[str]) -> None:
        self.source = source
        self.done = done
        self.listed: list[str] = []

    def query_blocks(self, tenants: Sequence[str], start: int, end: int, selector: str = "",
                     group: str | None = None) -> list[BlockMeta]:
        blocks = [b for b in self.source.query_blocks(tenants, start, end, selector, group)
                  if b.id not in self.done]
        self.listed = [b.id for b in blocks]
        return blocks

    def generation_rules(self, tenant: str) -> list[tuple[str, int, int, int]]:
        return self.source.generation_rules(tenant)


@dataclass
class Poller:
    """Polls one source like ``shale query --tenant default '{level="probe"}'`` every ``POLL_INTERVAL``."""

    name: str
    source: BlockSource
    bucket: BucketReader
    book: Visibility
    before_poll: Callable[[], None] = lambda: None
    query_seconds: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def loop(self, stop: threading.Event) -> None:
        done: set[str] = set()
        start = int(time.time() * 1000) - 3_600_000
        while not stop.is_set():
            began = time.monotonic()
            try:
                self.before_poll()
                new = _NewBlocks(self.source, done)
                query = Query(TENANT, start, int(time.time() * 1000) + 3_600_000, '{level="probe"}',
                              columns=["partition", "offset", "event_time"])
                table = run_query(query, new, self.bucket).read_all()
                now = time.time() * 1000
                produced = pc.cast(table.column("event_time"), "int64").to_pylist()  # microseconds
                for p, o, us in zip(table.column("partition").to_pylist(), table.column("offset").to_pylist(),
                                    produced, strict=True):
                    self.book.saw((p, o), us / 1000, now)
                done.update(new.listed)
            except ShaleError as exc:  # before the first commit: no state, no index yet
                self.errors.append(str(exc)[:200])
            self.query_seconds.append(time.monotonic() - began)
            stop.wait(max(0.0, POLL_INTERVAL - (time.monotonic() - began)))


# -- the deployment -----------------------------------------------------------------------------------------------

def _toml(value: Any) -> str:
    return json.dumps(value)


JSON_LOGS = ['[[ingest.parsers]]', 'parser = "json"',
             'options = {time_field = "ts", time_format = "epoch_ms", label_fields = ["level"], fields = ["msg"]}']
"""The benchmark records' parser rule, as TOML lines."""


def write_config(work: Path, bootstrap: str, bucket: BucketConfig, topic: str, port: int,
                 profile: dict[str, dict[str, Any]], parser: Sequence[str] = JSON_LOGS) -> Path:
    """The deployment's config: where things are, the topic and its parser (``parser``: the rule's TOML lines), and
    the profile's settings. The bucket's secret key is not in it (the children get it through their
    environment)."""
    sections: dict[str, dict[str, Any]] = {
        "bucket": {"url": bucket.url, "endpoint": bucket.endpoint, "access_key_id": bucket.access_key_id,
                   "allow_http": True},
        "kafka": {"bootstrap_servers": bootstrap},
        "metastore": {"listen": f"127.0.0.1:{port}", "data_dir": str(work / "metastore")},
        "run": {"metrics_base_port": 0},  # free ports: not a performance setting
        "ingest": {"topics": [topic]},
    }
    for section, values in profile.items():
        sections.setdefault(section, {}).update(values)
    lines: list[str] = []
    for section, values in sections.items():
        lines.append(f"[{section}]")
        lines += [f"{key} = {_toml(value)}" for key, value in values.items()]
    lines += ["[spark.conf]", f'"spark.jars" = {_toml(connector_conf()["spark.jars"])}',  # cached, no Maven
              *parser]
    path = work / "shale.toml"
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o600)
    return path


@contextmanager
def deployment(config_file: Path, work: Path, secret: str, services: int,
               python_path: str | None = None) -> Iterator[ManagedProcess]:
    """``shale --config FILE run``, until every service is started; stopped with SIGTERM afterwards. With
    ``python_path``, the deployment imports ``shale`` from there (another version of the code)."""
    env = {**os.environ, SECRET_ENV: secret, **({"PYTHONPATH": python_path} if python_path else {})}
    for name in ("SHALE_FAILPOINTS", "SHALE_FAILPOINT_DIR", "SPARK_LOCAL_IP", "PYSPARK_PYTHON"):
        env.pop(name, None)
    run = ManagedProcess("shale-run", [sys.executable, "-m", "shale.cli", "--config", str(config_file),
                                       "--log-format", "json", "run", "--log-dir", str(work / "logs")],
                         work / "run.log", env=env, cwd=work)
    run.start()
    manifest = work / "logs" / "deployment.json"
    try:
        _wait(lambda: manifest.exists() and len(json.loads(manifest.read_text())["services"]) == services
              and all(s["pid"] for s in json.loads(manifest.read_text())["services"].values()), 120,
              "the deployment to start", run)
        yield run
    finally:
        run.stop(timeout=60)


def _wait(condition: Callable[[], object], timeout: float, what: str, run: ManagedProcess | None = None) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if condition():
                return
        except (OSError, ValueError, ShaleError):
            pass  # not there yet
        if run is not None and not run.alive():
            raise RuntimeError(f"shale run exited while waiting for {what}:\n{run.log_path.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


def count_objects(bucket: BucketReader) -> dict[str, int]:
    """Objects of level-0 blocks (marked or not) and of live (Healthy) blocks, and the blocks of each."""
    views = BlockFetcher(bucket, sync_delay=0).sync(TENANT).blocks.values()
    level0 = [v for v in views if v.meta is not None and v.meta.level == 0]
    live = [v for v in views if v.state == BlockState.HEALTHY]
    return {"l0_objects": sum(len(v.objects) for v in level0), "l0_blocks": len(level0),
            "live_objects": sum(len(v.objects) for v in live), "live_blocks": len(live),
            "live_levels": max((v.meta.level for v in live if v.meta is not None), default=0)}


def metastore_entries(config: ShaleConfig) -> int:
    """Level-0 block entries the metastore committed for the tenant, both groups: the level-0 entries still there
    and those compaction replaced (the level-0 sources of every compacted block), from its read-only view."""
    blocks = read_only_index(state_path(config)).tenant_blocks(TENANT)
    compacted = {s for b in blocks if b.level > 0 for s in b.compaction.sources}
    return len({b.id for b in blocks if b.level == 0} | compacted)


def written_so_far(config: ShaleConfig, bucket: BucketReader) -> dict[str, int]:
    """Level-0 objects and blocks in the bucket (``count_objects``) and level-0 entries in the metastore."""
    objects = count_objects(bucket)
    return {"l0_objects": objects["l0_objects"], "l0_blocks": objects["l0_blocks"],
            "l0_entries": metastore_entries(config)}


def cpu_use(before: CpuSnapshot, after: CpuSnapshot, services: dict[int, str]) -> dict[str, float]:
    """Cores used between the snapshots by each service of the deployment (its whole session: Spark JVMs and
    Python workers included), Kafka, MinIO, the producer and this process's readers; "other" is the rest of the
    machine's busy time (other users, processes that came and went), "steal" what the hypervisor took."""
    seconds = after.at - before.at
    me = os.getpid()
    # This process's children lead their own sessions (Kafka, MinIO, the producer, shale run).
    mine = {pid: "kafka" if "kafka.Kafka" in command else "minio" if "minio" in command
            else "producer" if "bench.freshness" in command else "shale-run"
            for pid, (parent, _, command, _) in after.processes.items() if parent == me}
    use: dict[str, float] = {}
    for pid, (_, session, _, cpu) in after.processes.items():
        name = "readers" if pid == me else services.get(session) or mine.get(session)
        if name:
            use[name] = use.get(name, 0.0) + (cpu - before.processes.get(pid, (0, 0, "", 0.0))[3]) / seconds
    use["other"] = max(0.0, (after.busy - before.busy) / seconds - sum(use.values()))
    use["steal"] = (after.steal - before.steal) / seconds
    return {k: round(v, 2) for k, v in sorted(use.items())}


def batch_breakdown(log: Path, start: float, end: float) -> dict[str, float]:
    """Means over the partition group's batches that committed in [start, end] (epoch seconds), from its JSON log
    lines: records, the gap before the batch (trigger wait and plan), the plan alone, the Spark batch, and after it
    the commit step (the metastore's commit, ``metastore_commit_s``, and the bookkeeping around it)."""
    batches = []
    for line in log.read_text(errors="replace").splitlines():
        if not line.startswith("{"):
            continue  # the Spark JVM's own lines
        entry = json.loads(line)
        if entry.get("msg") == "batch committed":
            batches.append((dt.datetime.fromisoformat(entry["ts"]).timestamp(), entry))
    sums: dict[str, float] = {"gap_s": 0.0, "plan_s": 0.0, "spark_s": 0.0, "commit_s": 0.0,
                              "metastore_commit_s": 0.0, "records": 0.0}
    n = 0
    for (prev_end, _), (ended, entry) in itertools.pairwise(batches):
        if not start <= ended <= end:
            continue
        n += 1
        sums["gap_s"] += ended - entry["seconds"] - prev_end
        sums["plan_s"] += entry.get("plan_seconds", 0.0)
        sums["spark_s"] += entry["write_seconds"]
        sums["commit_s"] += entry["seconds"] - entry["write_seconds"]
        sums["metastore_commit_s"] += entry.get("commit_seconds", 0.0)
        sums["records"] += entry["records"]
    return {"batches": n, **{k: v / max(1, n) for k, v in sums.items()}}


def log_entries(log: Path) -> list[dict[str, Any]]:
    """The JSON lines of a service's log (the Spark JVM's own lines left out), each with ``at``: epoch seconds."""
    entries = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            entry = json.loads(line)
            entry["at"] = dt.datetime.fromisoformat(entry["ts"]).timestamp()
            entries.append(entry)
    return entries


@dataclass
class ColdResult:
    """A run measured from the start: ``shale run`` and the producer started together."""

    book: Visibility
    floor: Visibility
    produced: dict[str, Any]
    launched: float
    """epoch seconds: when ``shale run`` was started"""
    started: float
    """epoch seconds: when every ingest group had started, and the producer was started"""
    logs: dict[str, list[dict[str, Any]]]
    """each ingest group's JSON log lines"""
    cores: dict[str, float]

    def batches(self, group: str = "partition") -> list[dict[str, Any]]:
        return [e for e in self.logs[group] if e.get("msg") == "batch committed" and e["records"]]

    def first_batch_seconds(self) -> float:
        return float(self.batches()[0]["seconds"])

    def steady_batch_seconds(self) -> float:
        """The median batch (read, write and commit) of the run's second half: warm JVMs, batches at the size the
        trigger interval gives at this rate."""
        half = self.started + (self.produced["elapsed"]) / 2
        late = [float(e["seconds"]) for e in self.batches() if e["at"] - e["seconds"] >= half]
        return sorted(late)[len(late) // 2] if late else math.nan

    def timeline(self, group: str) -> dict[str, float]:
        """Seconds from ``shale run``'s start to each step of one group's start and its first batches (the
        producer started at ``producing``)."""
        marks: dict[str, float] = {}
        for e in self.logs[group]:
            name = {"ingest driver warmed": "warmed", "ingest started": "started"}.get(e["msg"])
            if e["msg"].startswith("ingest lease"):
                name = "lease"
            if name and name not in marks:
                marks[name] = e["at"] - self.launched
        marks["producing"] = self.started - self.launched
        for i, e in enumerate(e for e in self.logs[group] if e.get("msg") == "batch committed"):
            if i < 3:
                marks[f"batch{i + 1}_end"] = e["at"] - self.launched
        return {k: round(v, 1) for k, v in marks.items()}


@dataclass
class ProfileResult:
    books: dict[str, Visibility]
    produced: dict[str, Any]
    objects: dict[str, int]
    after: dict[str, int]
    breakdown: dict[str, float]
    poll_s: dict[str, float]
    poll_errors: dict[str, list[str]]
    cores: dict[str, float]
    written: dict[str, int] = field(default_factory=dict)
    """Level-0 objects and blocks in the bucket and level-0 block entries in the metastore written from the
    producer's start until every sample was visible (``written_so_far``)."""


def _prepare(name: str, profile: dict[str, dict[str, Any]], bootstrap: str, bucket: BucketConfig,
             work: Path, partitions: int = PARTITIONS,
             parser: Sequence[str] = JSON_LOGS) -> tuple[str, int, Path, str, ShaleConfig, Bucket]:
    """The run's topic, status-page port, config file, bucket secret, configuration and bucket."""
    work.mkdir(parents=True)
    topic = f"fresh-{name}"
    create_topic(bootstrap, topic, partitions)
    port = free_port()
    file = write_config(work, bootstrap, bucket, topic, port, profile, parser)
    secret = bucket.secret_access_key.get_secret_value()
    config = load_config(file, env={SECRET_ENV: secret})
    return topic, port, file, secret, config, open_bucket(config.bucket)


def measure(name: str, profile: dict[str, dict[str, Any]], bootstrap: str, bucket: BucketConfig,
            work: Path, partitions: int = PARTITIONS, settle: bool = True) -> ProfileResult:
    """One profile on a fresh deployment and topic of ``partitions``. ``written`` counts what was written from the
    producer's start until every sample was visible; with ``settle``, ``after`` is counted once the compactor is
    idle (otherwise right then, not waiting for it)."""
    topic, port, file, secret, config, store = _prepare(name, profile, bootstrap, bucket, work, partitions)
    progress(f"{name}: starting shale run")
    groups = config.run.ingest_groups
    with deployment(file, work, secret, 1 + len(groups) + config.run.compaction_workers) as run:
        token = (work / "metastore" / "admin.token").read_text().strip()
        client = MetastoreClient([f"http://127.0.0.1:{port}"], deadline=30, token=token)
        warm = CheckedProducer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        now = int(time.time() * 1000)
        for i in range(WARMUP_RECORDS):
            warm.produce(topic, b'{"ts": %d, "level": "INFO", "msg": "warm-up"}' % now, partition=i % partitions)
        warm.flush()
        _wait(lambda: sum(o.committed_end for o in client.offsets() if o.topic == topic)
              == len(groups) * WARMUP_RECORDS, 300, "every group to commit the warm-up records", run)
        books = {path: Visibility() for path in ("kafka", "metastore", "bucket_index")}
        index_reader = BucketIndexReader(store, config.bucket_index)
        pollers = [Poller("metastore", open_source(config, "metastore", store), store, books["metastore"]),
                   Poller("bucket_index", BucketIndexSource(index_reader), store, books["bucket_index"],
                          before_poll=index_reader.refresh_now)]
        stop = threading.Event()
        threads = [threading.Thread(target=_floor_consumer, args=(bootstrap, topic, books["kafka"], stop, partitions)),
                   *(threading.Thread(target=p.loop, args=(stop,)) for p in pollers)]
        for t in threads:
            t.start()
        try:
            progress(f"{name}: producing {RATE:,} records/s for {WARMUP:.0f} + {DURATION:.0f} s")
            began, at_start = time.time(), written_so_far(config, store)
            producer = _start_producer(bootstrap, topic, WARMUP, DURATION, partitions=partitions)
            time.sleep(WARMUP)  # the producer's own warm-up: the window below is its sampled part
            before = cpu_snapshot()
            time.sleep(DURATION - 1)  # the second snapshot while the producer still runs
            cores = cpu_use(before, cpu_snapshot(), _service_sessions(work))
            produced = _producer_report(producer)
            ended = time.time()
            _wait(lambda: len(books["kafka"]) == produced["samples"], 60, "the consumer to see every sample")
            expected = set(books["kafka"].first_ms)
            for path in ("metastore", "bucket_index"):
                _wait(lambda path=path: not books[path].missing(expected), 600,
                      f"every sample to become visible through the {path}", run)
        finally:
            stop.set()
            for t in threads:
                t.join()
        progress(f"{name}: every sample visible; counting objects")
        objects = count_objects(store)
        written = {k: v - at_start[k] for k, v in written_so_far(config, store).items()}
        if settle:
            progress(f"{name}: waiting for the compactor to finish every job it opens")
            _wait_compaction_idle(client, run)
        after = count_objects(store)
        breakdown = batch_breakdown(work / "logs" / "ingest-partition.log", began + WARMUP, ended)
    return ProfileResult(books, produced, objects, after, breakdown,
                         {p.name: sum(p.query_seconds) / max(1, len(p.query_seconds)) for p in pollers},
                         {p.name: p.errors for p in pollers}, cores, written)


def measure_cold(name: str, profile: dict[str, dict[str, Any]], bootstrap: str, bucket: BucketConfig,
                 work: Path, python_path: str | None = None) -> ColdResult:
    """A fresh ``shale run`` on a topic that holds ``WARMUP_RECORDS`` records not yet stored (a restart finds
    records waiting); once every ingest group has started (its driver warmed, its lease taken: "ingest
    started"), the producer starts, with samples from its first second on, for ``COLD_DURATION`` s. Every
    sample's latency counts."""
    topic, _, file, secret, config, store = _prepare(name, profile, bootstrap, bucket, work)
    books = {path: Visibility() for path in ("kafka", "metastore")}
    history = CheckedProducer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    now = int(time.time() * 1000)
    for i in range(WARMUP_RECORDS):
        history.produce(topic, b'{"ts": %d, "level": "INFO", "msg": "history"}' % now, partition=i % PARTITIONS)
    history.flush()
    progress(f"{name}: starting shale run")
    launched = time.time()
    services = 1 + len(config.run.ingest_groups) + config.run.compaction_workers
    logs = {str(g): work / "logs" / f"ingest-{g}.log" for g in config.run.ingest_groups}
    with deployment(file, work, secret, services, python_path) as run:
        _wait(lambda: all(any(e["msg"] == "ingest started" for e in log_entries(log)) for log in logs.values()),
              600, "every ingest group to start", run)
        progress(f"{name}: started after {time.time() - launched:.0f} s; producing {RATE:,} records/s for "
                 f"{COLD_DURATION:.0f} s")
        started = time.time()
        producer = _start_producer(bootstrap, topic, warmup=0.0, duration=COLD_DURATION)
        poller = Poller("metastore", open_source(config, "metastore", store), store, books["metastore"])
        stop = threading.Event()
        threads = [threading.Thread(target=_floor_consumer, args=(bootstrap, topic, books["kafka"], stop)),
                   threading.Thread(target=poller.loop, args=(stop,))]
        for t in threads:
            t.start()
        try:
            before = cpu_snapshot()
            produced = _producer_report(producer)
            cores = cpu_use(before, cpu_snapshot(), _service_sessions(work))
            _wait(lambda: len(books["kafka"]) == produced["samples"], 60, "the consumer to see every sample")
            expected = set(books["kafka"].first_ms)
            _wait(lambda: not books["metastore"].missing(expected), 300,
                  "every sample to become visible through the metastore", run)
        finally:
            stop.set()
            for t in threads:
                t.join()
        entries = {g: log_entries(log) for g, log in logs.items()}
    return ColdResult(books["metastore"], books["kafka"], produced, launched, started, entries, cores)


def _start_producer(bootstrap: str, topic: str, warmup: float, duration: float, rate: int | None = None,
                    partitions: int = PARTITIONS) -> subprocess.Popen[str]:
    """``produce_steadily`` in its own process (``python -m bench.freshness``), at ``rate`` (default: ``RATE`` as
    it is at the call; the peers benchmark sets it, ``WARMUP`` and ``DURATION``, so callers pass them)."""
    command = [sys.executable, "-m", "bench.freshness", bootstrap, topic, str(rate or RATE), str(warmup),
               str(duration), str(partitions)]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _producer_report(producer: subprocess.Popen[str]) -> dict[str, Any]:
    """The producer's report, checked: every record delivered, the rate kept."""
    out, err = producer.communicate(timeout=WARMUP + DURATION + COLD_DURATION + 180)
    if producer.returncode != 0:
        raise RuntimeError(f"the producer failed:\n{(out + err)[-3000:]}")
    produced: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    if produced["undelivered"] or produced["errors"]:
        raise RuntimeError(f"the producer failed: {produced}")
    if produced["sent"] / produced["elapsed"] < MIN_RATE_SHARE * RATE:
        raise RuntimeError(f"the producer did not keep {RATE:,} records/s: {produced}")
    return produced


def _service_sessions(work: Path) -> dict[int, str]:
    """The deployment's services by session id (each runs in its own session; ``shale run`` writes the pids)."""
    services = json.loads((work / "logs" / "deployment.json").read_text())["services"]
    return {s["pid"]: name for name, s in services.items()}


def _wait_compaction_idle(client: MetastoreClient, run: ManagedProcess, quiet: float = 10.0) -> None:
    """Until no compaction job has existed for ``quiet`` seconds (the worker polls every 2 s, and a poll is when
    the planner closes jobs)."""
    idle_since: list[float] = []

    def idle() -> bool:
        if client.compaction_jobs():
            idle_since.clear()
            return False
        if not idle_since:
            idle_since.append(time.monotonic())
        return time.monotonic() - idle_since[0] >= quiet

    _wait(idle, 420, "the compactor to finish its jobs", run)


# -- the benchmark ------------------------------------------------------------------------------------------------

def _notes(results: dict[str, ProfileResult], rounds: dict[str, list[ProfileResult]], start: dict[str, Any]) -> str:
    spread = "; ".join(f"{name} " + ", ".join(f"{r.books['metastore'].summary()['p99'] / 1000:.1f} s" for r in runs)
                       for name, runs in rounds.items())
    lines = [__doc__ or "", f"In this run: p99 through the metastore in each round: {spread}. The best round of "
             "each profile:", ""]
    for name, r in results.items():
        b = r.breakdown
        cores = ", ".join(f"{k} {v:.2f}" for k, v in r.cores.items() if v >= 0.005)
        lines.append(f"* {name}: {b['batches']:.0f} partition-group batches of {b['records']:,.0f} records on "
                     f"average; gap before a batch {b['gap_s']:.2f} s, Spark batch {b['spark_s']:.2f} s, commit "
                     f"{b['commit_s']:.3f} s; a poll took {r.poll_s['metastore'] * 1000:.0f} ms (metastore) and "
                     f"{r.poll_s['bucket_index'] * 1000:.0f} ms (bucket index). Cores used in the window: "
                     f"{cores}.")
    lines += ["", f"* cold start (defaults, measured from the start): {_cold_note(start)}"]
    return "\n".join(lines)


def _cold_note(start: dict[str, Any]) -> str:
    t = start["timelines"]["partition"]
    batches = ", ".join(f"{b['records']:,} records in {b['seconds']:.1f} s (task time by phase "
                        f"{b['task_seconds']})" for b in start["first_batches"])
    return (f"the partition group warmed in {start['warm_phases']['partition']} s and started "
            f"{t['started']:.0f} s after `shale run` was launched (the backup group "
            f"{start['timelines'].get('backup', {}).get('started', float('nan')):.0f} s); its first batches: "
            f"{batches}; steady (median of the second half) {start['steady_batch_seconds']:.1f} s; p50 "
            f"{start['p50_ms_from_start'] / 1000:.1f} s, p99 {start['p99_ms_from_start'] / 1000:.1f} s from the "
            f"producer's start. Cores used while producing: {start['cores']}.")


def cold_summary(cold: ColdResult) -> dict[str, Any]:
    """What a cold run showed: the figures, each group's start timeline and its first batches' phases."""
    first = cold.batches()[0]
    return {
        "first_batch_seconds": round(cold.first_batch_seconds(), 2),
        "steady_batch_seconds": round(cold.steady_batch_seconds(), 2),
        "p99_ms_from_start": cold.book.summary()["p99"], "p50_ms_from_start": cold.book.summary()["p50"],
        "max_ms_from_start": cold.book.summary()["max"],
        "first_batch_records": first["records"], "first_batch_task_seconds": first.get("task_seconds"),
        "timelines": {g: cold.timeline(g) for g in cold.logs},
        "warm_phases": {g: next((e.get("phases") for e in entries if e["msg"] == "ingest driver warmed"), None)
                        for g, entries in cold.logs.items()},
        "first_batches": [{k: e.get(k) for k in ("records", "write_seconds", "seconds", "task_seconds")}
                          for e in cold.batches()[:3]],
        "cores": cold.cores,
    }


def cold_only() -> None:
    """``FRESHNESS_COLD_ONLY=1``: only the cold-start runs on defaults (``FRESHNESS_ROUNDS`` of them), printed as
    JSON lines, no result written. With ``FRESHNESS_BASELINE_SRC`` (a ``src`` directory of another version of the
    code), each round runs that version too, in the order this, that, that, this, ... (same Kafka and MinIO)."""
    baseline = os.environ.get("FRESHNESS_BASELINE_SRC")
    variants: list[str | None] = [None, baseline] if baseline else [None]
    with tempfile.TemporaryDirectory(prefix="shale-bench-freshness-") as tmp, kafka_broker() as broker, \
            minio_bucket() as bucket:
        for i in range(ROUNDS):
            for path in variants if i % 2 == 0 else variants[::-1]:
                name = f"cold-{i}-{'baseline' if path else 'this'}"
                cold = measure_cold(name, {}, broker.bootstrap_servers,
                                    bucket.model_copy(update={"url": f"{bucket.url}/{name}"}), Path(tmp) / name,
                                    python_path=path)
                print(json.dumps({"name": name, **cold_summary(cold)}), flush=True)


def run() -> dict[str, Any]:
    rounds: dict[str, list[ProfileResult]] = {"default": [], "low_latency": []}
    with tempfile.TemporaryDirectory(prefix="shale-bench-freshness-") as tmp, kafka_broker() as broker, \
            minio_bucket() as bucket:
        cold = measure_cold("cold", {}, broker.bootstrap_servers,
                            bucket.model_copy(update={"url": f"{bucket.url}/cold"}), Path(tmp) / "cold")
        start = cold_summary(cold)
        progress(f"cold start: {json.dumps(start)}")
        for i in range(ROUNDS):  # interleaved; each round a fresh deployment, topic and bucket prefix
            progress(f"round {i + 1}/{ROUNDS}")
            for name, profile in (("default", {}), ("low_latency", LOW_LATENCY)):
                rounds[name].append(measure(f"{name}-{i}", profile, broker.bootstrap_servers,
                                            bucket.model_copy(update={"url": f"{bucket.url}/{name}-{i}"}),
                                            Path(tmp) / f"{name}-{i}"))
    # Per profile, the round with the lowest p99 through the metastore (the target's figure); every round's p99
    # is in the notes.
    results = {name: min(runs, key=lambda r: r.books["metastore"].summary()["p99"]) for name, runs in rounds.items()}
    default, low = results["default"], results["low_latency"]
    meta, index, floor = (default.books[p].summary() for p in ("metastore", "bucket_index", "kafka"))
    fast, fast_index = (low.books[p].summary() for p in ("metastore", "bucket_index"))
    per_hour = 3600 / (WARMUP + DURATION)
    figures = {
        "p50_ms_metastore": meta["p50"], "p99_ms_metastore": meta["p99"], "max_ms_metastore": meta["max"],
        "p50_ms_bucket_index": index["p50"], "p99_ms_bucket_index": index["p99"],
        "max_ms_bucket_index": index["max"],
        "p50_ms_low_latency": fast["p50"], "p99_ms_low_latency": fast["p99"], "max_ms_low_latency": fast["max"],
        "p50_ms_bucket_index_low_latency": fast_index["p50"], "p99_ms_bucket_index_low_latency": fast_index["p99"],
        "objects_per_hour_l0": round(default.objects["l0_objects"] * per_hour),
        "objects_per_hour_after_compaction": round(default.after["live_objects"] * per_hour),
        "objects_per_hour_l0_low_latency": round(low.objects["l0_objects"] * per_hour),
        "objects_per_hour_after_compaction_low_latency": round(low.after["live_objects"] * per_hour),
        "produce_records_per_s": round(default.produced["sent"] / default.produced["elapsed"]),
        "produce_records_per_s_low_latency": round(low.produced["sent"] / low.produced["elapsed"]),
        "samples": len(default.books["metastore"]),
        "batch_gap_s_mean": round(default.breakdown["gap_s"], 2),
        "batch_spark_s_mean": round(default.breakdown["spark_s"], 2),
        "batch_commit_s_mean": round(default.breakdown["commit_s"], 3),
        "cores_other_default": default.cores["other"] + default.cores["steal"],
        "cores_other_low_latency": low.cores["other"] + low.cores["steal"],
        "p99_ms_low_latency_worst_round": max(r.books["metastore"].summary()["p99"] for r in rounds["low_latency"]),
        "p99_ms_default_worst_round": max(r.books["metastore"].summary()["p99"] for r in rounds["default"]),
        "first_batch_seconds": start["first_batch_seconds"],
        "steady_batch_seconds": start["steady_batch_seconds"],
        "p99_ms_from_start": start["p99_ms_from_start"],
        "p50_ms_from_start": start["p50_ms_from_start"],
        "start_seconds": start["timelines"]["partition"]["started"],
    }
    baseline = {"p50_ms_kafka_consumer": floor["p50"], "p99_ms_kafka_consumer": floor["p99"],
                "max_ms_kafka_consumer": floor["max"], "target_p99_ms_metastore": 15_000,
                "target_p99_ms_low_latency": 5_000, "target_p99_ms_low_latency_every_round": 3_000,
                "target_p99_ms_default_round_three": 10_000, "target_p99_ms_from_start": 10_000,
                "target_first_batch_vs_steady": 2}
    ratios = {"first_batch_vs_steady": round(start["first_batch_seconds"] / start["steady_batch_seconds"], 2),
              "p99_from_start_vs_target": round(start["p99_ms_from_start"] / 10_000, 2),
              "p99_low_latency_worst_round_vs_target": round(figures["p99_ms_low_latency_worst_round"] / 3_000, 2),
              "p99_metastore_vs_target": round(meta["p99"] / 15_000, 2),
              "p99_low_latency_vs_target": round(fast["p99"] / 5_000, 2),
              "p50_metastore_vs_kafka_consumer": round(meta["p50"] / max(1, floor["p50"])),
              "objects_after_compaction_vs_l0": round(default.after["live_objects"] / default.objects["l0_objects"],
                                                      3)}
    return write_result("freshness", figures, baseline, ratios, _notes(results, rounds, start))


if __name__ == "__main__" and len(sys.argv) == 1 and COLD_ONLY:
    cold_only()
elif __name__ == "__main__":
    servers, name, records_per_s, warmup_s, seconds, partition_count = sys.argv[1:7]
    print(json.dumps(produce_steadily(servers, name, int(records_per_s), float(warmup_s), float(seconds),
                                      int(partition_count))))
