"""Metastore throughput and query latency, against plain SQLite in the same run.

* ``AddBlocks`` throughput: one node (the embedded default, in-process, committing to SQLite through the
  state machine) with batches of 500 blocks and with one block per command; and a real 3-process Raft
  cluster over HTTP from 4 concurrent clients, with batches of 500 and with one block per command.
* Durable commits: the Raft cluster runs on the durable journal (each node fsyncs entries before it acknowledges
  them, once per tick for all of them). Its baseline, in the same run, is the same cluster on pysyncobj's own
  journal, which never fsyncs (the behaviour before; ``SHALE_TEST_ONLY_UNSYNCED_RAFT_JOURNAL``, a benchmark and
  test switch). A cluster's throughput varies from run to run by more than the difference measured (two runs of
  40 commands each gave ratios of 0.69 and 1.06 on a quiet machine), so each journal runs ``RAFT_ROUNDS`` times,
  interleaved (unsynced then durable, then durable then unsynced, ...: a drift of the machine falls on both), each
  on a fresh cluster; the figures are the medians, with the slowest and fastest run beside them.
  ``ratios.durable_vs_before`` is the ratio of the batched medians, ``durable_vs_before_unbatched`` of the
  one-block ones; ``..._pairs_min`` and ``..._pairs_max`` the lowest and highest ratio of one round's two runs
  (the spread of the comparison itself). ``raft3_leader_elections_per_run_max``: the most times a node became
  leader in one durable cluster run (1: the first election only; a loaded leader losing its followers shows here).
* Query latency at 1,000,000 entries (10 tenants x 100,000 blocks over 30 days): one tenant, a random 1-hour
  range, two matchers ``{topic="app-3", level="ERROR"}``, 300 queries.
* Baseline: a plain SQLite table (id, tenant, time range, labels JSON, meta JSON) with an index on
  (tenant, min_time), inserted with ``executemany`` in one transaction per batch, queried with the same
  time filter and the same matcher semantics.
"""

from __future__ import annotations

import json
import random
import sqlite3
import statistics
import tempfile
import threading
from pathlib import Path
from typing import Any

from tests.factories import BASE_MS
from tests.unit.metastore.helpers import meta

from bench.common import progress, timed, write_result
from shale.block import BlockMeta
from shale.dev.metastore import MetastoreCluster
from shale.index import match_label_sets, parse_matchers
from shale.metastore import AddBlocks, MetastoreService, SingleNodeLog, StateMachine
from shale.metastore.raft.journal import UNSYNCED_BASELINE_ENV

TENANTS, PER_TENANT, DAYS, BATCH = 10, 100_000, 30, 500
QUERIES = 300
SELECTOR = '{topic="app-3", level="ERROR"}'
HOUR = 3_600_000
RAFT_ROUNDS = 3
RAFT_COMMANDS = {"batched": (BATCH, 100), "unbatched": (1, 1000)}
"""Per Raft mode: blocks per command and commands per run (spread over 4 clients)."""


def _block(tenant: int, i: int) -> BlockMeta:
    t = BASE_MS + int(i * DAYS * 24 * HOUR / PER_TENANT)
    topic = f"app-{i % 8}"
    levels = [{"topic": topic, "level": "INFO"}] + ([{"topic": topic, "level": "ERROR"}] if i % 3 == 0 else [])
    return meta(tenant=f"t{tenant}", topic=topic, partition=i % 4, start=i * 100, end=i * 100 + 100, time_ms=t,
                min_time=t - 60_000, max_time=t + 240_000, labels=levels, key=f"{tenant}/{i}")


def _percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[int(len(ordered) * 0.99) - 1]


class PlainSQLite:
    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(str(path), isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.execute("CREATE TABLE blocks (id TEXT PRIMARY KEY, tenant TEXT, min_time INTEGER, max_time INTEGER, "
                          "labels TEXT, meta TEXT)")
        self.conn.execute("CREATE INDEX by_tenant_time ON blocks (tenant, min_time)")

    def add(self, blocks: list[BlockMeta]) -> None:
        self.conn.execute("BEGIN")
        self.conn.executemany("INSERT OR IGNORE INTO blocks VALUES (?, ?, ?, ?, ?, ?)", [
            (b.id, b.tenant, b.min_time, b.max_time,
             json.dumps([[{"topic": d.topic, "kind": d.kind, "group": b.group, **ls} for ls in d.labels]
                         for d in b.datasets]), b.model_dump_json()) for b in blocks])
        self.conn.execute("COMMIT")

    def query(self, tenant: str, start: int, end: int, selector: str) -> list[BlockMeta]:
        matchers = parse_matchers(selector)
        out = []
        for labels, raw in self.conn.execute(
                "SELECT labels, meta FROM blocks WHERE tenant = ? AND min_time <= ? AND max_time >= ?",
                (tenant, end, start)):
            if any(match_label_sets(sets, matchers) for sets in json.loads(labels)):
                out.append(BlockMeta.model_validate_json(raw))
        return out


def _throughput(add: Any, batches: list[list[BlockMeta]]) -> float:
    with timed() as t:
        for batch in batches:
            add(batch)
    return sum(len(b) for b in batches) / t[0]


def _raft_throughput(work: Path, name: str, durable: bool, batch: int, commands: int) -> tuple[float, int]:
    """Blocks/s of a fresh 3-node cluster: ``commands`` AddBlocks of ``batch`` blocks, spread over 4 clients; and
    how many times a node became leader (its log's ``raft role: ... -> leader``; 1 is the first election)."""
    (work / name).mkdir()
    cluster = MetastoreCluster(work / name, 3,
                               environment={} if durable else {UNSYNCED_BASELINE_ENV: "1"}).start()
    try:
        batches = [[_block(9, 200_000 + c * 100_000 + i * batch + j) for j in range(batch)]
                   for c in range(4) for i in range(commands // 4)]
        per_client = [batches[c::4] for c in range(4)]

        failures: list[BaseException] = []

        def run(mine: list[list[BlockMeta]]) -> None:
            client = cluster.client()
            try:
                for batch in mine:
                    assert client.submit(AddBlocks(blocks=batch)).ok
            except BaseException as exc:  # a failed client fails the run: its blocks were never committed
                failures.append(exc)
            finally:
                client.close()

        threads = [threading.Thread(target=run, args=(p,)) for p in per_client]
        with timed() as t:
            for th in threads:
                th.start()
            for th in threads:
                th.join()
        if failures:
            raise RuntimeError(f"{name}: {len(failures)} of 4 clients failed: {failures[0]!r}") from failures[0]
        return sum(len(b) for b in batches) / t[0], _elections(work / name)
    finally:
        cluster.stop()


def _elections(directory: Path) -> int:
    return sum(1 for log in directory.glob("node*.log") for line in log.read_text(errors="replace").splitlines()
               if "raft role:" in line and "-> leader" in line)


def _raft_rounds(work: Path, mode: str) -> tuple[list[float], list[float], list[int]]:
    """Blocks/s of ``RAFT_ROUNDS`` runs on each journal (unsynced, durable), interleaved, each on a fresh cluster;
    and the leader elections of each durable run."""
    batch, commands = RAFT_COMMANDS[mode]
    runs: dict[bool, list[float]] = {False: [], True: []}
    elections: list[int] = []
    for r in range(RAFT_ROUNDS):
        for durable in (False, True) if r % 2 == 0 else (True, False):
            name = f"{mode}-{'durable' if durable else 'unsynced'}-{r}"
            rate, elected = _raft_throughput(work, name, durable, batch, commands)
            runs[durable].append(rate)
            if durable:
                elections.append(elected)
            progress(f"  {name}: {rate:,.0f} blocks/s, {elected} leader election(s)")
    return runs[False], runs[True], elections


def _spread(prefix: str, runs: list[float]) -> dict[str, float]:
    return {prefix: round(statistics.median(runs)), f"{prefix}_min": round(min(runs)),
            f"{prefix}_max": round(max(runs))}


def run() -> dict[str, Any]:
    rng = random.Random(7)
    with tempfile.TemporaryDirectory(prefix="shale-bench-metastore-") as tmp:
        work = Path(tmp)
        state = StateMachine(work / "shale.db")
        service = MetastoreService(state, SingleNodeLog(state))
        plain = PlainSQLite(work / "plain.db")

        unbatched = [[_block(8, 500_000 + i)] for i in range(2000)]
        progress("unbatched AddBlocks: 2,000 commands of one block")
        ours_unbatched = _throughput(lambda b: service.submit(AddBlocks(blocks=b)), unbatched)
        plain_unbatched = _throughput(plain.add, unbatched)

        progress(f"loading {TENANTS * PER_TENANT:,} blocks in batches of {BATCH}")
        ours_time = plain_time = 0.0
        for tenant in range(TENANTS):
            batches = [[_block(tenant, i + j) for j in range(BATCH)] for i in range(0, PER_TENANT, BATCH)]
            with timed() as t:
                for batch in batches:
                    service.submit(AddBlocks(blocks=batch))
            ours_time += t[0]
            with timed() as t:
                for batch in batches:
                    plain.add(batch)
            plain_time += t[0]
            progress(f"  tenant {tenant + 1}/{TENANTS}")
        total = TENANTS * PER_TENANT
        assert state.reader.count_blocks() == total + len(unbatched)

        progress(f"{QUERIES} queries: one tenant, one hour, two matchers")
        ours_ms, plain_ms, sizes = [], [], []
        for _ in range(QUERIES):
            start = BASE_MS + rng.randrange(DAYS * 24 - 1) * HOUR
            tenant = f"t{rng.randrange(TENANTS)}"
            with timed() as t:
                found = service.query_blocks([tenant], start, start + HOUR, SELECTOR)
            ours_ms.append(t[0] * 1000)
            with timed() as t:
                expected = plain.query(tenant, start, start + HOUR, SELECTOR)
            plain_ms.append(t[0] * 1000)
            assert sorted(b.id for b in found) == sorted(b.id for b in expected)
            sizes.append(len(found))

        progress(f"3-node Raft cluster: 4 clients, batches of 500 and single blocks, {RAFT_ROUNDS} runs on each "
                 "journal, interleaved")
        raft_before, raft, elections = _raft_rounds(work, "batched")
        raft_before_single, raft_single, elections_single = _raft_rounds(work, "unbatched")

    p50, p99 = _percentiles(ours_ms)
    b50, b99 = _percentiles(plain_ms)
    figures = {"add_blocks_per_s_single_batched": round(total / ours_time),
               **_spread("add_blocks_per_s_raft3_batched", raft),
               **_spread("add_blocks_per_s_raft3_unbatched", raft_single),
               "raft3_leader_elections_per_run_max": max(elections + elections_single),
               "add_blocks_per_s_single_unbatched": round(ours_unbatched),
               "query_p50_ms_1m": round(p50, 2), "query_p99_ms_1m": round(p99, 2),
               "entries": total, "blocks_per_query_mean": round(statistics.mean(sizes), 1)}
    baseline = {"add_blocks_per_s_single_batched": round(total / plain_time),
                "add_blocks_per_s_single_unbatched": round(plain_unbatched),
                **_spread("add_blocks_per_s_raft3_batched_unsynced_journal", raft_before),
                **_spread("add_blocks_per_s_raft3_unbatched_unsynced_journal", raft_before_single),
                "query_p50_ms_1m": round(b50, 2), "query_p99_ms_1m": round(b99, 2)}
    ratios = {"add_batched_vs_plain": round(baseline["add_blocks_per_s_single_batched"] and
                                            figures["add_blocks_per_s_single_batched"] /
                                            baseline["add_blocks_per_s_single_batched"], 2),
              "query_p99_plain_over_ours": round(b99 / p99, 2),
              "durable_vs_before": round(statistics.median(raft) / statistics.median(raft_before), 2),
              "durable_vs_before_pairs_min": round(min(d / b for d, b in zip(raft, raft_before, strict=True)), 2),
              "durable_vs_before_pairs_max": round(max(d / b for d, b in zip(raft, raft_before, strict=True)), 2),
              "durable_vs_before_unbatched": round(statistics.median(raft_single) /
                                                   statistics.median(raft_before_single), 2),
              "durable_vs_before_unbatched_pairs_min": round(min(
                  d / b for d, b in zip(raft_single, raft_before_single, strict=True)), 2),
              "durable_vs_before_unbatched_pairs_max": round(max(
                  d / b for d, b in zip(raft_single, raft_before_single, strict=True)), 2)}
    return write_result("metastore", figures, baseline, ratios, __doc__ or "")
