"""Change tables (issue 57): how long after an upsert is produced its key's latest row is readable through
``shale.read(latest=True)``, on defaults, and what the latest view costs as the history grows.

A producer process (confluent-kafka, 10 ms ticks) writes ``RATE`` changes/s (20,000) to an upsert topic of 8
partitions, keyed by one of ``KEYS`` keys (1,000,000) drawn at random, a tenth of them tombstones (a null value
deletes the key); the others are JSON of about 130 bytes. Every 100 ms each of 8 probe keys gets an update whose
``v`` is a sequence number and whose ``ts`` is the wall-clock time of its ``produce()`` call (a sample). The
deployment is ``shale run`` on defaults (``bench/freshness.py``'s: both ingest groups, the metastore, a compaction
worker, MinIO), the topic's rule ``table = "upsert"`` keyed by the Kafka record key.

The reader is what a user of the latest table runs: in a loop, ``shale.read(config, tenant, latest=True)`` of the
whole table, every key (not a filter on the probe keys: that would read less than a user reading the table does).
Each read in the process adds what was stored since the one before to the versions it kept (change-tables.md
20.3); at the end, a cold read (a new process's: the whole history) is timed too.
A sample is readable at the end of the first read whose row for its probe key holds its sequence number or a later
one. The producer runs ``WARMUP`` s (30) and then ``DURATION`` s (120) more, the sampled window; the run then reads
until every probe key shows its last update (600 s at most). Then the view is checked against the topic: a plain
consumer replays every record into a dictionary (the key's last value; a tombstone removes it), and the latest
rows must equal it, key for key and value for value.

Then the replay (``bench/change_replay.py``, below): a full topic of 10 million changes into the latest rows, by
Shale and by Spark's ``foreachBatch`` + ``MERGE INTO`` (``ratios.vs_spark_merge_into``). What this benchmark does
not measure yet: the Iceberg table of latest rows (``figures.p99_ms_latest_iceberg``: Shale does not publish one
yet), left out of the result rather than estimated. ``CHANGE_TABLES_RATE``, ``CHANGE_TABLES_KEYS``,
``CHANGE_TABLES_DURATION`` and ``CHANGE_TABLES_REPLAY`` set smaller runs for development; the committed result is
on the defaults."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition
from tests.producing import CheckedProducer

from bench import change_replay
from bench.common import ROOT, cpu_snapshot, progress, write_result
from bench.freshness import TENANT, _prepare, _service_sessions, _wait, count_objects, cpu_use, deployment, percentile
from bench.services import kafka_broker, minio_bucket
from shale.metastore import MetastoreClient
from shale.query.latest import PROCESS_READS
from shale.query.table import read

RATE = int(os.environ.get("CHANGE_TABLES_RATE", "20000"))
KEYS = int(os.environ.get("CHANGE_TABLES_KEYS", "1000000"))
DURATION = float(os.environ.get("CHANGE_TABLES_DURATION", "120"))
WARMUP = 30.0
DELETES = 0.1
PARTITIONS = 8
PROBES = 8
SAMPLE_INTERVAL = 0.1
TICK = 0.01
TARGET_P99_MS = 10_000
PARSER = ['[[ingest.parsers]]', 'parser = "json"', 'table = "upsert"',
          'options = {time_field = "ts", time_format = "epoch_ms", label_fields = ["kind"], fields = ["v"]}']


def produce_changes(bootstrap: str, topic: str, rate: int, keys: int, warmup: float, duration: float) -> dict[str, Any]:
    """Produce ``rate`` changes/s over ``keys`` keys (``DELETES`` of them tombstones) for ``warmup + duration`` s
    and, every ``SAMPLE_INTERVAL``, one update of each probe key; return the counts and every sample (probe key,
    sequence number, produce time in ms)."""
    producer = CheckedProducer({"bootstrap.servers": bootstrap, "linger.ms": 5, "compression.type": "lz4",
                                "queue.buffering.max.messages": 1_000_000})

    def send(key: bytes, value: bytes | None) -> None:
        producer.produce(topic, value, key)  # type: ignore[arg-type]  # None: a tombstone

    rng = random.Random(57)
    filler = b"x" * 80
    sent = deletes = seq = 0
    samples: list[tuple[str, int, int]] = []
    behind = 0.0
    start = time.monotonic()
    next_sample = start
    while (now := time.monotonic()) < start + warmup + duration:
        ms = int(time.time() * 1000)
        if now >= next_sample:
            for p in range(PROBES):
                seq += 1
                send(b"probe-%d" % p, b'{"ts": %d, "kind": "probe", "v": "%d"}' % (ms, seq))
                if now >= start + warmup:
                    samples.append((f"probe-{p}", seq, ms))
            next_sample += SAMPLE_INTERVAL
        due = int((now - start) * rate)
        behind = max(behind, (due - sent) / rate)
        while sent < due:
            key = b"k%07d" % rng.randrange(keys)
            if rng.random() < DELETES:
                send(key, None)
                deletes += 1
            else:
                send(key, b'{"ts": %d, "kind": "change", "v": "%d", "pad": "%s"}' % (ms, sent, filler))
            sent += 1
        time.sleep(max(0.0, TICK - (time.monotonic() - now)))
    elapsed = time.monotonic() - start
    producer.flush(60)  # raises unless every record was delivered
    return {"sent": sent, "deletes": deletes, "probes": seq, "samples": samples, "elapsed": elapsed,
            "max_behind_s": behind}


def replay(bootstrap: str, topic: str) -> dict[bytes, str]:
    """Every record of the topic replayed into a dictionary, as Kafka's log compaction reads an upsert topic: a key's
    last value (its ``v``); a tombstone removes the key."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    rows: dict[bytes, str] = {}
    ended: set[int] = set()
    try:
        while len(ended) < PARTITIONS:
            for m in consumer.consume(10_000, timeout=1.0):
                error = m.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        ended.add(m.partition())  # type: ignore[arg-type]
                    continue
                key, value = m.key(), m.value()
                assert isinstance(key, bytes)
                if value is None:
                    rows.pop(key, None)
                else:
                    rows[key] = json.loads(value)["v"]
    finally:
        consumer.close()
    return rows


class Reader:
    """Reads the whole latest table in a loop; keeps, for each read, when it ended and each probe key's ``v``."""

    def __init__(self, config: Path) -> None:
        self.config = config
        self.reads: list[tuple[float, dict[str, int], int, float]] = []  # (ended ms, probe -> v, rows, seconds)
        self.errors: list[str] = []

    def read_once(self) -> tuple[dict[str, int], int]:
        table = read(self.config, tenant=TENANT, latest=True, columns=["key", "v"])
        probes = {k.decode(): int(v) for k, v in zip(table.column("key").to_pylist(), table.column("v").to_pylist(),
                                                     strict=True) if k is not None and k.startswith(b"probe-")}
        return probes, table.num_rows

    def loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            began = time.monotonic()
            try:
                probes, rows = self.read_once()
                self.reads.append((time.time() * 1000, probes, rows, time.monotonic() - began))
            except Exception as exc:  # before the first commit: no table yet
                self.errors.append(str(exc)[:200])
                stop.wait(0.5)

    def latencies(self, samples: list[tuple[str, int, int]]) -> list[float]:
        """Each sample's latency: the end of the first read showing its key at its sequence number or later, less
        its produce time. A sample no read showed raises."""
        out = []
        for key, seq, produced in samples:
            seen = next((ended for ended, probes, _, _ in self.reads if probes.get(key, 0) >= seq), None)
            if seen is None:
                raise RuntimeError(f"{key} at {seq} was never readable")
            out.append(seen - produced)
        return out


def run() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="shale-bench-changes-") as tmp, kafka_broker() as broker, \
            minio_bucket() as bucket:
        bootstrap, work = broker.bootstrap_servers, Path(tmp) / "run"
        topic, port, file, secret, config, store = _prepare("changes", {}, bootstrap, bucket, work, PARTITIONS,
                                                            parser=PARSER)
        progress("starting shale run")
        with deployment(file, work, secret, 1 + len(config.run.ingest_groups) + config.run.compaction_workers) \
                as shale_run:
            token = (work / "metastore" / "admin.token").read_text().strip()
            client = MetastoreClient([f"http://127.0.0.1:{port}"], deadline=30, token=token)
            os.environ["SHALE_BUCKET__SECRET_ACCESS_KEY"] = secret  # the reader loads the same config file
            reader = Reader(file)
            stop = threading.Event()
            thread = threading.Thread(target=reader.loop, args=(stop,))
            progress(f"producing {RATE:,} changes/s over {KEYS:,} keys for {WARMUP:.0f} + {DURATION:.0f} s")
            began = time.time()
            producer = subprocess.Popen([sys.executable, "-m", "bench.change_tables", bootstrap, topic, str(RATE),
                                         str(KEYS), str(WARMUP), str(DURATION)], cwd=ROOT, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True)
            thread.start()
            try:
                time.sleep(WARMUP)
                before = cpu_snapshot()
                time.sleep(DURATION - 1)
                cores = cpu_use(before, cpu_snapshot(), _service_sessions(work))
                out, err = producer.communicate(timeout=WARMUP + DURATION + 180)
                if producer.returncode != 0:
                    raise RuntimeError(f"the producer failed:\n{(out + err)[-3000:]}")
                produced = json.loads(out.strip().splitlines()[-1])
                last = {key: seq for key, seq, _ in produced["samples"]}
                progress(f"produced {produced['sent']:,} changes; reading until every probe key's last update shows")
                _wait(lambda: reader.reads and all(reader.reads[-1][1].get(k, 0) >= s for k, s in last.items()),
                      600, "every probe key's last update to be readable", shale_run)
            finally:
                stop.set()
                thread.join()
            ended = time.time()
            objects = count_objects(store)
            progress("replaying the topic into a dictionary")
            expected = replay(bootstrap, topic)
            _wait(lambda: sum(o.committed_end for o in client.offsets("partition") if o.topic == topic)
                  == produced["sent"] + produced["probes"], 300, "the partition group to commit every change")
            for how in ("after the loop's reads", "cold"):  # cold: as a new process reads, the whole history
                if how == "cold":
                    PROCESS_READS.clear()
                began_read = time.monotonic()
                table = read(file, tenant=TENANT, latest=True, columns=["key", "v"])
                cold_seconds = time.monotonic() - began_read
                rows = table.num_rows
                change_replay.check_rows(change_replay.rows_of(table), expected, f"Shale (read {how})")
        progress(f"the replay of {change_replay.CHANGES:,} changes against Spark's foreachBatch + MERGE INTO")
        replayed = change_replay.run(bootstrap, bucket, Path(tmp) / "replay", PARSER, PARTITIONS, KEYS,
                                     lambda name: replay(bootstrap, name))
    latencies = reader.latencies([tuple(s) for s in produced["samples"]])
    seconds = [s for _, _, _, s in reader.reads]
    in_window = [r for r in reader.reads if r[0] >= (began + WARMUP) * 1000]
    per_hour = 3600 / (ended - began)
    figures = {"p99_ms_latest_shale_read": round(percentile(latencies, 99)),
               "p50_ms_latest_shale_read": round(percentile(latencies, 50)),
               "max_ms_latest_shale_read": round(max(latencies)),
               "changes_per_s": round(produced["sent"] / produced["elapsed"]), "changes": produced["sent"],
               "keys": KEYS, "latest_rows": len(expected), "reads": len(reader.reads),
               "read_seconds_mean": round(sum(seconds) / len(seconds), 2),
               "read_seconds_last": round(seconds[-1], 2), "read_seconds_cold": round(cold_seconds, 2),
               "objects_per_hour_l0": round(objects["l0_objects"] * per_hour),
               "objects_live_per_hour": round(objects["live_objects"] * per_hour),
               "replay_changes_per_s": round(change_replay.CHANGES / replayed["shale"]["seconds"])}
    ratios = {"p99_latest_shale_read_vs_target": round(figures["p99_ms_latest_shale_read"] / TARGET_P99_MS, 2),
              "vs_spark_merge_into": replayed["ratio"]}
    baseline = {"target_p99_ms_latest_shale_read": TARGET_P99_MS,
                "replay_changes_per_s_spark_merge_into": round(change_replay.CHANGES / replayed["spark"]["seconds"])}
    notes = (f"{__doc__}\n\nIn this run: {len(in_window)} reads in the window, the first "
             f"{in_window[0][3] if in_window else float('nan'):.1f} s, the last {seconds[-1]:.1f} s ({rows:,} rows: "
             f"each read adds what was stored since the read before to the versions it kept); a cold read of the "
             f"whole history at the end (a new process's) took {cold_seconds:.1f} s; "
             f"the producer fell at most {produced['max_behind_s']:.2f} s behind its schedule. Cores used in the "
             f"window: {', '.join(f'{k} {v:.2f}' for k, v in cores.items() if v >= 0.005)}. The latest rows equalled "
             f"the topic's replay: {len(expected):,} keys.\n\n{change_replay.__doc__}\n\n{_replay_note(replayed)}")
    return write_result("change_tables", figures, baseline, ratios, notes,
                        details={"reader_errors": reader.errors[:3], "cores": cores, "replay": replayed})


def _replay_note(replayed: dict[str, Any]) -> str:
    shale, spark = replayed["shale"], replayed["spark"]
    return (f"In this run the replay of {shale['changes']:,} changes ({shale['deletes']:,} tombstones, "
            f"{shale['rows']:,} latest rows): Shale {shale['seconds']:.0f} s (its services started after "
            f"{shale['started_s']:.0f} s, the partition group had committed the topic after {shale['committed_s']:.0f}"
            f" s, the cold latest read took {shale['read_s']:.0f} s), Spark's foreachBatch + MERGE INTO "
            f"{spark['seconds']:.0f} s ({spark['batches']} batches): {replayed['ratio']}x. Both tables equalled the "
            "topic's replay.")


if __name__ == "__main__":
    servers, name, changes_per_s, key_count, warmup_s, seconds = sys.argv[1:7]
    print(json.dumps(produce_changes(servers, name, int(changes_per_s), int(key_count), float(warmup_s),
                                     float(seconds))))
