"""``shale bucket repair`` against a real Kafka broker, MinIO, the embedded metastore and Spark (the merges and
rebuilds run as Spark tasks in the repair's own process).

A bucket ingested by both groups is seeded with each kind of damage: a fully held duplicate (indexed by an old
bug), a partial overlap (two indexed blocks sharing offsets), truncated data objects (a partition-group block whose
records the backup group holds, a backup block whose records Kafka still holds, and a block whose records exist
nowhere else any more), and a block copied in from another bucket under a new id. The dry run lists exactly the
expected steps and changes no object (names, sizes, etags); the apply is killed with SIGKILL twice in the middle
(after a merge's block is written, and after a rebuild's index swap) and run again; afterwards every record is
stored exactly once (read from the bucket and compared with Kafka), `shale bucket verify` is clean, the index and
the bucket agree, no block was marked whose records are not held by a readable block, and the block whose records
exist nowhere else is kept whole, quarantined.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
from tests.integration.ingest_helpers import ROOT, config_of, create_topic, produce_json, wait_paused, write_config

from shale.block import (
    BlockFetcher,
    BlockMeta,
    BlockSpec,
    BlockState,
    DatasetInput,
    KafkaRange,
    block_file_key,
    deterministic_block_id,
    meta_key,
    read_dataset,
    write_block,
    write_deletion_mark,
)
from shale.config import BucketConfig
from shale.dev import MinioServer
from shale.ingest.job import IngestJob
from shale.kafka import delete_records_before, offset_bounds
from shale.metastore import AddBlocks, MetastoreService, ReplaceBlocks, open_metastore
from shale.objstore import ObstoreBucket, open_bucket
from shale.process import ManagedProcess
from shale.verify import verify_topic

TENANT = "default"
ORDER = ["mark", "drop", "merge", "rebuild", "quarantine"]


def _shale(file: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHALE_FAILPOINT")}
    return subprocess.run([sys.executable, "-m", "shale.cli", "--config", str(file), *args], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=600, check=False)


def _plan(file: Path) -> dict[str, Any]:
    run = _shale(file, "bucket", "repair", "--tenant", TENANT, "--json")
    assert run.returncode == 0, run.stderr[-3000:]
    plan: dict[str, Any] = json.loads(run.stdout)
    return plan


def _apply_until(file: Path, failpoint: str, tmp_path: Path) -> None:
    """Run the apply in its own process and SIGKILL it when it reaches ``failpoint``."""
    points = tmp_path / f"points-{failpoint}"
    env = dict(os.environ, SHALE_FAILPOINTS=failpoint, SHALE_FAILPOINT_DIR=str(points))
    process = ManagedProcess(f"repair-{failpoint}", [sys.executable, "-m", "shale.cli", "--config", str(file),
                                                     "bucket", "repair", "--tenant", TENANT, "--apply"],
                             tmp_path / f"repair-{failpoint}.log", env=env, cwd=ROOT)
    process.start()
    try:
        wait_paused(process, points, failpoint, timeout=300)
    finally:
        process.kill9()


def _listing(bucket: ObstoreBucket) -> list[tuple[str, int, str | None]]:
    return [(o.key, o.size, o.etag) for o in bucket.list("")]


def _keys(bucket: ObstoreBucket, meta: BlockMeta) -> set[tuple[str, str, int, int]]:
    """(kind, topic, partition, offset) of every record the block's data objects hold."""
    out: set[tuple[str, str, int, int]] = set()
    for dataset in meta.datasets:
        table = read_dataset(bucket, meta, dataset, columns=["topic", "partition", "offset"])
        out.update((dataset.kind, t, p, o) for t, p, o in zip(*(table.column(c).to_pylist() for c in
                                                                  ("topic", "partition", "offset")), strict=True))
    return out


def _live(bucket: ObstoreBucket, group: str) -> Counter[tuple[str, str, int, int]]:
    counts: Counter[tuple[str, str, int, int]] = Counter()
    for view in BlockFetcher(bucket, 0).sync(TENANT).in_state(BlockState.HEALTHY):
        assert view.meta is not None
        if view.meta.group == group:
            counts.update(_keys(bucket, view.meta))
    return counts


def _range(meta: BlockMeta, topic: str, partition: int) -> KafkaRange:
    """The block's range of one partition (a level-0 block holds every partition its task read)."""
    return next(r for r in meta.kafka if (r.topic, r.partition) == (topic, partition))


def _slice(bucket: ObstoreBucket, source: BlockMeta, r: KafkaRange, start: int, end: int, key: str) -> BlockMeta:
    """A level-0 backup block holding offsets [start, end) of ``source``'s partition ``r``, copied from it."""
    (dataset,) = source.datasets
    table = read_dataset(bucket, source, dataset)
    offsets = table.column("offset")
    table = table.filter(pc.and_(pc.equal(table.column("partition"), r.partition),
                                 pc.and_(pc.greater_equal(offsets, start), pc.less(offsets, end))))
    spec = BlockSpec(id=deterministic_block_id(source.time_ms, key), tenant=TENANT, group="backup",
                     kafka=[r.model_copy(update={"start": start, "end": end})])
    return write_block(bucket, spec, [DatasetInput("records", r.topic, table, "timestamp",
                                                   labels=[{"topic": r.topic}])])


def _truncate(bucket: ObstoreBucket, meta: BlockMeta) -> str:
    key = block_file_key(meta, meta.datasets[0].file)
    data = bucket.get(key)
    bucket.put(key, data[: len(data) // 2])
    return key


def _copy_through(other: ObstoreBucket, bucket: ObstoreBucket, meta: BlockMeta) -> str:
    """Copy a block to another bucket and back under a new id, as an operator restoring from a replica would."""
    for name in [f.name for f in meta.files]:
        other.put(f"restore/{name}", bucket.get(block_file_key(meta, name)))
    new_id = deterministic_block_id(meta.time_ms, f"copied/{meta.id}")
    copy = meta.model_copy(update={"id": new_id, "compaction": meta.compaction.model_copy(
        update={"sources": [new_id], "parents": []})})
    for name in [f.name for f in meta.files]:
        bucket.put(block_file_key(copy, name), other.get(f"restore/{name}"))
    bucket.put_if_absent(meta_key(copy), copy.to_json())
    return new_id


def _blocks(metastore: MetastoreService, group: str, topic: str, partition: int) -> list[BlockMeta]:
    return sorted((m for m in metastore.tenant_blocks(TENANT) if m.group == group and any(
        r.topic == topic and r.partition == partition for r in m.kafka) and m.datasets),
        key=lambda m: _range(m, topic, partition).start)


def test_repair_plans_exactly_applies_under_sigkill_and_converges(kafka, minio: MinioServer,  # type: ignore[no-untyped-def]
                                                                   minio_bucket: BucketConfig, spark,
                                                                   tmp_path: Path) -> None:
    run = uuid.uuid4().hex[:6]
    topic, solo = f"app-{run}", f"solo-{run}"
    create_topic(kafka.bootstrap_servers, topic, 2)
    create_topic(kafka.bootstrap_servers, solo, 1)
    # Two configurations over one bucket and metastore: the backup group does not keep `solo`, so once Kafka
    # deletes its records, the partition group's block of them is their only copy.
    both = write_config(tmp_path, kafka.bootstrap_servers, minio_bucket, [topic, solo])
    both.write_text(both.read_text() + "[block]\nsync_delay = 0\n")
    (tmp_path / "backup").mkdir()
    backup_only = write_config(tmp_path / "backup", kafka.bootstrap_servers, minio_bucket, [topic],
                               metastore={"data_dir": str(tmp_path / "metastore")})
    config, backup_config = config_of(both), config_of(backup_only)
    metastore = open_metastore(config)
    assert isinstance(metastore, MetastoreService)

    def ingest() -> None:
        IngestJob(backup_config, "backup", spark=spark, metastore=metastore).run(available_now=True)
        IngestJob(config, "partition", spark=spark, metastore=metastore).run(available_now=True)

    produce_json(kafka.bootstrap_servers, topic, 240, seed=1)
    produce_json(kafka.bootstrap_servers, solo, 30, seed=2)
    ingest()
    produce_json(kafka.bootstrap_servers, topic, 240, start=240, seed=3)
    ingest()
    bucket = open_bucket(config.bucket)
    ends = {p: offset_bounds(config.kafka, [(topic, p)])[(topic, p)][1] for p in (0, 1)}

    # 1. A fully held duplicate: offsets [10, 30) of partition 0 again, indexed (an old version's bug).
    b0 = _blocks(metastore, "backup", topic, 0)
    r0 = _range(b0[0], topic, 0)
    duplicate = _slice(bucket, b0[0], r0, r0.start + 10, r0.start + 30, "duplicate")
    metastore.submit(AddBlocks(blocks=[duplicate])).raise_for_rejection()
    # 2. A partial overlap: partition 1's first backup block replaced in the index by two blocks sharing 20 offsets.
    b1 = _blocks(metastore, "backup", topic, 1)
    whole = b1[0]
    r1 = _range(whole, topic, 1)
    cut = (r1.start + r1.end) // 2
    left = _slice(bucket, whole, r1, r1.start, cut + 10, "left")
    right = _slice(bucket, whole, r1, cut - 10, r1.end, "right")
    metastore.submit(ReplaceBlocks(tenant=TENANT, sources=[whole.id], blocks=[left, right],
                                   reason="an old version split it")).raise_for_rejection()
    write_deletion_mark(bucket, TENANT, whole.id, 0, "an old version split it")
    # 3. Truncated data objects: a partition-group block (its records are in the backup group), a backup block of
    #    the second round (Kafka still holds its records), and the partition-group block of `solo`, whose records
    #    Kafka then deletes: they exist nowhere else.
    parsed = next(m for m in _blocks(metastore, "partition", topic, 0)
                  if m.datasets[0].kind == "records" and _range(m, topic, 0).end <= r0.end)
    _truncate(bucket, parsed)
    second = b0[-1]  # of the second round: no partition-group block's rebuild needs it
    _truncate(bucket, second)
    (lonely,) = _blocks(metastore, "partition", solo, 0)
    lonely_key = _truncate(bucket, lonely)
    lonely_bytes = bucket.get(lonely_key)
    delete_records_before(config.kafka, solo, 0, _range(lonely, solo, 0).end)
    # 4. A block copied in from another bucket under a new id (partition 1's last backup block).
    other_name = f"other-{run}"
    minio.create_bucket(other_name)
    other = open_bucket(minio_bucket.model_copy(update={"url": f"s3://{other_name}"}))
    copied = _copy_through(other, bucket, b1[-1])

    # The dry run: exactly these steps, and not one object changed.
    before = _listing(bucket)
    plan = _plan(both)
    assert _listing(bucket) == before
    expected = sorted([("drop", [duplicate.id]), ("drop", [copied]), ("merge", sorted([left.id, right.id])),
                       ("rebuild", [parsed.id]), ("rebuild", [second.id]), ("quarantine", [lonely.id])],
                      key=lambda s: (ORDER.index(s[0]), s[1]))
    assert [(s["action"], s["blocks"]) for s in plan["steps"]] == expected, json.dumps(plan, indent=1)
    steps = {(s["action"], s["blocks"][0]): s for s in plan["steps"]}
    assert steps[("drop", duplicate.id)]["evidence"]["held_by"] == [b0[0].id]
    assert steps[("drop", copied)]["evidence"]["held_by"] == [b1[-1].id]
    assert steps[("drop", copied)]["indexed"] == []
    assert steps[("rebuild", parsed.id)]["source"] == "backup"
    assert steps[("rebuild", second.id)]["source"] == "kafka"
    assert [u["block"] for u in plan["unrecoverable"]] == [lonely.id]
    assert plan["applied"] is None
    table = _shale(both, "bucket", "repair", "--tenant", TENANT)
    assert table.returncode == 0, table.stderr[-2000:]
    assert "dry run: nothing changed" in table.stdout
    assert _listing(bucket) == before

    # The apply, killed twice in the middle and run again until it finishes.
    _apply_until(both, "repair.merge.built", tmp_path)
    _apply_until(both, "repair.rebuild.indexed", tmp_path)
    final = _shale(both, "bucket", "repair", "--tenant", TENANT, "--apply", "--json")
    assert final.returncode == 0, final.stderr[-3000:]
    assert json.loads(final.stdout)["applied"]["failed"] == []
    again = _plan(both)
    assert again["steps"] == [], json.dumps(again, indent=1)

    # Every record exactly once, read from the bucket, and what Kafka holds; `solo`'s records are kept, quarantined.
    backup = _live(bucket, "backup")
    assert max(backup.values()) == 1
    assert set(backup) == {("records", topic, p, o) for p in (0, 1) for o in range(ends[p])}
    parsed_now = _live(bucket, "partition")
    assert max(parsed_now.values()) == 1
    assert {(p, o) for _, t, p, o in parsed_now if t == topic} == {(p, o) for p in (0, 1) for o in range(ends[p])}
    assert not any(t == solo for _, t, _, _ in parsed_now)
    for group in ("backup", "partition"):
        report = verify_topic(metastore, bucket, config.kafka, group, 1, topic)
        assert report.ok, report.as_dict()
    verify = _shale(both, "bucket", "verify", "--tenant", TENANT)
    assert verify.returncode == 0, verify.stdout + verify.stderr[-2000:]
    assert "quarantined" in verify.stdout
    assert lonely.id in verify.stdout

    # The index and the bucket agree; nothing was marked whose records no readable block holds.
    result = BlockFetcher(bucket, 0).sync(TENANT)
    assert {m.id for m in metastore.tenant_blocks(TENANT)} == {v.id for v in result.in_state(BlockState.HEALTHY)}
    readable = set(backup) | set(parsed_now)
    damaged = {parsed.id, second.id}
    for view in result.in_state(BlockState.MARKED_FOR_DELETION):
        assert view.meta is not None
        if view.id == whole.id:
            continue  # the test's own mark (the block the old version split)
        assert view.mark is not None
        assert view.mark.reason.startswith("repair: "), view.mark
        if view.id in damaged:
            rebuilt = [m for m in metastore.tenant_blocks(TENANT) if m.compaction.parents == [view.id]]
            assert len(rebuilt) == 1
            assert rebuilt[0].rows == view.meta.rows
            assert _keys(bucket, rebuilt[0]) <= readable
        else:
            assert _keys(bucket, view.meta) <= readable, view.id
    quarantined = result.blocks[lonely.id]
    assert quarantined.state is BlockState.QUARANTINED
    assert bucket.get(lonely_key) == lonely_bytes  # kept whole
    assert metastore.get_block(lonely.id) is None
    assert lonely.id not in {t.block_id for t in metastore.tombstones(limit=100_000)}
    merged = [m for m in metastore.tenant_blocks(TENANT) if sorted(m.compaction.parents) == sorted([left.id,
                                                                                                    right.id])]
    assert len(merged) == 1
    assert merged[0].rows == whole.rows
