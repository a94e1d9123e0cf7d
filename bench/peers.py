"""Side by side with the peer: the Apache Iceberg Kafka Connect sink and Shale, on the same broker, topics, records
and MinIO, in one run on one machine (``bench/connect.py`` runs the peer).

The peer is a Kafka Connect worker in standalone mode (the sink needs no distributed worker: its coordinator is
elected from the sink's consumer group) with ``org.apache.iceberg:iceberg-kafka-connect`` and its dependencies
from Maven Central, one sink task, a JDBC catalog on SQLite and S3FileIO at MinIO. Exactly-once is the sink's own
design ("The sink relies on KIP-447 for exactly-once semantics"): workers write data files, a coordinator commits
them to the table together with the consumed offsets at each commit interval, and the control topic carries the
handshake in Kafka transactions; nothing needs setting for it but a control topic (created here with one partition,
as the documentation's example does, since the broker does not create topics). Its one latency setting is
``iceberg.control.commit.interval-ms`` ("Commit interval in msec, default is 300,000 (5 min)"); the lowest working
interval is the lowest of ``INTERVALS`` whose full-topic run committed every record with no failed commit in the
worker's log. Beside it the worker's ``offset.flush.interval.ms`` is 1 s instead of Connect's 60 s (the
documentation does not mention it; without it an idle task calls the sink's ``put()`` once a minute, the sink's
worker answers the coordinator's commit request only there, and the last records of a topic waited 1-2 minutes
for a commit in a trial run). The default profile leaves both at their defaults. Shale runs as ``shale run``
(both ingest groups, the metastore and a compaction worker, each a process and a Spark application), as the
freshness benchmark runs it (``bench/freshness.py``): on defaults, except that the full-topic and crash runs turn on
Shale's Iceberg publishing (``[iceberg] enabled = true``, its catalog a SQLite file; docs/DESIGN.md section 16:
the metastore leader publishes every committed change as a snapshot, looking every ``iceberg.interval``, 1 s), so
that both systems write an Iceberg table; the publisher runs during the timed part. The freshness runs measure
Shale on defaults (publishing off) and on the low-latency profile (``bench.freshness.LOW_LATENCY``, docs/OPERATING.md,
"Configuration": ``ingest.trigger_interval = "0s"``, ``bucket_index.debounce = "1s"`` and only the partition group
on the machine, ``run.ingest_groups = ["partition"]``).

Records are the freshness benchmark's: JSON of about 130 bytes (``ts``, ``level``, ``msg``) on 8 partitions.

* Throughput: a topic is filled with ``RECORDS`` records first (one million; ``PEERS_RECORDS`` sets fewer for
  development runs); then each system starts cold (process start included: JVMs, Spark) and the time to the last
  record committed is measured (the sink: its table's ``total-records``; Shale: the partition group's committed
  offsets, the group queries read, and both groups'). Also once started, start-up left out: from the worker's
  "Kafka Connect started" log line, and from the partition group's "ingest started" (its Spark driver warmed, its
  lease taken), to the last record committed. Shale's wait for its Iceberg table to catch up (every change up to
  the last commit published) comes after the timed part.
* Correctness, through Spark SQL (``bench/peers_tables.py``): both systems' tables are read as Iceberg tables by
  Apache Iceberg's own Spark runtime (``iceberg-spark-runtime-4.1_2.13`` 1.12.0, ``iceberg-aws-bundle`` and the
  SQLite JDBC driver; a local Spark session in the benchmark process, started after every timed phase): the
  sink's through a ``SparkCatalog`` on the JDBC catalog its worker wrote (``KafkaMetadataTransform`` puts each
  record's partition and offset in the table), Shale's through ``shale.iceberg.spark_catalog_conf`` on the catalog
  its leader published. One Spark SQL aggregate per table counts, against the topic, the rows, the records missing,
  the duplicate rows (rows beyond the first of one (partition, offset)), rows of offsets the topic does not hold
  and rows whose ``msg`` is not the topic's at that (partition, offset). These are the issue's figures
  (``duplicates_shale``, ``missing_shale``, ``duplicates_iceberg_kc``, ... summed over the full-topic and crash runs;
  ``duplicates_*_crash`` the crash run alone). The benchmark's other readers are kept beside them, named by
  reader: the sink's table through pyiceberg on the same catalog (``*_iceberg_kc_pyiceberg``) and Shale's
  partition group through the ``shale query`` Python API with the metastore source, every record of all time
  (``*_shale_query_api``), which drops duplicate rows it finds in overlapping blocks and reports how many
  (``duplicates_dropped_by_query_shale``), so stored duplicates are not hidden on either path.
* Crash: the same on a second topic, with ``kill -9`` of the whole Connect worker (its process group), restarted
  by the benchmark, and of Shale's partition-group ingest (its process group: Python driver and Spark JVM),
  restarted by ``shale run``, each once a third of the records were committed. Shale runs this one with
  ``ingest.max_records_per_batch = 20000``: on its default (2,000,000) the whole topic is one batch, committed
  before a third could be seen.
* Freshness: the freshness benchmark's producer (20,000 records/s is its rate; ``FRESH_RATE`` here, one sample per
  partition every 100 ms) for a warm-up and a measured window (30 s + 60 s); a sample's latency is from its
  ``produce()`` to the first poll (every 250 ms) that returns it: for Shale the freshness benchmark's metastore
  poller, for the sink a pyiceberg reader of each new data file of the current snapshot. The sink runs at its
  lowest working interval and, if ``FRESH_DEFAULT`` is set, at its default; Shale on defaults and on the
  low-latency profile, each a fresh ``shale run``.
* Objects: every object each system wrote to MinIO for each freshness run, per hour of producing; the sink has no
  compaction of its own (Iceberg's ``rewrite_data_files`` is a separate Spark job), Shale's compactor runs in
  ``shale run`` during the run.

The notes of each run state every goal of issue 32 as met or missed with its figures: throughput at least 2x the
sink's, p99 freshness at most half the sink's at its lowest working interval (Shale on defaults and on the
low-latency profile), no duplicates where the sink has some. Figures vary from run to run on this 2-core
machine (two runs of the same code on the same quiet day differed by a third); the load seen during each phase is
in the notes.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, cast

from confluent_kafka import Producer
from tests.integration.ingest_helpers import create_topic

from bench import freshness as fr
from bench.common import CpuSnapshot, cpu_snapshot, progress
from bench.connect import (
    DEFAULT_COMMIT_INTERVAL_MS,
    META,
    SINK_CATALOG,
    ConnectWorker,
    IcebergSink,
    SinkTable,
    multiset_check,
    wait_for,
)
from bench.peers_report import Setup, write_report
from bench.peers_tables import TableRef, check_tables, sink_catalog_conf
from bench.services import kafka_broker, minio_bucket
from shale.config import BucketConfig, load_config
from shale.iceberg import spark_catalog_conf
from shale.metastore import MetastoreClient, read_only_index
from shale.metastore.api.server import state_path
from shale.objstore import open_bucket
from shale.process import free_port
from shale.query import Query, run_query
from shale.query.sources import open_source

RECORDS = int(os.environ.get("PEERS_RECORDS", "1000000"))
"""Records in each full topic: the issue's one million; ``PEERS_RECORDS`` for development runs."""
PARTITIONS = fr.PARTITIONS
INTERVALS = (1_000, 2_000, 5_000, 10_000)
FRESH_RATE = int(os.environ.get("PEERS_RATE", "20000"))
FRESH_WARMUP = float(os.environ.get("PEERS_FRESH_WARMUP", "30"))
FRESH_DURATION = float(os.environ.get("PEERS_FRESH_DURATION", "60"))
FRESH_DEFAULT = os.environ.get("PEERS_FRESH_DEFAULT", "1") == "1"
FRESH_DURATION_DEFAULT = DEFAULT_COMMIT_INTERVAL_MS / 1000
"""The sink at its default interval: samples over one whole commit period."""
TIMEOUT = 1800.0
CRASH_BATCH = 20_000
"""Shale's batch size in the crash run (``ingest.max_records_per_batch``): on defaults a full topic of this size
is one or two batches, committed before a third could be seen, so the kill would come after the last commit."""
LOW_LATENCY_FLUSH_MS = 1_000
"""The worker's ``offset.flush.interval.ms`` beside the lowest commit interval (see ``IcebergSink``)."""


def fill_topic(bootstrap: str, topic: str, records: int, partitions: int = PARTITIONS) -> dict[int, int]:
    """``records`` freshness-shaped JSON records round-robin over ``partitions``; the end offset of each."""
    create_topic(bootstrap, topic, partitions)
    # Idempotent: a retried batch keeps its place, so record i is at offset i div partitions (EXPECTED_MSG).
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "compression.type": "lz4",
                         "queue.buffering.max.messages": 1_000_000, "enable.idempotence": True})
    filler = "x" * 80
    now = int(time.time() * 1000)
    for i in range(records):
        value = b'{"ts": %d, "level": "INFO", "msg": "%s %d"}' % (now + i // 1000, filler.encode(), i)
        while True:
            try:
                producer.produce(topic, value, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(120):
        raise RuntimeError(f"could not deliver every record to {topic}")
    return {p: records // partitions + (1 if p < records % partitions else 0) for p in range(partitions)}


EXPECTED_MSG = f"concat(repeat('x', 80), ' ', CAST(o * {PARTITIONS} + p AS STRING))"
"""``fill_topic``'s ``msg`` of the record at partition ``p``, offset ``o`` (record i went to partition i mod 8), in
Spark SQL: the content check of ``bench.peers_tables``."""


# -- the peer ---------------------------------------------------------------------------------------------------

def _sink_pairs(table: SinkTable) -> list[tuple[int, int]]:
    rows = table.all_rows([META + "partition", META + "offset"])
    return list(zip(rows.column(0).to_pylist(), rows.column(1).to_pylist(), strict=True))


def _commit_failures(worker: ConnectWorker) -> list[str]:
    text = worker.log_path.read_text(errors="replace") if worker.log_path.exists() else ""
    return [line for line in text.splitlines() if " ERROR " in line or "Commit failed" in line
            or "timed out" in line.lower()][:5]


def kc_full_topic(work: Path, bootstrap: str, bucket: BucketConfig, topic: str, ends: dict[int, int],
                  interval: int, kill: bool) -> dict[str, Any]:
    """The sink reads the whole topic; with ``kill``, kill -9 at a third of it and restart. ``table`` is how Spark
    reads its table later."""
    catalog = SINK_CATALOG
    sink = IcebergSink(f"{topic}-{interval // 1000 or 1}s", topic, interval, LOW_LATENCY_FLUSH_MS)
    create_topic(bootstrap, sink.control_topic, 1)
    total = sum(ends.values())
    worker = ConnectWorker(work, bootstrap, bucket, sink)
    table = SinkTable(worker.catalog_db, bucket, sink.table)
    began, before = time.monotonic(), cpu_snapshot()
    worker.start()
    try:
        first = wait_for(lambda: table.committed_records() > 0, TIMEOUT, "the sink's first commit", worker)
        at_first = table.committed_records()
        killed_at = None
        if kill:
            wait_for(lambda: table.committed_records() >= total // 3, TIMEOUT, "a third committed", worker)
            killed_at = table.committed_records()
            progress(f"kill -9 of the Connect worker at {killed_at:,} committed records")
            worker.kill9()
            worker.start()
        wait_for(lambda: table.committed_records() >= total, TIMEOUT, "every record committed", worker)
        seconds, ended = time.monotonic() - began, time.time()
        load = _machine_load(before, cpu_snapshot())
        # Anything still in flight (a duplicate commit after a restart) lands within a few intervals.
        settle = max(3 * interval / 1000, 10.0)
        time.sleep(settle)
        check = multiset_check(_sink_pairs(table), ends)
        started = _first_time(worker.log_path, "Kafka Connect started")
        return {"seconds": seconds, "first_commit_s": first, "at_first": at_first, "load": load, "killed_at": killed_at,
                "after_start_s": ended - started,
                "check": check, "snapshots": table.snapshots(),
                "failures": _commit_failures(worker), "log": worker.log_excerpt(25), "interval": interval,
                "table": TableRef(sink_catalog_conf(catalog, worker.catalog_db, worker.warehouse, bucket),
                                  f"{catalog}.{sink.table}", META + "partition", META + "offset")}
    finally:
        worker.stop()


def kc_freshness(work: Path, bootstrap: str, bucket: BucketConfig, interval: int | None,
                 duration: float = FRESH_DURATION, partitions: int = PARTITIONS) -> dict[str, Any]:
    """Samples produced for ``duration`` s after the warm-up on a topic of ``partitions``; with the default interval
    the producer goes on (a filler without samples) until every sample is visible, as a steady load would."""
    topic = f"fresh-kc-{interval or 'default'}-{partitions}"
    create_topic(bootstrap, topic, partitions)
    sink = IcebergSink(topic, topic, interval, LOW_LATENCY_FLUSH_MS if interval else None)
    create_topic(bootstrap, sink.control_topic, 1)
    worker = ConnectWorker(work, bootstrap, bucket, sink).start()
    table = SinkTable(worker.catalog_db, bucket, sink.table)
    books = {"kafka": fr.Visibility(), "sink": fr.Visibility()}
    stop = threading.Event()

    def poll() -> None:
        columns = ["level", "ts", META + "partition", META + "offset"]
        while not stop.is_set():
            began = time.monotonic()
            try:
                rows = table.new_rows(columns)
            except Exception as exc:  # the catalog's SQLite file locked by the writer: poll again
                progress(f"sink poll failed: {str(exc)[:120]}")
                rows = None
            if rows is not None and rows.num_rows:
                now = time.time() * 1000
                for level, ts, p, o in zip(*(rows.column(c).to_pylist() for c in columns), strict=True):
                    if level == "probe":
                        books["sink"].saw((p, o), ts, now)
            stop.wait(max(0.0, fr.POLL_INTERVAL - (time.monotonic() - began)))

    threads = [threading.Thread(target=fr._floor_consumer, args=(bootstrap, topic, books["kafka"], stop, partitions)),
               threading.Thread(target=poll)]
    filler: subprocess.Popen[str] | None = None
    for t in threads:
        t.start()
    try:
        progress(f"sink (interval {interval or 'default'}): producing {FRESH_RATE:,} records/s for "
                 f"{FRESH_WARMUP:.0f} + {duration:.0f} s")
        producer = fr._start_producer(bootstrap, topic, FRESH_WARMUP, duration, FRESH_RATE, partitions)
        time.sleep(FRESH_WARMUP)
        before = cpu_snapshot()
        time.sleep(duration - 1)
        after = cpu_snapshot()
        produced = _producer_report(producer, FRESH_WARMUP + duration)
        if interval is None:
            filler = fr._start_producer(bootstrap, topic, TIMEOUT, 0.0, FRESH_RATE, partitions)
        wait_for(lambda: len(books["kafka"]) == produced["samples"], 60, "the consumer to see every sample")
        expected = set(books["kafka"].first_ms)
        # Generous: on a loaded machine the worker's JVM may take minutes to start and then catch up a backlog.
        wait_for(lambda: not books["sink"].missing(expected), (interval or 300_000) / 1000 * 3 + 600,
                 "every sample in the sink's table", worker)
    finally:
        if filler is not None:
            filler.terminate()
            filler.wait(30)
        stop.set()
        for t in threads:
            t.join()
        worker.stop()
    objects = sum(1 for _ in open_bucket(bucket).list("iceberg-kc/"))
    return {"books": books, "produced": produced, "objects": objects, "log": worker.log_excerpt(15),
            "busy_cores": round((after.busy - before.busy) / (after.at - before.at), 2),
            "steal_cores": round((after.steal - before.steal) / (after.at - before.at), 2)}


def _machine_load(before: CpuSnapshot, after: CpuSnapshot) -> dict[str, float]:
    """Cores the whole machine kept busy between the snapshots (this benchmark and everyone else), and stolen."""
    seconds = after.at - before.at
    return {"busy_cores": round((after.busy - before.busy) / seconds, 2),
            "steal_cores": round((after.steal - before.steal) / seconds, 2)}


def _first_time(log: Path, marker: str) -> float:
    """Epoch seconds of the first log line holding ``marker`` (Log4j's local time, or Shale's JSON ``ts``)."""
    for line in log.read_text(errors="replace").splitlines():
        if marker not in line:
            continue
        if line.startswith("{"):
            return dt.datetime.fromisoformat(json.loads(line)["ts"]).timestamp()
        return dt.datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S,%f").timestamp()  # local time, as logged
    raise RuntimeError(f"no line with {marker!r} in {log}")


def _producer_report(producer: subprocess.Popen[str], seconds: float) -> dict[str, Any]:
    out, err = producer.communicate(timeout=seconds + 180)
    if producer.returncode != 0:
        raise RuntimeError(f"the producer failed:\n{(out + err)[-3000:]}")
    produced: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    if produced["undelivered"] or produced["errors"]:
        raise RuntimeError(f"the producer failed: {produced}")
    if produced["sent"] / produced["elapsed"] < fr.MIN_RATE_SHARE * FRESH_RATE:
        raise RuntimeError(f"the producer did not keep {FRESH_RATE:,} records/s: {produced}")
    return produced


# -- Shale --------------------------------------------------------------------------------------------------------

def shale_full_topic(work: Path, bootstrap: str, bucket: BucketConfig, topic: str, ends: dict[int, int],
                     kill: bool) -> dict[str, Any]:
    """``shale run`` on defaults reads the whole topic; with ``kill``, kill -9 of the partition group's ingest at
    a third of it (``shale run`` restarts it), in batches of ``CRASH_BATCH`` records so that there is a third.
    Iceberg publishing is on (``iceberg_profile``); ``table`` is how Spark reads its table later."""
    work.mkdir(parents=True)
    port = free_port()
    profile: dict[str, dict[str, Any]] = {"iceberg": iceberg_profile(work)}
    if kill:
        profile["ingest"] = {"max_records_per_batch": CRASH_BATCH}
    file = fr.write_config(work, bootstrap, bucket, topic, port, profile)
    secret = bucket.secret_access_key.get_secret_value()
    config = load_config(file, env={fr.SECRET_ENV: secret})
    total = sum(ends.values())
    began, before = time.monotonic(), cpu_snapshot()
    groups = config.run.ingest_groups
    with fr.deployment(file, work, secret, 1 + len(groups) + config.run.compaction_workers) as run:
        token = (work / "metastore" / "admin.token").read_text().strip()
        client = MetastoreClient([f"http://127.0.0.1:{port}"], deadline=30, token=token)

        def committed(group: str) -> int:
            try:
                return sum(o.committed_end for o in client.offsets(group=group) if o.topic == topic)
            except Exception:  # the metastore not answering yet
                return 0

        wait_for(lambda: committed("partition") > 0, TIMEOUT, "Shale's first commit")
        first = time.monotonic() - began
        at_first = committed("partition")
        killed_at = None
        if kill:
            wait_for(lambda: committed("partition") >= total // 3, TIMEOUT, "a third committed")
            services = json.loads((work / "logs" / "deployment.json").read_text())["services"]
            pid = services["ingest-partition"]["pid"]
            killed_at = committed("partition")
            progress(f"kill -9 of Shale's partition-group ingest (process group {pid}) at {killed_at:,} committed "
                     "records")
            os.killpg(pid, signal.SIGKILL)
        wait_for(lambda: committed("partition") >= total, TIMEOUT, "the partition group to commit every record")
        seconds, ended = time.monotonic() - began, time.time()
        load = _machine_load(before, cpu_snapshot())
        wait_for(lambda: all(committed(g) >= total for g in groups), TIMEOUT, "every group to commit every record")
        all_groups = time.monotonic() - began
        # The Iceberg table: every change up to now published (the leader trims the feed after the snapshots).
        applied = int(client.status()["applied_index"])
        view = read_only_index(state_path(config))
        wait_for(lambda: not view.reader.block_changes(0, applied), TIMEOUT, "Shale's Iceberg table to catch up")
        if not run.alive():
            raise RuntimeError("shale run exited")
        store = open_bucket(config.bucket)
        query = Query(fr.TENANT, 0, 2**62, "", columns=["partition", "offset"])
        rows = run_query(query, open_source(config, "metastore", store), store).read_all()
        pairs = list(zip(rows.column("partition").to_pylist(), rows.column("offset").to_pylist(), strict=True))
        objects = fr.count_objects(store)
    return {"seconds": seconds, "all_groups_s": all_groups, "first_commit_s": first, "at_first": at_first,
            "load": load, "killed_at": killed_at,
            "after_start_s": ended - _first_time(work / "logs" / "ingest-partition.log", '"msg": "ingest started"'),
            "check": multiset_check(pairs, ends), "dropped": query.stats.duplicates_dropped, "objects": objects,
            "table": TableRef(spark_catalog_conf(config), f"{config.iceberg.catalog_name}.`{fr.TENANT}`.`{topic}`",
                              "`partition`", "`offset`")}


def iceberg_profile(work: Path) -> dict[str, Any]:
    """Shale's Iceberg publishing (docs/DESIGN.md 16) on, its catalog a SQLite file in ``work``; every other
    Iceberg setting at its default (the leader publishes every ``iceberg.interval``, 1 s)."""
    return {"enabled": True, "catalog_uri": f"sqlite:///{work / 'iceberg-catalog.db'}"}


def shale_freshness(name: str, profile: dict[str, dict[str, Any]], work: Path, bootstrap: str,
                    bucket: BucketConfig, partitions: int = PARTITIONS, settle: bool = True) -> fr.ProfileResult:
    """The freshness benchmark's measurement of one profile, with this benchmark's rate and windows."""
    fr.WARMUP, fr.DURATION, fr.RATE = FRESH_WARMUP, FRESH_DURATION, FRESH_RATE
    return fr.measure(name, profile, bootstrap, bucket, work, partitions, settle)


def lowest_working_interval(root: Path, bootstrap: str, bucket: BucketConfig, topic: str,
                            ends: dict[int, int]) -> tuple[dict[str, Any], list[str]]:
    """The sink on the full ``topic`` at each of ``INTERVALS`` in turn (each in its own folder and bucket prefix)
    until one works: every record committed, no failed commit in the worker's log. Its full-topic run, and what
    each interval tried did."""
    tried: list[str] = []
    for interval in INTERVALS:
        progress(f"the sink at commit interval {interval} ms on {topic}")
        prefix = bucket.model_copy(update={"url": f"{bucket.url}/kc-{topic}-{interval}"})
        kc = kc_full_topic(root / f"kc-{topic}-{interval}", bootstrap, prefix, topic, ends, interval, kill=False)
        print(f"--- Connect worker log (interval {interval} ms), excerpt ---\n{kc['log']}\n---", flush=True)
        ok = not kc["failures"] and kc["check"]["missing"] == 0
        tried.append(f"{interval} ms: {'works' if ok else 'failed: ' + '; '.join(kc['failures'])[:300]}")
        if ok:
            return kc, tried
    raise RuntimeError(f"no commit interval worked: {tried}")


# -- the benchmark ------------------------------------------------------------------------------------------------

def _stopped(signum: int, _frame: object) -> None:
    progress(f"stopped by signal {signum}: stopping every service this run started")
    sys.exit(128 + signum)


def run() -> dict[str, Any]:
    signal.signal(signal.SIGTERM, _stopped)  # stopped: clean up every service it started
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="shale-bench-peers-") as tmp, kafka_broker() as broker, \
            minio_bucket() as bucket:
        bootstrap, root = broker.bootstrap_servers, Path(tmp)

        def mark() -> None:
            out.setdefault("loadavg", []).append(os.getloadavg()[0])

        def sub(name: str) -> BucketConfig:
            return bucket.model_copy(update={"url": f"{bucket.url}/{name}"})

        mark()
        progress(f"filling two topics with {RECORDS:,} records each")
        ends = fill_topic(bootstrap, "peers-full", RECORDS)
        crash_ends = fill_topic(bootstrap, "peers-crash", RECORDS)
        mark()
        out["kc_full"], tried = lowest_working_interval(root, bootstrap, bucket, "peers-full", ends)
        lowest = out["kc_full"]["interval"]
        mark()
        progress("Shale on defaults on the full topic")
        out["shale_full"] = shale_full_topic(root / "shale-full", bootstrap, sub("shale-full"), "peers-full", ends,
                                             kill=False)
        mark()
        progress(f"crash: the sink at {lowest} ms, kill -9 mid-run")
        out["kc_crash"] = kc_full_topic(root / "kc-crash", bootstrap, sub("kc-crash"), "peers-crash", crash_ends,
                                        lowest, kill=True)
        print(f"--- Connect worker log (crash run), excerpt ---\n{out['kc_crash']['log']}\n---", flush=True)
        mark()
        progress("crash: Shale on defaults, kill -9 of the partition group's ingest mid-run")
        out["shale_crash"] = shale_full_topic(root / "shale-crash", bootstrap, sub("shale-crash"), "peers-crash",
                                              crash_ends, kill=True)
        mark()
        progress("freshness: Shale on defaults")
        out["shale_fresh"] = shale_freshness("peers-default", {}, root / "shale-fresh", bootstrap,
                                             sub("shale-fresh"))
        mark()
        progress("freshness: Shale on the low-latency profile")
        low_latency = cast(dict[str, dict[str, Any]], fr.LOW_LATENCY)
        out["shale_fresh_low"] = shale_freshness("peers-low-latency", low_latency, root / "shale-fresh-low",
                                                 bootstrap, sub("shale-fresh-low"))
        mark()
        progress(f"freshness: the sink at {lowest} ms")
        out["kc_fresh_low"] = kc_freshness(root / "kc-fresh-low", bootstrap, sub("kc-fresh-low"), lowest)
        mark()
        if FRESH_DEFAULT:
            mark()
            progress("freshness: the sink at its default interval (5 min)")
            try:
                out["kc_fresh_default"] = kc_freshness(root / "kc-fresh-default", bootstrap,
                                                       sub("kc-fresh-default"), None, FRESH_DURATION_DEFAULT)
                mark()
            except RuntimeError as exc:  # reported, not hidden: the other figures stand
                out["kc_fresh_default_error"] = str(exc)[:2000]
                progress(f"the sink at its default interval failed: {exc}")
        progress("correctness: the four tables read through Spark SQL with Iceberg's Spark runtime")
        runs = {"kc_full": ends, "shale_full": ends, "kc_crash": crash_ends, "shale_crash": crash_ends}
        out["spark"] = check_tables({k: out[k]["table"] for k in runs}, runs, EXPECTED_MSG)
        progress(f"Spark SQL read: {out['spark']}")
    return write_report(out, tried, Setup(RECORDS, FRESH_RATE, FRESH_WARMUP + FRESH_DURATION, __doc__ or ""))
