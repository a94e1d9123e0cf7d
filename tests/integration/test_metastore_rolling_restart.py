"""A rolling restart of a 3-node Raft metastore while ingestion runs on the Spark standalone cluster and records
keep arriving: each node in turn is stopped (SIGTERM, as ``systemctl restart`` does), ingestion keeps committing
on the other two, the node comes back and catches up before the next one goes. No acknowledged commit is lost —
every committed offset read from the cluster during the restart is still committed at the end — and every record
is stored exactly once."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

from tests.integration.cluster_helpers import bucket_records, offsets, shale_process
from tests.integration.ingest_helpers import config_of, create_topic, produce_json, write_config
from tests.waiting import eventually

from shale.dev import SparkStandalone, driver_conf
from shale.dev.metastore import MetastoreCluster
from shale.errors import MetastoreUnavailableError
from shale.metastore import MetastoreClient
from shale.metastore.api import auth
from shale.objstore import open_bucket
from shale.verify import verify_topic

BATCH = 500


class Observer:
    """Reads the committed offsets from the cluster every 0.3 s: each value read was acknowledged to a client."""

    def __init__(self, client: MetastoreClient) -> None:
        self.client = client
        self.seen: dict[tuple[str, int], int] = {}
        self.decreases: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        while not self.stop.wait(0.3):
            try:
                current = {(o.topic, o.partition): o.committed_end for o in self.client.offsets("backup", 1)}
            except MetastoreUnavailableError:
                continue
            for key, end in current.items():
                if end < self.seen.get(key, 0):
                    self.decreases.append(f"{key}: {self.seen[key]} then {end}")
                self.seen[key] = max(end, self.seen.get(key, 0))
            self.decreases += [f"{key} disappeared" for key in self.seen if key not in current]

    def total(self) -> int:
        return sum(self.seen.values())


def test_rolling_restart_of_a_three_node_metastore_during_ingest(kafka, minio_bucket,
                                                                 spark_cluster: SparkStandalone,
                                                                 tmp_path: Path) -> None:
    cluster = MetastoreCluster(tmp_path / "metastore", 3, bucket=minio_bucket,
                               extra=["metastore.dlq_interval=1s", "metastore.snapshot_entries=50"]).start()
    topic = f"rolling-{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap_servers, topic, 4)
    produced = [0]
    stop_producing = threading.Event()

    def produce() -> None:
        while not stop_producing.wait(0.2):
            produce_json(kafka.bootstrap_servers, topic, BATCH, start=produced[0], seed=produced[0])
            produced[0] += BATCH

    token_file = tmp_path / "ingest.token"
    auth.write_private(token_file, cluster.issue_token("ingest-backup", "ingest", groups=["backup"]) + "\n")
    file = write_config(tmp_path, kafka.bootstrap_servers, minio_bucket, [topic],
                        spark={"master": spark_cluster.master_url, "conf": driver_conf()},
                        metastore={"mode": "remote", "addresses": cluster.addresses, "request_timeout": 3,
                                   "client_deadline": 30, "token_file": str(token_file)})
    process = shale_process(file, ["ingest", "--group", "backup"], tmp_path / "ingest.log")
    observer = Observer(cluster.client(deadline=5))
    producer = threading.Thread(target=produce)
    try:
        producer.start()
        observer.thread.start()

        def ingesting(beyond: int) -> None:
            eventually(lambda: observer.total() > beyond or not process.alive(), 240,
                       lambda: f"a commit beyond {beyond}:\n{process.log_path.read_text()[-3000:]}")
            assert process.alive(), process.log_path.read_text()[-3000:]

        ingesting(0)
        leader = cluster.wait_leader()
        for node in [n for n in range(3) if n != leader] + [leader]:  # followers first, the leader last
            cluster.stop_node(node)
            ingesting(observer.total())  # ingestion goes on with two of three nodes
            cluster.start_node(node)  # same data directory and ports: it replays its journal and catches up
            target = cluster.status(cluster.wait_leader())["applied_index"]
            eventually(lambda n=node, t=target: cluster.status(n)["applied_index"] >= t, 120,
                       f"node {node} to catch up to index {target}")
        ingesting(observer.total())  # and after the last restart
        stop_producing.set()
        producer.join()
        eventually(lambda: observer.total() >= produced[0] or not process.alive(), 240,
                   lambda: f"ingest to catch up with {produced[0]}:\n{process.log_path.read_text()[-3000:]}")
        assert process.alive(), process.log_path.read_text()[-3000:]
        process.stop()
        observer.stop.set()
        observer.thread.join()

        client = cluster.client()
        final = {(o.topic, o.partition): o.committed_end for o in client.offsets("backup", 1)}
        assert observer.decreases == []
        lost = {key: end for key, end in observer.seen.items() if final.get(key, 0) < end}
        assert lost == {}, f"acknowledged commits lost: {lost}"
        assert sum(final.values()) == produced[0]
        config = config_of(file)
        bucket = open_bucket(config.bucket)
        assert not list(bucket.list("_shale/dlq-rejected/"))
        report = verify_topic(client, bucket, config.kafka, "backup", 1, topic)
        assert (report.missing, report.duplicated, report.stored) == (0, 0, produced[0]), report.as_dict()
        stored = offsets(bucket_records(config.bucket, "backup"))
        assert len(stored) == produced[0]
        assert set(stored.values()) == {1}
    finally:
        stop_producing.set()
        observer.stop.set()
        process.stop()
        cluster.stop()
