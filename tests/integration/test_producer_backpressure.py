"""Test and benchmark producers survive a full local queue: with librdkafka's queue shrunk to 10 records, a plain
produce loop fails with BufferError, while ``CheckedProducer`` waits for room and every record arrives once."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from tests.integration.ingest_helpers import create_topic
from tests.producing import CheckedProducer
from tests.waiting import eventually

RECORDS = 5_000
TINY_QUEUE = {"queue.buffering.max.messages": 10, "linger.ms": 5}


def _values(bootstrap: str, topic: str, partitions: int) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4().hex}",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    values: list[bytes] = []

    def all_read() -> bool:
        for message in consumer.consume(1000, timeout=0.5):
            if message.error() is not None:
                raise KafkaException(message.error())
            values.append(message.value())
        return len(values) >= RECORDS

    try:
        eventually(all_read, 60, lambda: f"{RECORDS} records in {topic} (read {len(values)})")
        assert not consumer.consume(1000, timeout=1.0)  # and no more
    finally:
        consumer.close()
    return values


def test_a_plain_produce_loop_overflows_the_tiny_queue(kafka) -> None:
    topic = f"overflow-{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap_servers, topic, 1)
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, **TINY_QUEUE})

    def old_loop() -> None:  # what produce_json did: produce, and poll every 5,000 records
        for i in range(RECORDS):
            producer.produce(topic, value=str(i).encode())
            if i % 5000 == 0:
                producer.poll(0)

    with pytest.raises(BufferError, match="Queue full"):
        old_loop()
    producer.flush(30)


def test_checked_producer_delivers_every_record_through_the_tiny_queue(kafka) -> None:
    topic = f"backpressure-{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap_servers, topic, 2)
    producer = CheckedProducer({"bootstrap.servers": kafka.bootstrap_servers, "enable.idempotence": True,
                                **TINY_QUEUE})
    for i in range(RECORDS):
        producer.produce(topic, str(i).encode(), partition=i % 2)
    assert producer.flush(60) == RECORDS
    assert producer.queue_full > 0  # the queue did fill up, and the producer waited
    assert sorted(_values(kafka.bootstrap_servers, topic, 2), key=int) == [str(i).encode() for i in range(RECORDS)]


def test_checked_producer_reports_records_it_could_not_deliver(kafka) -> None:
    producer = CheckedProducer({"bootstrap.servers": kafka.bootstrap_servers, "message.timeout.ms": 2000})
    producer.produce(f"missing-{uuid.uuid4().hex[:6]}", b"lost", partition=7)  # no such topic or partition
    with pytest.raises(AssertionError, match="failed to deliver"):
        producer.flush(30)
