"""A real 3-process Raft metastore on loopback: kill -9 the leader under load, nothing acknowledged is lost,
replicas converge, and a restarted node catches up from its journal and snapshots."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
from tests.unit.metastore.helpers import meta
from tests.waiting import eventually

from shale.dev.metastore import MetastoreCluster
from shale.errors import MetastoreUnavailableError
from shale.metastore import AddBlocks


def _load(cluster: MetastoreCluster, writer: int, acked: list[str], stop: threading.Event) -> None:
    client = cluster.client(deadline=20)
    n = 0
    while not stop.is_set():
        batch = [meta(tenant=f"w{writer}", start=(n + i) * 10, end=(n + i) * 10 + 10) for i in range(3)]
        n += 3
        try:
            result = client.submit(AddBlocks(blocks=batch))
        except MetastoreUnavailableError:
            continue  # not acknowledged: may or may not be applied
        assert result.ok
        acked.extend(b.id for b in batch)
    client.close()


def _converged(cluster: MetastoreCluster, timeout: float = 60) -> list[tuple[str, int]]:
    cluster.client().submit(AddBlocks(blocks=[]))  # one more entry, so every replica has something to apply

    def same_hashes() -> list[tuple[str, int]] | None:
        hashes = cluster.state_hashes()
        return hashes if len({h for h, _ in hashes}) == 1 and len(hashes) == cluster.size else None

    return eventually(same_hashes, timeout, lambda: f"the replicas to converge: {cluster.state_hashes()}")


def test_leader_killed_under_load_loses_no_acknowledged_write(tmp_path: Path) -> None:
    cluster = MetastoreCluster(tmp_path, 3, extra=["metastore.snapshot_entries=100"]).start()
    try:
        acked: list[list[str]] = [[], []]
        stop = threading.Event()
        writers = [threading.Thread(target=_load, args=(cluster, w, acked[w], stop)) for w in range(2)]
        for t in writers:
            t.start()
        eventually(lambda: sum(len(a) for a in acked) > 30, 60, "the load to get going")
        old_leader = cluster.wait_leader()
        before = sum(len(a) for a in acked)
        cluster.kill9(old_leader)
        eventually(lambda: sum(len(a) for a in acked) > before + 30, 60, "writes acknowledged after the failover")
        stop.set()
        for t in writers:
            t.join(timeout=60)
        new_leader = cluster.wait_leader()
        assert new_leader != old_leader

        client = cluster.client()
        stored = {m.id for w in range(2) for m in client.query_blocks([f"w{w}"], 0, 2**62)}
        missing = {b for a in acked for b in a} - stored
        assert not missing, f"{len(missing)} acknowledged blocks are missing"

        cluster.start_node(old_leader)  # restarts from its journal and the snapshots taken meanwhile
        hashes = _converged(cluster)
        assert len({index for _, index in hashes}) == 1
    finally:
        cluster.stop()


def test_follower_restarted_after_many_writes_catches_up_from_a_snapshot(tmp_path: Path) -> None:
    cluster = MetastoreCluster(tmp_path, 3, extra=["metastore.snapshot_entries=50"]).start()
    try:
        leader = cluster.wait_leader()
        follower = (leader + 1) % 3
        cluster.kill9(follower)
        client = cluster.client()
        for i in range(150):
            assert client.submit(AddBlocks(blocks=[meta(start=i * 10, end=i * 10 + 10)])).ok
        snapshot = tmp_path / f"node{leader}" / "raft" / "raft.snapshot"

        def snapshot_taken() -> bool:
            if snapshot.exists():
                return True
            client.submit(AddBlocks(blocks=[]))
            return False

        eventually(snapshot_taken, 30, "the leader to take a snapshot")
        cluster.start_node(follower)
        _converged(cluster)
        admin = {"authorization": f"Bearer {cluster.admin_token}"}
        status = httpx.get(cluster.addresses[follower] + "/v1/status", headers=admin, timeout=5).json()
        assert status["blocks"] == 150
        assert status["role"] == "follower"
        # A follower answers linearizable reads through the leader's read index (a peer call, with the token
        # derived from the cluster secret).
        body = httpx.get(cluster.addresses[follower] + "/v1/blocks", params={"tenant": "acme"}, headers=admin,
                         timeout=10).json()
        assert len(body["blocks"]) == 150
    finally:
        cluster.stop()


def test_single_node_http_api_errors_are_clear(tmp_path: Path) -> None:
    cluster = MetastoreCluster(tmp_path, 1).start()
    try:
        base = cluster.addresses[0]
        http = httpx.Client(headers={"authorization": f"Bearer {cluster.admin_token}",
                                     "content-type": "application/json"})
        bad = http.post(base + "/v1/commands", content=b'{"kind": "TruncateIndex", "prepared_term": 1, '
                                                        b'"partitions": [], "cutoffs": {}}')
        assert bad.status_code == 400
        assert "proposed by the metastore itself" in bad.json()["message"]
        garbage = http.post(base + "/v1/commands", content=b"{nope")
        assert garbage.status_code == 400
        selector = http.get(base + "/v1/blocks", params={"tenant": "acme", "selector": '{a=~"("}'})
        assert selector.status_code == 400
        assert "regular expression" in selector.json()["message"]
        assert httpx.get(base + "/readyz").status_code == 200
        metrics = httpx.get(base + "/metrics").text
        assert "shale_metastore_raft_leader" in metrics
    finally:
        cluster.stop()
