"""Shale against secured brokers: SASL_PLAINTEXT with SCRAM-SHA-512, and TLS with a CA and a broker keystore the
test makes with the JDK's keytool. Both ingest groups and `shale verify` work with the documented settings
(`kafka.security_protocol`, `sasl_*`, `ssl_ca_file`), which Shale translates for Spark's Java consumer and for
librdkafka; a client with a wrong password or without the CA is refused."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from tests.integration.ingest_helpers import config_of, write_config

from shale.config import KafkaConfig
from shale.dev import KafkaBroker
from shale.ingest.job import IngestJob
from shale.kafka import client_options, describe_topics
from shale.metastore import open_metastore
from shale.objstore import open_bucket
from shale.verify import verify_topic


@pytest.mark.parametrize("security", ["sasl", "ssl"])
def test_ingest_and_verify_on_a_secured_broker(security: str, minio_bucket, spark, tmp_path: Path) -> None:
    broker = KafkaBroker(tmp_path / "kafka", security=security).start()  # type: ignore[arg-type]
    try:
        kafka = KafkaConfig(**broker.kafka_config())
        topic = f"secure-{uuid.uuid4().hex[:6]}"
        admin = AdminClient(client_options(kafka))
        for future in admin.create_topics([NewTopic(topic, 2, 1)]).values():
            future.result(timeout=30)
        producer = Producer({**client_options(kafka), "enable.idempotence": True})
        for i in range(3_000):
            value = {"ts": 1_795_000_000 + i, "level": "INFO", "msg": f"event {i}"} if i % 100 else "not json"
            producer.produce(topic, value=json.dumps(value).encode(), partition=i % 2)
            producer.poll(0)
        assert producer.flush(60) == 0

        wrong = dict(client_options(kafka))
        if security == "sasl":
            wrong["sasl.password"] = "not-the-password"
        else:
            del wrong["ssl.ca.pem"]
        with pytest.raises(Exception, match=r"transport|Authentication|SSL|certificate"):
            AdminClient(wrong).list_topics(timeout=5)

        file = write_config(tmp_path, broker.bootstrap_servers, minio_bucket, [topic], kafka=broker.kafka_config())
        config = config_of(file)
        assert describe_topics(config.kafka, [topic])[topic].partitions == (0, 1)
        metastore = open_metastore(config)
        for group in ("backup", "partition"):
            IngestJob(config, group, spark=spark, metastore=metastore).run(available_now=True)
        bucket = open_bucket(config.bucket)
        for group, quarantined in (("backup", 0), ("partition", 30)):
            report = verify_topic(metastore, bucket, config.kafka, group, 1, topic)
            assert (report.stored, report.missing, report.duplicated, report.quarantined) == (
                3_000, 0, 0, quarantined), report.as_dict()
            assert report.ok
    finally:
        broker.stop()
