"""Metadata at scale, without services: the real state machine, block writer, bucket-index writer and query planner
fed synthetic commits, at 100, 1,000 and 10,000 partitions per topic and in tenants of 10,000, 100,000 and
1,000,000 live blocks. Each figure is compared with its smallest counterpart in the same run (the baseline).

* Partitions: per partition count, ``COMMITS`` ingest commits of one topic. The first is written by the ingest's
  own chunk writer (``shale.encoder.chunks.write_chunks``, backup group, ``RECORDS`` records per partition, one
  block holding every partition with a row group each, to a memory bucket) and made into one ``CommitIngestBatch``
  by the committer's ``batch_commit``; the later ones carry a copy of its block ``RECORDS`` offsets on, with its own
  id (applying reads metadata only, and writing a block of 10,000 partitions takes seconds).
  The command's JSON is what a Raft log entry holds (``raft_entry_bytes_*``); one node's ``StateMachine.apply`` of
  those bytes, as a Raft follower applies an entry (decoding included), is the apply time (``apply_*``: the best of
  the commits, as the machine is shared; the counts' commits applied in turns, so a passing load weighs on each).
  ``meta_bytes_*``: the written block's meta.json. Its partitions are all alike (the same offsets and times), which
  the packed form (``shale.block.packed``) compresses to almost nothing:
  ``*_bytes_per_partition_varied_*`` are the same figures for a block and commit whose partitions differ as a real
  topic's do (``_varied_commit``: offsets around 3e9, each partition's its own, lengths and times apart). Then
  the real ``BucketIndexWriter`` writes the tenant's bucket index (the commits' blocks) to the bucket:
  ``index_bytes_per_block_*`` is its gzipped size over its blocks. Unless ``--no-raft``, each count's first commit
  then goes to a real 3-node Raft cluster (``shale.dev.metastore.MetastoreCluster``) through its HTTP client:
  ``raft3_commit_s_*`` is the time until the leader answers (replicated and applied).
* Tenants: each tenant's blocks are loaded straight into the index store: ``IndexWriter.add_blocks`` in batches of
  ``LOAD_BATCH``, one transaction each, without the change feed or the per-command bookkeeping (the benchmark
  measures commands into such tenants, not their loading). Blocks arrive at a constant rate, ``BLOCKS_PER_HOUR``
  (a million a year), so a bigger tenant spans more time, not more blocks an hour; each holds one partition of one
  of 8 topics, with an ``ERROR`` label set on a third of them. Then per tenant, in turns with the other tenants:
  one warm-up ``AddBlocks``, ``ADDS`` one-block ``AddBlocks`` through the one-node service (``add_blocks_ms_*``:
  median), and ``QUERIES`` query plans (``query_plan_ms_*``: median): ``query_blocks`` for one hour of the
  tenant's span with ``{topic="app-3", level="ERROR"}``, then ``plan_query`` over what it returned.
* ``other_cores``: the CPU the rest of the machine used while the one-node phases ran, in cores (it is shared).

``python -m bench.metadata_scale --quick`` runs tenants ten times smaller and 100 and 1,000 partitions only, and
writes nothing.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
from tests.factories import BASE_MS, backup_table
from tests.unit.metastore.helpers import meta

from bench.common import cpu_snapshot, progress, timed, write_result
from shale.block import BlockMeta, bucket_index_key, deterministic_block_id, meta_key
from shale.bucketindex import BucketIndexWriter
from shale.config import BucketConfig, BucketIndexConfig, IngestConfig
from shale.encoder.chunks import Chunk, GroupSpec, write_chunks
from shale.index import begin, commit, parse_matchers
from shale.ingest.committer import batch_commit
from shale.ingest.plan import PartitionRange
from shale.metastore import AddBlocks, CommitIngestBatch, MetastoreService, SingleNodeLog, StateMachine
from shale.metastore.rules.commands import encode
from shale.metastore.rules.fsm import Entry
from shale.objstore import Bucket, open_bucket
from shale.query.plan import plan_query

PARTITIONS = (100, 1_000, 10_000)
TENANT_BLOCKS = (10_000, 100_000, 1_000_000)
COMMITS = 5
RECORDS = 2
ADDS = 25
QUERIES = 50
LOAD_BATCH = 5_000
BLOCKS_PER_HOUR = 114
"""A million blocks a year."""
HOUR = 3_600_000
SELECTOR = '{topic="app-3", level="ERROR"}'


def _name(n: int) -> str:
    if n % 1_000_000 == 0:
        return f"{n // 1_000_000}m"
    return f"{n // 1_000}k" if n % 1_000 == 0 else str(n)


def _commit_of(bucket: Bucket, bucket_config: BucketConfig, tenant: str, topic: str, partitions: int,
               round_: int) -> tuple[CommitIngestBatch, float]:
    """One batch of ``RECORDS`` records per partition, written as ingest writes it; and the write's seconds."""
    start, end = round_ * RECORDS, (round_ + 1) * RECORDS
    read_ms = BASE_MS + round_ * 60_000
    table = pa.concat_tables([backup_table(topic, p, start, RECORDS, base_ms=read_ms - 5_000)
                              for p in range(partitions)])
    spec = GroupSpec("backup", 1, bucket_config, IngestConfig(default_tenant=tenant))
    chunks = [Chunk(topic, p, "", start, end, read_ms) for p in range(partitions)]
    with timed() as t:
        written = write_chunks(spec, bucket, table, chunks)
    command = batch_commit(written, [PartitionRange(topic, p, "", start, end) for p in range(partitions)],
                           group="backup", generation=1, writer="ingest", batch=f"{topic}-{round_}")
    return command, t[0]


def _later_commit(first: CommitIngestBatch, round_: int) -> CommitIngestBatch:
    """The commit of round ``round_`` after ``first``: the same partitions ``RECORDS`` offsets on, in a block like
    ``first``'s (copied, with its own id: the objects of a block of 10,000 partitions take the writer seconds each,
    and applying its commit reads only its metadata). Applying the command's bytes validates it all again."""
    shift = round_ * RECORDS
    blocks = []
    for block in first.blocks:
        block_id = deterministic_block_id(block.time_ms + round_ * 60_000, f"{block.id}/{round_}")
        blocks.append(block.model_copy(update={
            "id": block_id, "compaction": block.compaction.model_copy(update={"sources": [block_id]}),
            "kafka": [r.model_copy(update={"start": r.start + shift, "end": r.end + shift}) for r in block.kafka]}))
    return first.model_copy(update={
        "batch": f"{first.batch}-{round_}", "blocks": blocks,
        "ranges": [r.model_copy(update={"start": r.start + shift, "end": r.end + shift}) for r in first.ranges]})


def _varied_commit(first: CommitIngestBatch) -> CommitIngestBatch:
    """``first`` with partitions unlike one another, as a real topic's are (seeded, the same every run): each
    partition's offsets around 3e9 (+-5e7), 0 to 4,000 of them read; its row group's records from up to 5 minutes
    before the batch, spread over up to 5 minutes; the bytes and records stored as many as the offsets or fewer."""
    rng = random.Random(55)
    spans = {(r.topic, r.partition): (3_000_000_000 + rng.randrange(-50_000_000, 50_000_000), rng.randrange(4_000))
             for r in first.ranges}
    ranges = [r.model_copy(update={"start": spans[(r.topic, r.partition)][0],
                                   "end": sum(spans[(r.topic, r.partition)]),
                                   "stored": spans[(r.topic, r.partition)][1] - rng.randrange(3) // 2
                                   if spans[(r.topic, r.partition)][1] else 0,
                                   "bytes": spans[(r.topic, r.partition)][1] * rng.randrange(200, 1_200)})
              for r in first.ranges]
    blocks = []
    for block in first.blocks:
        kafka = [r.model_copy(update={"start": spans[(r.topic, r.partition)][0],
                                      "end": sum(spans[(r.topic, r.partition)])}) for r in block.kafka]
        datasets = []
        for d in block.datasets:
            groups = []
            for rows, _, high in d.row_groups:
                low = high - rng.randrange(300_000)
                groups.append((rows, low, low + rng.randrange(300_000)))
            datasets.append(d.model_copy(update={"row_groups": groups}))
        blocks.append(block.model_copy(update={"kafka": kafka, "datasets": datasets}))
    return first.model_copy(update={"ranges": ranges, "blocks": blocks})


def _partitions(work: Path, counts: tuple[int, ...]
                ) -> tuple[dict[int, dict[str, float]], dict[int, CommitIngestBatch]]:
    """Per partition count: apply seconds, Raft entry bytes, meta.json bytes, bucket-index bytes per block; and
    its first commit."""
    bucket_config = BucketConfig(url=f"memory://metadata-scale-{uuid.uuid4().hex}")
    bucket = open_bucket(bucket_config)
    state = StateMachine(work / "partitions.db")
    out: dict[int, dict[str, float]] = {}
    firsts: dict[int, CommitIngestBatch] = {}
    writes: dict[int, float] = {}
    for p in counts:
        firsts[p], writes[p] = _commit_of(bucket, bucket_config, f"p{p}", f"topic-{p}", p, 0)
    applies: dict[int, list[float]] = {p: [] for p in counts}
    entries: dict[int, list[int]] = {p: [] for p in counts}
    for c in range(COMMITS):  # the sizes in turns: a load that comes and goes weighs on each alike
        for p in counts:
            data = encode(_later_commit(firsts[p], c) if c else firsts[p])
            index = state.applied()[0] + 1
            with timed() as t:
                result = state.apply(Entry(index, 1, BASE_MS + index), data)
            assert result.ok, result
            applies[p].append(t[0])
            entries[p].append(len(data))
            progress(f"  {p:,} partitions, commit {c + 1}/{COMMITS}: entry {len(data):,} bytes, applied in "
                     f"{t[0]:.3f} s" + (f" (its block written in {writes[p]:.2f} s)" if not c else ""))
    for p in counts:
        tenant = f"p{p}"
        meta_bytes = statistics.median(len(bucket.get(meta_key(b))) for b in firsts[p].blocks)
        BucketIndexWriter(bucket, state.reader, BucketIndexConfig()).write_tenant(tenant)
        index_bytes = len(bucket.get(bucket_index_key(tenant)))
        blocks = state.reader.count_blocks(tenant)
        apply_s = min(applies[p])
        varied = _varied_commit(firsts[p])
        out[p] = {"apply_s": apply_s, "apply_us_per_partition": apply_s / p * 1e6,
                  "raft_entry_bytes_per_partition": statistics.median(entries[p]) / p,
                  "meta_bytes_per_partition": meta_bytes / p,
                  "raft_entry_bytes_per_partition_varied": len(encode(varied)) / p,
                  "meta_bytes_per_partition_varied": statistics.median(len(b.to_json()) for b in varied.blocks) / p,
                  "index_bytes_per_block": index_bytes / blocks, "block_write_s": writes[p]}
    state.close()
    return out, firsts


def _raft(work: Path, commands: dict[int, CommitIngestBatch]) -> dict[int, float]:
    """Seconds until a 3-node cluster's leader answers one commit, per partition count (each count's first)."""
    from shale.dev.metastore import MetastoreCluster

    cluster = MetastoreCluster(work / "raft", 3).start()
    out: dict[int, float] = {}
    try:
        client = cluster.client(timeout=900.0, deadline=900.0)
        for p, command in commands.items():
            with timed() as t:
                result = client.submit(command)
            assert result.ok, result
            out[p] = t[0]
            progress(f"  3-node Raft, {p:,} partitions: {t[0]:.3f} s")
        client.close()
    finally:
        cluster.stop()
    return out


def _block(tenant: str, i: int) -> BlockMeta:
    t = BASE_MS + i * HOUR // BLOCKS_PER_HOUR
    topic = f"app-{i % 8}"
    levels = [{"topic": topic, "level": "INFO"}] + ([{"topic": topic, "level": "ERROR"}] if i % 3 == 0 else [])
    return meta(tenant=tenant, topic=topic, partition=i % 4, start=i * 100, end=i * 100 + 100, time_ms=t,
                min_time=t - 60_000, max_time=t + 240_000, labels=levels, key=f"{tenant}/{i}")


_TEMPLATES: dict[tuple[str, int], BlockMeta] = {}


def _loaded_block(tenant: str, i: int) -> BlockMeta:
    """``_block(tenant, i)``, copied without validation from a validated block of its shape (about 10x faster: a
    million blocks are loaded per run); the same metadata, as ``tests/unit/test_bench_metadata_scale.py`` checks."""
    shape = _TEMPLATES.get((tenant, i % 24))
    if shape is None:
        shape = _TEMPLATES[(tenant, i % 24)] = _block(tenant, i % 24)
    t = BASE_MS + i * HOUR // BLOCKS_PER_HOUR
    block_id = deterministic_block_id(t, f"{tenant}/{i}")
    low, high = t - 60_000, t + 240_000
    block = shape.model_copy(update={
        "id": block_id, "min_time": low, "max_time": high,
        "kafka": [shape.kafka[0].model_copy(update={"start": i * 100, "end": i * 100 + 100})],
        "datasets": [shape.datasets[0].model_copy(update={"min_time": low, "max_time": high})],
        "compaction": shape.compaction.model_copy(update={"sources": [block_id]})})
    block.__pydantic_private__["_time_ms"] = t  # type: ignore[index]
    return block


def _load(state: StateMachine, tenant: str, blocks: int) -> float:
    """``blocks`` blocks into the index store in batches, one transaction each; blocks/s."""
    writer = state.writer
    with timed() as t:
        for first in range(0, blocks, LOAD_BATCH):
            batch = [_loaded_block(tenant, i) for i in range(first, min(blocks, first + LOAD_BATCH))]
            with state.lock:
                begin(state.conn)
                writer.add_blocks(batch, BASE_MS)
                writer.changes.clear()  # no change feed for the load: no consumer reads it here
                commit(state.conn)
    return blocks / t[0]


def _tenants(work: Path, sizes: tuple[int, ...]) -> tuple[dict[int, dict[str, float]], float]:
    """Per tenant size: median one-block AddBlocks and query-plan milliseconds; and the load's blocks/s. The
    tenants are loaded first, then measured in turns (one command or query each, round and round), so that a
    change in the machine's load falls on all of them."""
    state = StateMachine(work / "tenants.db")
    service = MetastoreService(state, SingleNodeLog(state))
    matchers = parse_matchers(SELECTOR)
    rates = []
    for n in sizes:
        progress(f"  loading {n:,} blocks into tenant n{_name(n)}")
        rates.append(_load(state, f"n{_name(n)}", n))
        assert service.submit(AddBlocks(blocks=[_block(f"n{_name(n)}", n)])).ok  # the warm-up
    adds: dict[int, list[float]] = {n: [] for n in sizes}
    plans: dict[int, list[float]] = {n: [] for n in sizes}
    found: dict[int, list[int]] = {n: [] for n in sizes}
    for k in range(1, ADDS + 1):
        for n in sizes:
            block = _block(f"n{_name(n)}", n + k)
            with timed() as t:
                assert service.submit(AddBlocks(blocks=[block])).ok
            adds[n].append(t[0] * 1000)
    for q in range(QUERIES):
        for n in sizes:
            span_hours = n // BLOCKS_PER_HOUR
            start = BASE_MS + (q * 7919 % max(1, span_hours - 1)) * HOUR
            with timed() as t:
                blocks = service.query_blocks([f"n{_name(n)}"], start, start + HOUR, SELECTOR)
                plan = plan_query(blocks, "backup", "records", start=start, end=start + HOUR, matchers=matchers)
            plans[n].append(t[0] * 1000)
            found[n].append(len(plan.parts))
    out: dict[int, dict[str, float]] = {}
    for n in sizes:
        out[n] = {"add_blocks_ms": statistics.median(adds[n]), "query_plan_ms": statistics.median(plans[n]),
                  "parts_per_query": statistics.mean(found[n])}
        progress(f"  {n:,} blocks: AddBlocks {out[n]['add_blocks_ms']:.2f} ms, query plan "
                 f"{out[n]['query_plan_ms']:.2f} ms ({out[n]['parts_per_query']:.1f} parts)")
    state.close()
    return out, statistics.median(rates)


def measure(partitions: tuple[int, ...], tenants: tuple[int, ...], raft: bool) -> dict[str, Any]:
    before, cpu_before = cpu_snapshot(), time.process_time()
    with tempfile.TemporaryDirectory(prefix="shale-bench-metadata-scale-") as tmp:
        work = Path(tmp)
        progress(f"ingest commits at {', '.join(f'{p:,}' for p in partitions)} partitions, one node")
        by_p, firsts = _partitions(work, partitions)
        progress(f"tenants of {', '.join(f'{n:,}' for n in tenants)} blocks")
        by_n, load_rate = _tenants(work, tenants)
        after, cpu_after = cpu_snapshot(), time.process_time()
        raft_s = {}
        if raft:
            progress("one commit per partition count on a 3-node Raft cluster")
            raft_s = _raft(work, firsts)
    other = max(0.0, (after.busy - before.busy - (cpu_after - cpu_before)) / (after.at - before.at))
    small, big, low, high = partitions[0], partitions[-1], tenants[0], tenants[-1]
    figures: dict[str, float] = {}
    for p, f in by_p.items():
        figures.update({f"{k}_{p}": round(v, 3) for k, v in f.items()})
    for n, f in by_n.items():
        figures.update({f"{k}_{_name(n)}": round(v, 3) for k, v in f.items()})
    figures.update({f"raft3_commit_s_{p}": round(s, 3) for p, s in raft_s.items()})
    figures["load_blocks_per_s"] = round(load_rate)
    figures["other_cores"] = round(other, 2)
    figures["raft_entry_bytes_per_partition_10000"] = round(by_p[big]["raft_entry_bytes_per_partition"], 1)
    figures["meta_bytes_per_partition_10000"] = round(by_p[big]["meta_bytes_per_partition"], 1)
    figures["raft_entry_bytes_per_partition_varied_10000"] = round(
        by_p[big]["raft_entry_bytes_per_partition_varied"], 1)
    figures["meta_bytes_per_partition_varied_10000"] = round(by_p[big]["meta_bytes_per_partition_varied"], 1)
    baseline = {f"apply_us_per_partition_{small}": round(by_p[small]["apply_us_per_partition"], 2),
                f"index_bytes_per_block_{small}": round(by_p[small]["index_bytes_per_block"]),
                f"add_blocks_ms_{_name(low)}": round(by_n[low]["add_blocks_ms"], 3),
                f"query_plan_ms_{_name(low)}": round(by_n[low]["query_plan_ms"], 3)}
    ratios = {"apply_per_partition_10000_vs_100":
              round(by_p[big]["apply_us_per_partition"] / by_p[small]["apply_us_per_partition"], 3),
              "index_bytes_per_block_10000_vs_100":
              round(by_p[big]["index_bytes_per_block"] / by_p[small]["index_bytes_per_block"], 3),
              "add_blocks_1m_vs_10k": round(by_n[high]["add_blocks_ms"] / by_n[low]["add_blocks_ms"], 3),
              "query_plan_1m_vs_10k": round(by_n[high]["query_plan_ms"] / by_n[low]["query_plan_ms"], 3)}
    if raft_s:
        ratios["raft3_commit_per_partition_10000_vs_100"] = round(raft_s[big] / big / (raft_s[small] / small), 3)
    return {"figures": figures, "baseline": baseline, "ratios": ratios}


def run() -> dict[str, Any]:
    m = measure(PARTITIONS, TENANT_BLOCKS, raft=True)
    return write_result("metadata_scale", m["figures"], m["baseline"], m["ratios"], __doc__ or "")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.metadata_scale")
    parser.add_argument("--quick", action="store_true", help="small tenants, up to 1,000 partitions; writes nothing")
    parser.add_argument("--no-raft", action="store_true", help="leave out the 3-node Raft cluster")
    args = parser.parse_args(argv)
    if not args.quick:
        result = run() if not args.no_raft else write_result(
            "metadata_scale", **measure(PARTITIONS, TENANT_BLOCKS, raft=False), notes=__doc__ or "")
        print(f"metadata_scale: {result['ratios']}")
        return 0
    m = measure(PARTITIONS[:2], tuple(n // 10 for n in TENANT_BLOCKS), raft=not args.no_raft)
    print(f"metadata_scale --quick (nothing written): {m}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
