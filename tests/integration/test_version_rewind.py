"""Version rewinding (seed 002) end to end: an Avro topic written with confluent-kafka's AvroSerializer under v1 and
then v2 (a field added with a default) against the real Schema Registry (Apicurio 3.0.9), ingested by both groups on
Spark from the real Kafka broker into MinIO, is reprocessed by `shale reprocess --schema-subject S --schema-version
1` (a separate process) into generation 2: every record, v2's included, is read as v1, so generation 2 has v1's
columns for all of them and its blocks record v1's id and fingerprint; after `shale generation switch`, `shale
query` shows them."""

from __future__ import annotations

import datetime as dt
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from tests.integration.ingest_helpers import config_of, create_topic, write_config
from tests.producing import CheckedProducer

from shale.cli import cli
from shale.config import BucketConfig
from shale.dev import KafkaBroker, SchemaRegistry
from shale.ingest.job import IngestJob
from shale.metastore import open_metastore
from shale.process import ManagedProcess
from shale.schemas import avro

ROOT = Path(__file__).resolve().parents[2]
BASE = dt.datetime(2026, 11, 25, 6, 0, tzinfo=dt.UTC)
V1: dict[str, Any] = {"type": "record", "name": "Order", "namespace": "rewind", "fields": [
    {"name": "id", "type": "long"},
    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "note", "type": "string"},
]}
V2: dict[str, Any] = {**V1, "fields": [*V1["fields"], {"name": "channel", "type": "string", "default": "web"}]}


def _order(i: int, version: int) -> dict[str, Any]:
    order: dict[str, Any] = {"id": i, "ts": BASE + dt.timedelta(seconds=i), "note": f"n{i}"}
    if version == 2:
        order["channel"] = "app"
    return order


def _query(file: Path, topic: str) -> list[dict[str, Any]]:
    start = int(BASE.timestamp() * 1000)
    out = CliRunner().invoke(cli, ["--config", str(file), "query", "--tenant", "default", "--from", str(start),
                                   "--to", str(start + 3_600_000), f'{{topic="{topic}"}}', "--format", "json"])
    assert out.exit_code == 0, out.output
    return sorted((json.loads(line) for line in out.stdout.splitlines()), key=lambda r: r["id"])


def test_reprocess_reads_every_record_as_the_named_older_schema_version(
        kafka: KafkaBroker, schema_registry: SchemaRegistry, minio_bucket: BucketConfig, spark: Any,
        tmp_path: Path) -> None:
    topic = f"rewind-{uuid.uuid4().hex[:6]}"
    subject = f"{topic}-value"
    create_topic(kafka.bootstrap_servers, topic, 2)
    client = SchemaRegistryClient({"url": schema_registry.url})
    producer = CheckedProducer({"bootstrap.servers": kafka.bootstrap_servers, "enable.idempotence": True})
    context = SerializationContext(topic, MessageField.VALUE)
    v1_serializer = AvroSerializer(client, json.dumps(V1))
    for i in range(20):
        producer.produce(topic, value=v1_serializer(_order(i, 1), context), partition=i % 2)
    producer.flush(60)
    schema_registry.set_compatibility(subject, "BACKWARD")  # v2 must be a compatible change
    v2_serializer = AvroSerializer(client, json.dumps(V2))
    for i in range(20, 40):
        producer.produce(topic, value=v2_serializer(_order(i, 2), context), partition=i % 2)
    producer.flush(60)
    v1 = client.get_version(subject, 1)
    v2 = client.get_version(subject, 2)
    assert v1.schema_id != v2.schema_id

    parser = {"parser": "avro", "options": {"time_field": "ts"}}
    file = write_config(tmp_path, kafka.bootstrap_servers, minio_bucket, [topic], parsers_override=[parser],
                        schema_registry={"url": schema_registry.url})
    config = config_of(file)
    metastore = open_metastore(config)
    for group in ("backup", "partition"):
        IngestJob(config, group, spark=spark, metastore=metastore).run(available_now=True)
    ingested_until = int(time.time() * 1000)
    live = _query(file, topic)
    assert [r["id"] for r in live] == list(range(40))
    assert [r["channel"] for r in live if r["id"] >= 20] == ["app"] * 20  # generation 1 reads v2 as v2

    # Rewind: every record read as v1, named by subject and version (resolved once, by the driver).
    command = [sys.executable, "-m", "shale.cli", "--config", str(file), "reprocess", "--tenant", "default",
               "--topic", topic, "--from", "0", "--to", str(ingested_until), "--parser", "avro",
               "--parser-option", 'time_field="ts"', "--schema-subject", subject, "--schema-version", "1",
               "--generation", "2"]
    run = ManagedProcess("reprocess", command, tmp_path / "reprocess.log", cwd=ROOT)
    run.start()
    assert run.popen is not None
    assert run.popen.wait(timeout=600) == 0, run.log_path.read_text()[-3000:]
    report = next(json.loads(line) for line in reversed(run.log_path.read_text().splitlines())
                  if line.startswith('{"rounds"'))
    assert report["reader_schema_id"] == v1.schema_id
    assert report["records"] == 40
    assert report["quarantined"] == 0
    assert sum(o.committed_end for o in metastore.offsets("partition", 2)) == 40

    # Generation 2's blocks hold v1's columns for every record and record v1's id and fingerprint.
    metas = [m for m in metastore.query_blocks(["default"], 0, 2**62, group="partition") if m.generation == 2]
    records = [(m, d) for m in metas for d in m.datasets if d.kind == "records"]
    assert sum(d.rows for _, d in records) == 40
    v1_fingerprint = avro.fingerprint(v1.schema.schema_str)
    for meta, dataset in records:
        assert meta.parser is not None
        assert meta.parser.reader_schema_id == v1.schema_id
        assert dataset.schema_fingerprint == v1_fingerprint
        assert dataset.columns == ["id", "ts", "note"]
    assert {i for _, d in records for i in d.schema_ids or []} == {v1.schema_id, v2.schema_id}

    switch = CliRunner().invoke(cli, ["--config", str(file), "generation", "switch", "--tenant", "default",
                                      "--topic", topic, "--generation", "2", "--from", "0",
                                      "--to", str(int(BASE.timestamp() * 1000) + 86_400_000)])
    assert switch.exit_code == 0, switch.output
    rewound = _query(file, topic)
    assert [r["id"] for r in rewound] == list(range(40))
    assert all("channel" not in r for r in rewound)  # v1 has no channel: neither has any record now
    assert [r["note"] for r in rewound] == [f"n{i}" for i in range(40)]
    assert [r["ts"] for r in rewound] == [r["ts"] for r in live]
