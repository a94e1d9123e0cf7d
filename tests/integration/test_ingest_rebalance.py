"""Issue 44 with real Kafka, MinIO and Spark: drivers of a group with ``ingest.shards = "auto"`` come and go while a
producer writes. A third driver joins a group of two and takes its share of the shards without an operator; one
driver is killed (SIGKILL) and its shard moves to the others once its lease expires; another stops cleanly
(SIGTERM) and its shard moves at the next heartbeat. Partitions move as the placement allows (DESIGN 10.2's
load-aware placement): on the join only to the new shard, on the kill only the dead driver's, each driver left keeping
its own. ``verify`` then finds 0 missing and 0 duplicated. The figures
(how long each move took, the lag around the join) are printed for the report (run with ``-s``)."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from tests.integration.ingest_helpers import config_of, create_topic, ingest_process, produce_json, write_config
from tests.waiting import eventually

from shale.metastore import open_metastore
from shale.metastore.api.server import state_path
from shale.metastore.rules.shards import placement, shard_map, shard_of
from shale.objstore import open_bucket
from shale.verify import verify_topic

PARTITIONS = 12
CHUNK = 300
RESHARDED = "ingest shard map changed"
LEASE = 5.0


class _Producer:
    """Writes ``CHUNK`` records about every half second until stopped (the load the drivers ingest under)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.produced = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="producer", daemon=True)

    def _run(self) -> None:
        seed = 1
        while not self.stop.is_set():
            produce_json(self.bootstrap, self.topic, CHUNK, start=self.produced, seed=seed)
            self.produced += CHUNK
            seed += 1
            self.stop.wait(0.5)


def _topic(kafka) -> str:  # type: ignore[no-untyped-def]
    """A new topic whose partitions fall in every shard of 1, 2 and 3 (the assignment hashes the topic's name)."""
    while True:
        topic = f"rebalance-{uuid.uuid4().hex[:6]}"
        if all({shard_of(topic, p, n) for p in range(PARTITIONS)} == set(range(n)) for n in (2, 3)):
            create_topic(kafka.bootstrap_servers, topic, PARTITIONS)
            return topic


def _rows(file: Path) -> list[dict[str, Any]]:
    return open_metastore(config_of(file)).ingest_leases("backup")


def _held(file: Path, count: int, holders: int | None = None) -> list[dict[str, Any]] | None:
    """The lease rows once the map has ``count`` shards, each held (by ``holders`` distinct drivers)."""
    rows = _rows(file)
    live = {r["holder"] for r in rows if r["holder"]}
    ok = len(rows) == count and all(r["holder"] for r in rows) and len(live) == (holders or count)
    return rows if ok else None


def _committed(file: Path) -> int:
    return sum(o.committed_end for o in open_metastore(config_of(file)).offsets("backup", 1))


def _placement(file: Path, topic: str) -> dict[int, int]:
    """Each partition's shard under the group's current map, as the state machine placed it (else by the hash)."""
    conn = sqlite3.connect(f"file:{state_path(config_of(file))}?mode=ro", uri=True)
    try:
        current, placed = shard_map(conn, "backup", 1), placement(conn, "backup", 1)
    finally:
        conn.close()
    assert current is not None
    return {p: placed.get((topic, p), shard_of(topic, p, current.shards)) for p in range(PARTITIONS)}


def _by_driver(where: dict[int, int], shards: dict[int, int]) -> dict[int, set[int]]:
    """The partitions each driver (process id) reads, from their shards and the drivers' (``shards``: pid -> shard)."""
    return {pid: {p for p, s in where.items() if s == shard} for pid, shard in shards.items()}


def _holder_pid(row: dict[str, Any]) -> int:
    return int(str(row["holder"]).split("/")[1])  # holder ids are host/pid/random


def test_drivers_that_join_and_leave_rebalance_the_shards_under_load(kafka, minio_bucket, tmp_path: Path) -> None:
    topic = _topic(kafka)
    file = write_config(tmp_path, kafka.bootstrap_servers, minio_bucket, [topic], max_records_per_batch=2_000,
                        lease_duration=f"{LEASE:.0f}s", shards="auto")
    producer = _Producer(kafka.bootstrap_servers, topic)
    producer.thread.start()
    figures: dict[str, Any] = {}
    drivers = {name: ingest_process(file, "backup", tmp_path / f"{name}.log") for name in ("a", "b")}
    try:
        eventually(lambda: _held(file, 2), 600, lambda: f"two drivers holding two shards: {_rows(file)}")
        eventually(lambda: _committed(file) > 0, 600, "the two drivers to commit")
        # -- a third driver joins under load: the map grows to three, the new driver takes the new shard ----------
        figures["lag_before_join"] = producer.produced - _committed(file)
        before = _placement(file, topic)
        joined = time.monotonic()
        drivers["c"] = ingest_process(file, "backup", tmp_path / "c.log")
        rows = eventually(lambda: _held(file, 3), 600, lambda: f"three drivers holding three shards: {_rows(file)}")
        figures["join_to_three_shards_held_s"] = round(time.monotonic() - joined, 1)
        pids = {_holder_pid(r): r["shard"] for r in rows}
        assert pids[drivers["c"].pid] == 2, rows  # the joiner took the new shard; the others kept theirs
        assert {pids[drivers["a"].pid], pids[drivers["b"].pid]} == {0, 1}
        three = _placement(file, topic)
        moved = {p for p in range(PARTITIONS) if three[p] != before[p]}
        assert moved, three  # the joiner has partitions to read, and they came to it only
        assert moved == {p for p, s in three.items() if s == 2}, (before, three)
        figures["partitions_moved_on_join"] = len(moved)
        lag: list[int] = []

        def c_committed() -> bool:
            lag.append(producer.produced - _committed(file))
            return "batch committed" in (tmp_path / "c.log").read_text()

        eventually(c_committed, 600, "the joining driver to commit its shard's records")
        figures["join_to_first_commit_s"] = round(time.monotonic() - joined, 1)
        figures["lag_during_join_max"] = max(lag)
        assert any(RESHARDED in (tmp_path / f"{n}.log").read_text() for n in ("a", "b"))  # fenced, then again
        # -- one driver dies: its shard moves once its lease expired, at the next renewal of another -------------
        victim = next(n for n, d in drivers.items() if d.pid in pids and pids[d.pid] == 0)
        killed = time.monotonic()
        drivers[victim].kill9()
        eventually(lambda: _held(file, 2), 600, lambda: f"the two drivers left holding two shards: {_rows(file)}")
        figures["kill_to_two_shards_held_s"] = round(time.monotonic() - killed, 1)
        left = {_holder_pid(r): r["shard"] for r in _rows(file)}
        had, has = _by_driver(three, pids), _by_driver(_placement(file, topic), left)
        assert all(had[pid] <= has[pid] for pid in left), (had, has)  # the dead driver's partitions moved, no other
        # -- one stops cleanly: it releases its lease, and the last driver takes every partition --------------
        leaving = next(n for n in drivers if n != victim and n != "c")
        stopped = time.monotonic()
        drivers[leaving].stop()
        assert drivers[leaving].popen is not None
        assert drivers[leaving].popen.returncode == 0, (tmp_path / f"{leaving}.log").read_text()[-3000:]
        eventually(lambda: _held(file, 1), 600, lambda: f"the last driver holding the one shard: {_rows(file)}")
        figures["stop_to_one_shard_held_s"] = round(time.monotonic() - stopped, 1)
        producer.stop.set()
        producer.thread.join(timeout=120)
        eventually(lambda: _committed(file) == producer.produced, 600,
                   lambda: f"every record to be committed: {_committed(file)} of {producer.produced}")
        drivers["c"].stop()
        assert drivers["c"].popen is not None
        assert drivers["c"].popen.returncode == 0, (tmp_path / "c.log").read_text()[-3000:]
    finally:
        producer.stop.set()
        for driver in drivers.values():
            driver.kill9()
    config = config_of(file)
    report = verify_topic(open_metastore(config), open_bucket(config.bucket), config.kafka, "backup", 1, topic)
    assert (report.missing, report.duplicated, report.stored) == (0, 0, producer.produced), report.as_dict()
    figures.update(records=producer.produced, lease_s=LEASE)
    print("rebalance figures:", json.dumps(figures))
