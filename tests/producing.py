"""Producing test and benchmark records to Kafka without depending on the machine's speed.

librdkafka queues records locally and sends them from its own threads. When the local queue is full,
``Producer.produce`` raises ``BufferError: Local: Queue full`` at once; how soon that happens depends on how fast
the caller produces compared with how fast the broker acknowledges. ``CheckedProducer`` waits for room instead,
serves delivery reports as it goes, and fails the test if any record was not delivered.
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError, Message, Producer

QUEUE_FULL_PAUSE = 0.1


class CheckedProducer:
    """A confluent-kafka producer that handles back-pressure and checks every delivery. Not thread-safe."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.producer = Producer(config)
        self.sent = 0
        self.delivered = 0
        self.queue_full = 0
        """How often ``produce`` found the local queue full and waited."""
        self.errors: list[str] = []

    def _on_delivery(self, err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            self.errors.append(str(err))
        else:
            self.delivered += 1

    def produce(self, topic: str, value: bytes, key: bytes | None = None, partition: int | None = None,
                **fields: Any) -> None:
        """Queue one record, waiting while the local queue is full (``fields``: headers, timestamp)."""
        extra = fields if partition is None else {**fields, "partition": partition}
        while True:
            try:
                self.producer.produce(topic, value=value, key=key, on_delivery=self._on_delivery, **extra)
                break
            except BufferError:
                self.queue_full += 1
                self.producer.poll(QUEUE_FULL_PAUSE)  # serve delivery reports until the queue has room
        self.sent += 1
        self.producer.poll(0)  # serve the delivery reports that are ready, so they never pile up

    def flush(self, timeout: float = 120) -> int:
        """Wait until every queued record is delivered; raise ``AssertionError`` unless all were. Returns the
        number of records delivered so far."""
        left = self.producer.flush(timeout)
        assert left == 0, f"{left} records were not delivered within {timeout:g} s"
        assert not self.errors, f"{len(self.errors)} records failed to deliver, first: {self.errors[:3]}"
        assert self.delivered == self.sent, f"{self.sent} records sent, {self.delivered} delivered"
        return self.delivered
