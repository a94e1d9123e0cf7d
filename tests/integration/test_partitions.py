"""Network partitions with real processes (DESIGN 10.7, "Network partitions"): three metastore nodes and two
`shale ingest` drivers of one group, each in a network namespace of its own (tests/netns.py), Kafka and MinIO on
this machine's side of the service bridge, a producer writing all along. Links between hosts are cut and healed
with ``ip link``:

1. the metastore leader cut off from its followers, still reachable by the drivers;
2. the driver holding the lease cut off from the metastore, not from Kafka and the bucket;
3. a minority partition: the leader and the lease holder on one side, the followers and the standby on the other;
4. flapping links: random pair links cut and healed at random moments.

Each scenario ends, the producer stopped and every record committed, with ``shale verify`` (0 missing, 0
duplicated) and a check of the commit history the drivers logged: every commit the metastore acknowledged is in the
index afterwards, no commit refused for a stale lease is, and every block in the index belongs to a commit a driver
made. How long the group went without an acknowledged commit is measured and logged (test-output/partitions/),
never asserted.

The short profile (``make test``) runs the four scenarios one after the other on one deployment, one fault each;
``SHALE_PARTITIONS=long`` runs each scenario on a deployment of its own, three times, with longer partitions and
many more flaps.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import re
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from tests.integration.ingest_helpers import create_topic, write_config
from tests.netns import Network
from tests.producing import CheckedProducer
from tests.waiting import eventually

from shale.config import BucketConfig
from shale.dev import KafkaBroker, MinioServer
from shale.dev.metastore import MetastoreCluster
from shale.metastore import MetastoreClient
from shale.process import ManagedProcess

ROOT = Path(__file__).resolve().parents[2]
LONG = os.environ.get("SHALE_PARTITIONS", "short") == "long"
PROFILE = {"rounds": 3, "hold": (20.0, 60.0), "flaps": 40} if LONG else {"rounds": 1, "hold": (8.0, 15.0), "flaps": 8}
NODES = ["ms0", "ms1", "ms2"]
DRIVERS = ["d0", "d1"]
PARTITIONS = 4
RATE = 150  # records per second written by the producer
LEASE = 5.0
ACKED = ("committed", "replayed")
FENCED = re.compile(r"batch (\S+) is fenced off")


@pytest.fixture(scope="module")
def net() -> Iterator[Network]:
    network = Network([*NODES, *DRIVERS], apart={frozenset(DRIVERS)}).start()
    yield network
    network.close()


@pytest.fixture(scope="module")
def shared(net: Network, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KafkaBroker, MinioServer]]:
    """Kafka and MinIO on the service bridge's address of this machine (reachable from every namespace, from
    nothing outside this machine)."""
    folder = tmp_path_factory.mktemp("partition-services")
    kafka = KafkaBroker(folder / "kafka", heap="384m", host=net.service_address)
    minio = MinioServer(folder / "minio", host=net.service_address)
    try:
        kafka.start()
        minio.start()
        yield kafka, minio
    finally:
        kafka.stop()
        minio.stop()


def _ready(log: str) -> bool:
    """A driver's log says it holds the lease or waits as a standby, and has not lost the lease since: a driver
    fenced in one round exits a while after the heal, and the next fault must not start while it still looks
    ready (its standby would be missing: the long profile once measured a 33 s fault without a takeover so)."""
    said = {mark: log.rfind(mark) for mark in ("standby: another process", "this process writes", "ingest lease lost")}
    latest = max(said, key=lambda mark: said[mark])
    return said[latest] >= 0 and latest != "ingest lease lost"


@dataclass
class World:
    """One run: a fresh cluster, bucket and topic; the drivers; the producer; what was cut and when."""

    net: Network
    cluster: MetastoreCluster
    config: Path
    topic: str
    bootstrap: str
    folder: Path
    drivers: dict[str, ManagedProcess] = field(default_factory=dict)
    exits: list[tuple[str, int | None]] = field(default_factory=list)
    """(driver, exit code) of every driver that stopped by itself (a fenced driver does) and was started again."""
    produced: int = 0
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    faults: list[tuple[float, float, str]] = field(default_factory=list)
    """(cut at, healed at, what) per fault, wall-clock seconds."""

    def client(self) -> MetastoreClient:
        return self.cluster.client(deadline=30)

    def start_driver(self, name: str) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("SHALE_FAILPOINTS", "PYSPARK_PYTHON")}
        env["SPARK_LOCAL_IP"] = self.net.address(name)  # the driver's own address in its namespace
        command = [*self.net.wrap(name), sys.executable, "-m", "shale.cli", "--config", str(self.config),
                   "--log-format", "json", "ingest", "--group", "backup"]
        starts = len(list(self.folder.glob(f"{name}-*.log")))
        process = ManagedProcess(f"ingest-{name}", command, self.folder / f"{name}-{starts}.log", env=env, cwd=ROOT)
        process.start()
        self.drivers[name] = process

    def produce(self) -> threading.Thread:
        """Write RATE records a second (numbered, JSON) until ``stop``; bounded by the test's own length."""
        def run() -> None:
            try:
                write()
            except Exception as exc:
                self.errors.append(f"producer: {exc!r}")

        def write() -> None:
            producer = CheckedProducer({"bootstrap.servers": self.bootstrap, "linger.ms": 20,
                                        "enable.idempotence": True})
            base = 1_795_000_000
            while not self.stop.wait(0.1) and self.produced < 2_000_000:
                for _ in range(RATE // 10):
                    i = self.produced
                    producer.produce(self.topic, key=str(i).encode(),
                                     value=json.dumps({"ts": base + i, "level": "INFO", "msg": f"e{i}"}).encode())
                    self.produced += 1
            producer.flush(120)

        thread = threading.Thread(target=run, name="producer", daemon=True)
        thread.start()
        return thread

    def logs(self) -> list[Path]:
        return sorted(p for d in DRIVERS for p in self.folder.glob(f"{d}-*.log"))

    def history(self) -> History:
        return History.read(self.logs())

    def ready(self) -> None:
        """Wait until every driver holds the lease or waits as a standby (a driver started again warms up first:
        a fault before that would measure its start, not the takeover)."""
        def waiting() -> bool:
            self.revive()  # a fenced driver may exit a while after the heal
            return all(_ready(p.log_path.read_text(errors="replace")) for p in self.drivers.values())

        eventually(waiting, 300, "every driver to hold the lease or wait as a standby")

    def revive(self) -> None:
        """Start again every driver that exited (as its supervisor would)."""
        for name, process in list(self.drivers.items()):
            if not process.alive():
                self.exits.append((name, process.popen.poll() if process.popen else None))
                self.start_driver(name)

    def holder(self) -> str:
        """The driver that took the lease last."""
        taken = [(ts, path.name.split("-")[0]) for path in self.logs() for ts, line in _lines(path)
                 if line.get("msg", "").startswith("ingest lease ") and "this process writes" in line["msg"]]
        assert taken, "no driver holds the lease"
        return max(taken)[1]

    def acked_after(self, moment: float) -> bool:
        return any(t > moment for t in self.history().acked_times())

    def fault(self, what: str, pairs: list[tuple[str, str]], hold: float) -> None:
        """Cut ``pairs``, hold for ``hold`` seconds while the load goes on, heal, wait for a commit after it."""
        start = time.time()
        for a, b in pairs:
            self.net.cut(a, b)
        node = next(n for pair in pairs for n in pair if n in NODES)  # a metastore node cut off from its peer
        peer = next(b if a == node else a for a, b in pairs if node in (a, b))
        assert not self.net.reaches(peer, self.net.address(node), 7070), f"{peer} still reaches {node}"
        linked = [h for h in self.net.names if frozenset((h, node)) in set(self.net.pairs) - self.net.cut_links]
        assert all(self.net.reaches(h, self.net.address(node), 7070) for h in linked[:1]), f"{linked} lost {node}"
        time.sleep(hold)  # the partition lasts this long: the moment is what is tested, not a wait for a state
        self.net.heal_all()
        self.recovered(start, what)

    def flap(self, rng: random.Random, flaps: int) -> None:
        """Cut a random pair link for a random moment, heal it, pause a random moment; ``flaps`` times."""
        start = time.time()
        pairs = [(a, b) for a, b in (sorted(p) for p in self.net.pairs)]
        for _ in range(flaps):
            a, b = rng.choice(pairs)
            self.net.cut(a, b)
            time.sleep(rng.uniform(0.3, 4.0))
            self.net.heal(a, b)
            time.sleep(rng.uniform(0.0, 2.0))
        self.recovered(start, f"{flaps} flaps of random pair links")

    def recovered(self, start: float, what: str) -> None:
        healed = time.time()
        self.faults.append((start, healed, what))
        eventually(lambda: self.acked_after(healed), 180, f"a commit acknowledged after healing {what}")
        self.revive()


@dataclass
class History:
    """What the drivers logged of their commits: each attempt (its blocks), its outcome, the fenced ones."""

    attempts: dict[str, dict[str, Any]] = field(default_factory=dict)
    outcomes: dict[str, tuple[float, str]] = field(default_factory=dict)
    fenced: set[str] = field(default_factory=set)

    @classmethod
    def read(cls, logs: list[Path]) -> History:
        history = cls()
        for path in logs:
            for ts, line in _lines(path):
                if line.get("msg") == "batch commit":
                    history.attempts[line["batch"]] = {**line, "at": ts}
                elif line.get("msg") == "batch committed":
                    history.outcomes[line["batch"]] = (ts, line["outcome"])
            history.fenced |= set(FENCED.findall(path.read_text(errors="replace")))
        return history

    def acked_times(self) -> list[float]:
        return sorted(t for t, outcome in self.outcomes.values() if outcome in ACKED)

    def check(self, indexed: set[str]) -> dict[str, int]:
        """Acknowledged ⇒ in the index; fenced ⇒ none of its blocks in the index; every indexed block was
        committed by some attempt. Returns the counts."""
        acked = [b for b, (_, outcome) in self.outcomes.items() if outcome in ACKED]
        for batch in acked:
            lost = set(self.attempts[batch]["block_ids"]) - indexed
            assert not lost, f"batch {batch} was acknowledged but {len(lost)} of its blocks are not in the index"
        for batch in self.fenced:
            applied = set(self.attempts[batch]["block_ids"]) & indexed
            assert not applied, f"batch {batch} was fenced off but {len(applied)} of its blocks are in the index"
        attempted = {b for a in self.attempts.values() for b in a["block_ids"]}
        assert indexed <= attempted, f"blocks no driver committed are in the index: {sorted(indexed - attempted)[:5]}"
        dead = [b for b, (_, outcome) in self.outcomes.items() if outcome == "dead-lettered"]
        return {"attempts": len(self.attempts), "acknowledged": len(acked), "fenced": len(self.fenced),
                "dead_lettered": len(dead),
                "dead_lettered_applied": sum(set(self.attempts[b]["block_ids"]) <= indexed for b in dead)}


def _lines(path: Path) -> Iterator[tuple[float, dict[str, Any]]]:
    if not path.exists():
        return
    for raw in path.read_text(errors="replace").splitlines():
        if not raw.startswith("{"):
            continue  # Spark's and the JVM's own lines
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        yield datetime.fromisoformat(line["ts"].replace("Z", "+00:00")).timestamp(), line


def unavailability(acked: list[float], faults: list[tuple[float, float, str]]) -> dict[str, Any]:
    """Per fault, the longest time without an acknowledged commit among the gaps that overlap it (from the cut to
    the first commit after the heal at most); and the median gap before the first fault, for scale."""
    first = faults[0][0]
    before = [b - a for a, b in itertools.pairwise(acked) if b < first]
    out: dict[str, Any] = {"baseline_median_gap_s": round(statistics.median(before), 2) if before else None,
                           "faults": []}
    for cut, healed, what in faults:
        points = [cut, *[t for t in acked if cut < t]]
        after = [t for t in acked if t > healed]
        end = after[0] if after else healed
        inside = [t for t in points if t <= end]
        gaps = [b - a for a, b in itertools.pairwise(inside)]
        out["faults"].append({"what": what, "held_s": round(healed - cut, 2),
                              "longest_without_commit_s": round(max(gaps, default=end - cut), 2),
                              "first_commit_after_heal_s": round(end - healed, 2)})
    return out


@pytest.fixture
def world(net: Network, shared: tuple[KafkaBroker, MinioServer], tmp_path: Path) -> Iterator[World]:
    kafka, minio = shared
    bucket_name = f"p-{uuid.uuid4().hex[:10]}"
    minio.create_bucket(bucket_name)
    bucket = BucketConfig(url=f"s3://{bucket_name}", endpoint=minio.endpoint, access_key_id=minio.access_key,
                          secret_access_key=minio.secret_key, allow_http=True)
    (tmp_path / "cluster").mkdir()
    cluster = MetastoreCluster(tmp_path / "cluster", 3, bucket=bucket, hosts=[net.address(n) for n in NODES],
                               wrappers=[net.wrap(n) for n in NODES], http_ports=[7070] * 3, raft_ports=[7080] * 3,
                               extra=["metastore.dlq_interval=2s", "metastore.request_timeout=3s"])
    topic = f"parts-{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap_servers, topic, PARTITIONS)
    token = tmp_path / "token"
    token.write_text(cluster.admin_token)
    token.chmod(0o600)
    config = write_config(tmp_path, kafka.bootstrap_servers, bucket, [topic],
                          metastore={"mode": "remote", "addresses": cluster.addresses, "token_file": str(token),
                                     "request_timeout": "3s", "client_deadline": "10s"},
                          spark={"master": "local[1]"}, max_records_per_batch=2_000, lease_duration=f"{LEASE:g}s")
    with config.open("a") as toml:
        toml.write('[logging]\nlevel = "DEBUG"\n')
    world = World(net, cluster, config, topic, kafka.bootstrap_servers, tmp_path)
    try:
        cluster.start()
        yield world
    finally:
        world.stop.set()
        net.heal_all()
        for process in world.drivers.values():
            process.kill9()
        cluster.stop()
        for process in cluster.processes:
            if process is not None:
                process.kill9()


def _hold(rng: random.Random) -> float:
    return rng.uniform(*PROFILE["hold"])


def leader_isolated(w: World, rng: random.Random) -> None:
    for _ in range(int(PROFILE["rounds"])):
        w.ready()
        leader = NODES[w.cluster.wait_leader()]
        w.fault(f"leader {leader} cut off from its followers", [(leader, n) for n in NODES if n != leader],
                _hold(rng))


def driver_isolated(w: World, rng: random.Random) -> None:
    for _ in range(int(PROFILE["rounds"])):
        w.ready()
        holder = w.holder()
        w.fault(f"lease holder {holder} cut off from the metastore", [(holder, n) for n in NODES],
                max(_hold(rng), 3 * LEASE))


def minority(w: World, rng: random.Random) -> None:
    for _ in range(int(PROFILE["rounds"])):
        w.ready()
        side = {NODES[w.cluster.wait_leader()], w.holder()}
        w.fault(f"minority {sorted(side)}", w.net.across(side), max(_hold(rng), 3 * LEASE))


def flapping(w: World, rng: random.Random) -> None:
    for _ in range(int(PROFILE["rounds"])):
        w.ready()
        w.flap(rng, int(PROFILE["flaps"]))


SCENARIOS: list[tuple[str, Callable[[World, random.Random], None]]] = [
    ("leader-isolated", leader_isolated), ("driver-isolated", driver_isolated), ("minority", minority),
    ("flapping", flapping)]


def _settle(world: World, client: MetastoreClient) -> dict[str, int]:
    """With the producer stopped: every record committed, ``shale verify`` finds 0 missing and 0 duplicated, and
    the commit history checks out. Returns the history's counts."""
    assert not world.errors, world.errors
    world.revive()

    def caught_up() -> bool:
        return sum(o.committed_end for o in client.offsets("backup", 1) if o.topic == world.topic) == world.produced

    eventually(caught_up, 600, lambda: f"every produced record to be committed ({world.produced}): "
               f"{client.offsets('backup', 1)}; drivers alive {[d for d, p in world.drivers.items() if p.alive()]}")
    done = subprocess.run([sys.executable, "-m", "shale.cli", "--config", str(world.config), "verify",
                           "--group", "backup", "--topic", world.topic, "--json"],
                          capture_output=True, text=True, cwd=ROOT, check=False, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert (report["missing"], report["duplicated"], report["stored"]) == (0, 0, world.produced), report
    indexed = {b.id for b in client.query_blocks(client.tenants(), 0, 2**62, "", "backup")}
    return world.history().check(indexed)


@pytest.mark.parametrize("name", [name for name, _ in SCENARIOS] if LONG else ["all"])
def test_partitions_under_ingest_load(world: World, name: str) -> None:
    """The scenarios one after the other on one deployment (the short profile; the long one runs each on a
    deployment of its own), each under load and each ending with verify and the history check."""
    rng = random.Random(time.time_ns())
    for driver in DRIVERS:
        world.start_driver(driver)
    client = world.client()
    results = []
    for scenario, faults in SCENARIOS:
        if name not in ("all", scenario):
            continue
        world.stop.clear()
        started = time.time()
        producer = world.produce()

        def going(since: float = started) -> bool:
            assert not world.errors, world.errors
            return len([t for t in world.history().acked_times() if t > since]) >= 3

        eventually(going, 300, f"the drivers to commit under load before {scenario}")
        first = len(world.faults)
        faults(world, rng)
        world.stop.set()
        producer.join(timeout=180)
        counts = _settle(world, client)
        acked = [t for t in world.history().acked_times() if t > started]
        results.append({"scenario": scenario, "profile": "long" if LONG else "short", "records": world.produced,
                        "lease_s": LEASE, "client_request_timeout_s": 3.0, "history": counts,
                        "drivers_exited": list(world.exits), **unavailability(acked, world.faults[first:])})
        print(json.dumps(results[-1]))  # the figures, in the test's output as well
    for process in world.drivers.values():
        process.stop()
    eventually(lambda: len(set(world.cluster.content_hashes())) == 1, 120, "the replicas to converge")
    out = ROOT / "test-output" / "partitions"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}-{'long' if LONG else 'short'}.json").write_text(json.dumps(results, indent=2))
