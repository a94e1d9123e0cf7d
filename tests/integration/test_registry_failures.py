"""A registry mistake fails closed, against the real Apicurio Registry 3.0.9, Kafka, MinIO and Spark.

Avro records written with confluent-kafka's AvroSerializer; `shale ingest --available-now` with the registry's url
missing ``/apis/ccompat/v7`` (Apicurio answers 404 there, but without its own "not found" error code): no record
is quarantined, no offset committed, no block written, and the run ends (after the configured attempts) with an
error naming the URL asked and what to check, never the password. The same command with the right url then stores
every record, typed: nothing was lost. Apicurio's own answer for an unknown id (404, ``error_code`` 40403) still
quarantines, checked in the same run. `shale config check` reads the topic's subject from the real registry and
names the subject and version a misspelled time field is missing from.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from tests.integration.ingest_helpers import config_of, create_topic, ingest_process, write_config
from tests.producing import CheckedProducer

from shale.block import read_dataset
from shale.cli import cli
from shale.config import BucketConfig, SchemaRegistryConfig
from shale.dev import KafkaBroker, SchemaRegistry
from shale.metastore import open_index_view
from shale.objstore import open_bucket
from shale.schemas.registry import RegistryClient, RegistryUnavailableError, UnknownSchemaError
from shale.verify import group_blocks

TOPIC = "payments-wrong-url"
SCHEMA: dict[str, Any] = {"type": "record", "name": "Payment", "namespace": "shop",
                          "fields": [{"name": "id", "type": "long"}, {"name": "note", "type": "string"}]}
COUNT = 50
PASSWORD = "hunter2-registry-secret"


def _produce(kafka: KafkaBroker, registry: SchemaRegistry) -> None:
    serializer = AvroSerializer(SchemaRegistryClient({"url": registry.url}), json.dumps(SCHEMA))
    producer = CheckedProducer({"bootstrap.servers": kafka.bootstrap_servers, "enable.idempotence": True})
    for i in range(COUNT):
        value = serializer({"id": i, "note": f"n{i}"}, SerializationContext(TOPIC, MessageField.VALUE))
        producer.produce(TOPIC, value=value)
    producer.flush(60)


def _run(file: Path, log: Path) -> tuple[int, str]:
    process = ingest_process(file, "partition", log, available_now=True)
    assert process.popen is not None
    code = process.popen.wait(timeout=600)
    return code, log.read_text()


def test_case5_a_registry_url_without_its_api_path_fails_the_one_shot_run_and_quarantines_nothing(
        kafka: KafkaBroker, schema_registry: SchemaRegistry, minio_bucket: BucketConfig, tmp_path: Path) -> None:
    create_topic(kafka.bootstrap_servers, TOPIC, 1)
    _produce(kafka, schema_registry)
    root = schema_registry.url.removesuffix("/apis/ccompat/v7")
    assert root != schema_registry.url
    parser = {"parser": "avro", "options": {"label_fields": ["note"]}}  # checked against the subject at start

    # The real registry's answers: its own "not found" for an unknown id, and a 404 without it at the wrong path.
    with pytest.raises(UnknownSchemaError, match=r"error 40403"):
        RegistryClient(SchemaRegistryConfig(url=schema_registry.url)).schema(987_654)
    with pytest.raises(RegistryUnavailableError, match="without the registry's own"):
        RegistryClient(SchemaRegistryConfig(url=root)).schema(987_654)

    wrong = tmp_path / "wrong"
    wrong.mkdir()
    file = write_config(wrong, kafka.bootstrap_servers, minio_bucket, [TOPIC], parsers_override=[parser],
                        schema_registry={"url": root, "username": "ops", "password": PASSWORD,
                                         "available_now_attempts": 2})
    code, log = _run(file, wrong / "ingest.log")
    assert code == 1, log[-4000:]
    assert f"paused 2 times in a row on the schema registry {root}" in log
    assert f"answered HTTP 404 to GET {root}/schemas/ids/" in log
    assert "without the registry's own" in log
    assert "ingest.schema_registry.url" in log
    assert "/apis/ccompat/v7" in log
    assert PASSWORD not in log
    assert "the typed parser rules could not be checked against the schema registry" in log  # and it went on

    view = open_index_view(config_of(file))  # the run's embedded state
    assert [o for o in view.offsets("partition", 1) if o.topic == TOPIC] == []  # nothing committed
    assert group_blocks(view, "partition", 1, TOPIC) == []  # nothing written, nothing quarantined

    # The right url: the same command stores every record, typed, none quarantined.
    right = tmp_path / "right"
    right.mkdir()
    fixed = write_config(right, kafka.bootstrap_servers, minio_bucket, [TOPIC], parsers_override=[parser],
                         metastore={"data_dir": str(wrong / "metastore")},
                         schema_registry={"url": schema_registry.url, "available_now_attempts": 2})
    code, log = _run(fixed, right / "ingest.log")
    assert code == 0, log[-4000:]
    config = config_of(fixed)
    view = open_index_view(config)
    bucket = open_bucket(config.bucket)
    assert [o.committed_end for o in view.offsets("partition", 1) if o.topic == TOPIC] == [COUNT]
    metas = group_blocks(view, "partition", 1, TOPIC)
    kinds = {d.kind for m in metas for d in m.datasets}
    assert kinds == {"records"}
    ids = sorted(i for m in metas for d in m.datasets for i in read_dataset(bucket, m, d).column("id").to_pylist())
    assert ids == list(range(COUNT))


def test_config_check_names_the_subject_and_version_a_misspelled_time_field_is_missing_from(
        kafka: KafkaBroker, schema_registry: SchemaRegistry, minio_bucket: BucketConfig, tmp_path: Path) -> None:
    topic = "billing-check"
    serializer = AvroSerializer(SchemaRegistryClient({"url": schema_registry.url}), json.dumps(SCHEMA))
    serializer({"id": 1, "note": "x"}, SerializationContext(topic, MessageField.VALUE))  # registers version 1
    wrong = {"parser": "avro", "options": {"time_field": "idd", "label_fields": ["note"]}}
    file = write_config(tmp_path, kafka.bootstrap_servers, minio_bucket, [topic], parsers_override=[wrong],
                        schema_registry={"url": schema_registry.url})
    result = CliRunner().invoke(cli, ["--config", str(file), "config", "check"])
    assert result.exit_code == 1, result.output
    sid = RegistryClient(SchemaRegistryConfig(url=schema_registry.url)).version(f"{topic}-value", 1).id
    assert (f"topic '{topic}', subject '{topic}-value' version 1 (schema id {sid}): time_field 'idd' is not a "
            "field of it (its fields: id, note)") in result.output

    right = {"parser": "avro", "options": {"time_field": "id", "label_fields": ["note"]}}
    fixed = tmp_path / "fixed"
    fixed.mkdir()
    file = write_config(fixed, kafka.bootstrap_servers, minio_bucket, [topic], parsers_override=[right],
                        schema_registry={"url": schema_registry.url})
    result = CliRunner().invoke(cli, ["--config", str(file), "config", "check"])
    assert result.exit_code == 0, result.output
    assert result.output.rstrip().endswith("configuration is valid")
