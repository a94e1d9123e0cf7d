"""A bucket the previous release wrote keeps working: read, verified, compacted into the new layout, restored into
real Kafka and published to Iceberg, every record exactly once.

The bucket is ``tests/fixtures/previous_release``: every object the release named in its ``manifest.json`` wrote to
MinIO, as a file, with its embedded metastore's files and every record Kafka held, written by its ``generate.py``
running that release against real Kafka, MinIO, the Schema Registry and Spark (both ingest groups, compacted and
uncompacted blocks, a JSON topic with records no parser accepts and an Avro topic of two schema versions; its
README says how to write it again). It is stored rather than written at test time: the old code would need the
old dependencies and git history at test time, and four services and three Spark runs for bytes that never
change; the objects are the release's own, byte for byte.

The previous release wrote every block's Kafka ranges and row groups as lists; this release writes them packed
(``shale.block.packed``) from ``PACK_FROM`` items on. So this release also ingests a topic of ``WIDE`` partitions
into the upgraded bucket before compacting: its blocks' meta.json is packed, compaction merges them with the
previous release's into packed blocks, and both stay exactly once.
"""

from __future__ import annotations

import base64
import json
import shutil
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from tests.integration.ingest_helpers import config_of, produce_json, publish_to_iceberg, toml_value, write_config
from tests.integration.kafka_world import create_topic, stored
from tests.integration.test_restore import read_topic

from shale.block import BlockFetcher, BlockMeta, read_dataset
from shale.block.layout import LAYOUT, LEGACY_LAYOUT, block_prefix, tenant_group_prefix
from shale.block.packed import PACK_FROM, PACKED_TAG
from shale.cli import cli
from shale.compactor.worker import CompactionWorker
from shale.dev import KafkaBroker, MinioServer
from shale.ingest.job import IngestJob
from shale.metastore import MetastoreService, open_metastore
from shale.objstore import open_bucket
from shale.restore import RestoreJob, RestoreRequest

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "previous_release"
TENANT = "default"
WIDE = 3 * PACK_FROM
"""Partitions of the topic this release ingests beside the previous release's blocks: enough for its blocks' Kafka
ranges and row groups to be written packed (the previous release wrote lists only), however Spark's two task slots
split them."""


def _records() -> list[dict[str, Any]]:
    return json.loads((FIXTURE / "records.json").read_text())


def _offsets(topic: str) -> Counter[tuple[int, int]]:
    return Counter((r["partition"], r["offset"]) for r in _records() if r["topic"] == topic)


def _topics() -> dict[str, int]:
    return json.loads((FIXTURE / "manifest.json").read_text())["topics"]


@pytest.fixture
def upgraded(kafka: KafkaBroker, minio: MinioServer, tmp_path: Path) -> Path:
    """The previous release's bucket in a fresh MinIO bucket and its metastore in a fresh folder, under a config of
    this release (Iceberg off until the test publishes)."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    minio.create_bucket(name)
    shutil.copytree(FIXTURE / "metastore", tmp_path / "metastore")
    bucket = {"url": f"s3://{name}", "endpoint": minio.endpoint, "access_key_id": minio.access_key,
              "secret_access_key": minio.secret_key, "allow_http": True}
    sections = {
        "bucket": bucket,
        "kafka": {"bootstrap_servers": kafka.bootstrap_servers},
        "metastore": {"data_dir": str(tmp_path / "metastore")},
        "block": {"sync_delay": "0s", "delete_delay": "3600s"},
        "compaction": {"blocks_per_job": [2, 2, 2], "max_level": 3, "max_age": "0s", "poll_interval": "0.2s"},
        "spark": {"master": "local[2]"},
        "ingest": {"topics": list(_topics())},
    }
    file = tmp_path / "shale.toml"
    file.write_text("".join(f"[{s}]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in values.items())
                            for s, values in sections.items()))
    file.chmod(0o600)
    store = open_bucket(config_of(file).bucket)
    objects = sorted(p for p in (FIXTURE / "objects").rglob("*") if p.is_file())
    for path in objects:
        store.put(path.relative_to(FIXTURE / "objects").as_posix(), path.read_bytes())
    assert len(objects) > 10
    return file


def _live(service: MetastoreService) -> list[BlockMeta]:
    return service.query_blocks([TENANT], 0, 2**62)


def _exactly_once(service: MetastoreService, file: Path) -> None:
    """Each group's live blocks hold every record Kafka held, each once (quarantined ones included)."""
    bucket = open_bucket(config_of(file).bucket)
    for topic in _topics():
        for group in ("backup", "partition"):
            held = stored(service, bucket, group, topic)
            assert held == _offsets(topic), (group, topic)


def _packed(bucket: Any, meta: BlockMeta) -> bool:
    """Whether the block's meta.json in the bucket holds its Kafka ranges in the packed form."""
    kafka = json.loads(bucket.get(block_prefix(meta) + "meta.json"))["kafka"]
    return isinstance(kafka, str) and kafka.startswith(PACKED_TAG)


def test_a_bucket_of_the_previous_release_is_read_verified_compacted_restored_and_published(
        upgraded: Path, kafka: KafkaBroker, spark: Any, tmp_path: Path) -> None:
    config = config_of(upgraded)
    bucket = open_bucket(config.bucket)
    service = open_metastore(config)
    assert isinstance(service, MetastoreService)
    before = _live(service)

    # Read: every block the index holds is where the previous release put it, found by a listing too.
    assert {m.layout for m in before} == {LEGACY_LAYOUT}
    assert {m.group for m in before} == {"backup", "partition"}
    assert {m.level for m in before} == {0, 1}  # compacted and uncompacted
    assert all(block_prefix(m) == f"{TENANT}/blocks/{m.id}/" for m in before)
    fetched = BlockFetcher(bucket, 0).sync(TENANT)
    assert {m.id for m in before} <= {v.id for v in fetched.blocks.values() if v.readable}
    _exactly_once(service, upgraded)
    typed = [d for m in before for d in m.datasets if d.column_types is not None]
    assert typed  # the Avro topic's rows are typed
    assert all(read_dataset(bucket, m, d).num_rows == d.rows for m in before for d in m.datasets)

    # Verified: checksums, overlaps, partial blocks.
    out = CliRunner().invoke(cli, ["--config", str(upgraded), "bucket", "verify"])
    assert out.exit_code == 0, out.output

    # This release writes beside them: a topic of WIDE partitions, both groups, its blocks' metadata packed.
    wide = f"wide-{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap_servers, wide, WIDE)
    produce_json(kafka.bootstrap_servers, wide, 40 * WIDE)
    (tmp_path / "wide").mkdir()
    wide_config = config_of(write_config(tmp_path / "wide", kafka.bootstrap_servers, config.bucket, [wide]))
    for group in ("backup", "partition"):
        IngestJob(wide_config, group, spark=spark, metastore=service).run(available_now=True)
    wide_blocks = [m for m in _live(service) if any(k.topic == wide for k in m.kafka)]
    assert {m.group for m in wide_blocks} == {"backup", "partition"}
    shapes = [(m.group, len(m.kafka), _packed(bucket, m)) for m in wide_blocks]
    assert all(packed == (ranges >= PACK_FROM) for _, ranges, packed in shapes), shapes
    assert {group for group, _, packed in shapes if packed} == {"backup", "partition"}, shapes

    def wide_exactly_once() -> None:
        for group in ("backup", "partition"):
            held = stored(service, bucket, group, wide)
            assert set(held.values()) == {1}, group
            assert len(held) == 40 * WIDE, group
            for partition in range(WIDE):  # each partition's offsets from 0 on, without a gap
                offsets = {o for p, o in held if p == partition}
                assert offsets == set(range(len(offsets))), (group, partition)
    wide_exactly_once()

    # Compacted: the previous release's blocks are merged into blocks under their group's prefix, with this
    # release's packed ones.
    CompactionWorker(service, config.bucket, spark, slots=2, poll_interval=0.2).run(until_idle=True)
    after = _live(service)
    new = [m for m in after if m.layout == LAYOUT]
    assert new
    assert {m.group for m in new} == {"backup", "partition"}
    for meta in new:
        assert block_prefix(meta).startswith(tenant_group_prefix(TENANT, meta.group))
        assert bucket.head(block_prefix(meta) + "meta.json")
    assert len(after) < len(before)
    days = {block_prefix(m).split("/")[2] for m in new if m.group == "partition"}
    assert any(d.startswith("dt=2026-11-") for d in days), days  # compaction kept the outputs' day
    _exactly_once(service, upgraded)
    wide_exactly_once()
    assert any(_packed(bucket, m) for m in new if any(k.topic != wide for k in m.kafka)
               and any(k.topic == wide for k in m.kafka)), "no merge of old and packed blocks"
    out = CliRunner().invoke(cli, ["--config", str(upgraded), "bucket", "verify"])
    assert out.exit_code == 0, out.output

    # Restored: each topic comes back from the backup group record for record (key, value, timestamp, partition).
    for topic, partitions in _topics().items():
        target = f"{topic}-restored-{uuid.uuid4().hex[:6]}"
        create_topic(kafka.bootstrap_servers, target, partitions, **{"retention.ms": "-1"})
        report = RestoreJob(service, config.bucket, config.kafka,
                            RestoreRequest(tenant=TENANT, topic=topic, target_topic=target), spark,
                            journal=service, by="the upgrade test").run()
        assert report.ok, report
        want: dict[int, list[tuple[bytes | None, bytes | None, int]]] = {p: [] for p in range(partitions)}
        for r in sorted(_records(), key=lambda r: r["offset"]):
            if r["topic"] == topic:
                want[r["partition"]].append((base64.b64decode(r["key"]) or None, base64.b64decode(r["value"]),
                                             r["timestamp"]))
        got = read_topic(kafka.bootstrap_servers, target, partitions)
        assert {p: [(k, v, t) for k, v, _, t in rs] for p, rs in got.items()} == want

    # Published: each topic's Iceberg table holds the partition group's parsed records, each once.
    catalog = f"upgrade_{uuid.uuid4().hex[:6]}"
    publish_to_iceberg(upgraded, spark, catalog)
    for topic in _topics():
        parsed = Counter((p, o) for m in _live(service) if m.group == "partition"
                         for d in m.datasets if d.kind == "records" and d.topic == topic
                         for p, o in zip(*(read_dataset(bucket, m, d, columns=["partition", "offset"]).column(c)
                                           .to_pylist() for c in ("partition", "offset")), strict=True))
        assert parsed
        table = spark.table(f"{catalog}.{TENANT}.`{topic}`").select("partition", "offset")
        rows = Counter((r["partition"], r["offset"]) for r in table.collect())
        assert rows == parsed
        assert set(rows) <= set(_offsets(topic))
