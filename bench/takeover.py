"""Ingest takeover time over repeated SIGKILLs, and the throughput of two shards against one, in one run.

Takeover: two ``shale ingest --group backup`` processes (one shard, the default ``ingest.lease_duration`` of
15 s) while a producer writes about 200 records/s to 4 partitions. ``KILLS`` times, the lease holder is killed with
SIGKILL (its whole process group, Spark included); the takeover time runs from the kill until the standby's first
commit is in the metastore (the lease's expiry, the standby's next ask, and its first batch), polled every 0.1 s;
the lease time, until the metastore shows the standby holding the lease. The killed driver is started again as
the next standby, warmed before the next kill. Percentiles are over ``KILLS`` samples: with so few, p99 is the
largest. At the end verify finds every record stored once.

Throughput: ``RECORDS`` records produced at once to a new 4-partition topic, stored by one warmed driver (one
shard), then the same count to another topic stored by two warmed drivers on two shards (``--shard 0`` and
``--shard 1``, each its own Spark application in ``local[2]``), timed from the first record produced until the
metastore has them all. On this 2-core machine the two drivers share the same two cores.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from tests.integration.ingest_helpers import config_of, create_topic, ingest_process, produce_json, write_config
from tests.producing import CheckedProducer
from tests.waiting import eventually

from bench.common import progress, write_result
from bench.services import kafka_broker, minio_bucket
from shale.metastore import open_metastore
from shale.metastore.rules.shards import shard_of
from shale.objstore import open_bucket
from shale.process import ManagedProcess
from shale.verify import verify_topic

KILLS = 5
RECORDS = 60_000
PARTITIONS = 4
STANDBY = "standby: another process holds the ingest lease"
STARTED = "ingest started"


def _logged(process: ManagedProcess, text: str) -> bool:
    return text in process.log_path.read_text(errors="replace")


def _committed(file: Path) -> int:
    return sum(o.committed_end for o in open_metastore(config_of(file)).offsets("backup", 1))


def _holder(file: Path) -> str:
    rows = open_metastore(config_of(file)).ingest_leases()  # type: ignore[union-attr]
    return next((str(r["holder"]) for r in rows if r["holder"]), "")


def _holder_and_standby(drivers: list[ManagedProcess]) -> tuple[ManagedProcess, ManagedProcess] | None:
    """The driver that writes and the other, once that one waits as a standby (warmed), else None."""
    holders = [d for d in drivers if _logged(d, STARTED)]
    if len(holders) != 1:
        return None
    other = next(d for d in drivers if d is not holders[0])
    return (holders[0], other) if _logged(other, STANDBY) else None


class Producer:
    """About 200 records/s to every partition of ``topic`` until stopped; counts what it sent."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.producer = CheckedProducer({"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": True})
        self.topic, self.sent, self.stop = topic, 0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.05):
            for _ in range(10):
                self.producer.produce(self.topic, f'{{"ts": {1_795_000_000 + self.sent}, "msg": "e"}}'.encode(),
                                      key=str(self.sent).encode())
                self.sent += 1

    def close(self) -> int:
        if not self.stop.is_set():
            self.stop.set()
            self.thread.join()
            self.producer.flush(60)
        return self.sent


def _kill_the_holder(file: Path, drivers: list[ManagedProcess]) -> tuple[ManagedProcess, float, float]:
    """SIGKILL the holder once a standby is warm: (the standby, ms until it holds the lease, ms until its first
    commit is in the metastore)."""
    holder, standby = eventually(lambda: _holder_and_standby(drivers), 600, "a holder and a warm standby")
    eventually(lambda: _committed(file) > 0, 300, "a first commit")
    before = _holder(file)
    started = time.monotonic()
    holder.kill9()
    eventually(lambda: _holder(file) not in ("", before), 120, "the standby to hold the lease")
    lease = (time.monotonic() - started) * 1000
    at_lease = _committed(file)
    eventually(lambda: _committed(file) > at_lease, 300, "the standby's first commit")
    return standby, lease, (time.monotonic() - started) * 1000


def takeovers(bootstrap: str, bucket: Any, tmp: Path) -> tuple[list[float], list[float], int]:
    topic = "takeover"
    create_topic(bootstrap, topic, PARTITIONS)
    tmp.mkdir()
    file = write_config(tmp, bootstrap, bucket, [topic], max_records_per_batch=20_000)
    producer = Producer(bootstrap, topic)
    drivers = [ingest_process(file, "backup", tmp / f"driver-{i}.log") for i in range(2)]
    takeover_ms: list[float] = []
    lease_ms: list[float] = []
    try:
        for kill in range(KILLS):
            standby, lease, took = _kill_the_holder(file, drivers)
            lease_ms.append(lease)
            takeover_ms.append(took)
            progress(f"kill {kill + 1}/{KILLS}: lease after {lease_ms[-1]:.0f} ms, writing after "
                     f"{takeover_ms[-1]:.0f} ms")
            drivers = [standby, ingest_process(file, "backup", tmp / f"driver-{kill + 2}.log")]
        sent = producer.close()
        eventually(lambda: _committed(file) == sent, 600, "the last records to be stored")
    finally:
        producer.close()
        for d in drivers:
            d.kill9()
    config = config_of(file)
    report = verify_topic(open_metastore(config), open_bucket(config.bucket), config.kafka, "backup", 1, topic)
    assert (report.missing, report.duplicated, report.stored) == (0, 0, sent), report.as_dict()
    return takeover_ms, lease_ms, sent


def throughput(bootstrap: str, bucket: Any, tmp: Path, shards: int) -> float:
    """Records/s of ``shards`` warmed drivers storing ``RECORDS`` records produced at once."""
    while True:  # a topic whose 4 partitions both shards read
        topic = f"tp-{uuid.uuid4().hex[:6]}"
        if len({shard_of(topic, p, shards) for p in range(PARTITIONS)}) == shards:
            break
    create_topic(bootstrap, topic, PARTITIONS)
    folder = tmp / f"shards-{shards}"
    folder.mkdir()
    file = write_config(folder, bootstrap, bucket, [topic], shards=shards)
    drivers = [ingest_process(file, "backup", folder / f"driver-{s}.log", shard=s) for s in range(shards)]
    try:
        eventually(lambda: all(_logged(d, STARTED) for d in drivers), 600, "the drivers to hold their shards")
        started = time.monotonic()
        produce_json(bootstrap, topic, RECORDS)
        eventually(lambda: _committed(file) == RECORDS, 900, f"{shards} shard(s) to store the records")
        seconds = time.monotonic() - started
    finally:
        for d in drivers:
            d.stop()
    return RECORDS / seconds


def run() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="shale-bench-takeover-") as tmp, kafka_broker() as broker, \
            minio_bucket() as bucket:
        progress(f"takeover: {KILLS} kills of the lease holder (lease_duration 15 s)")
        takeover_ms, lease_ms, sent = takeovers(broker.bootstrap_servers, bucket, Path(tmp) / "takeover")
        progress(f"throughput: {RECORDS:,} records, one shard")
        one = throughput(broker.bootstrap_servers, bucket, Path(tmp), 1)
        progress(f"throughput: {RECORDS:,} records, two shards")
        two = throughput(broker.bootstrap_servers, bucket, Path(tmp), 2)

    def pct(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return round(ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))])

    return write_result(
        "takeover",
        figures={"takeover_p50_ms": pct(takeover_ms, 0.5), "takeover_p99_ms": pct(takeover_ms, 0.99),
                 "lease_takeover_p50_ms": pct(lease_ms, 0.5), "lease_takeover_p99_ms": pct(lease_ms, 0.99),
                 "takeover_mean_ms": round(statistics.mean(takeover_ms)), "kills": KILLS,
                 "records_during_kills": sent, "two_shards_records_per_s": round(two)},
        baseline={"one_shard_records_per_s": round(one), "lease_duration_ms": 15_000},
        ratios={"two_shards_vs_one": round(two / one, 3)},
        notes=__doc__ or "",
    )
