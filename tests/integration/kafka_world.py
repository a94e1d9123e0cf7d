"""Helpers for tests of Kafka as it is: topics with configurations, transactional producers that abort some
transactions, and the exact multiset of records a group stored, read from the bucket."""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from tests.waiting import eventually

from shale.objstore import BucketReader
from shale.verify import StoredBlocks, group_blocks
from shale.verify.reconcile import stored_offsets


def create_topic(bootstrap: str, topic: str, partitions: int, **config: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1, config=config)]).values():
        future.result(timeout=30)
    eventually(lambda: set(admin.list_topics(topic, timeout=5).topics[topic].partitions) == set(range(partitions)),
               30, f"topic {topic}'s partitions")


def stored(metastore: StoredBlocks, bucket: BucketReader, group: str, topic: str,
           incarnation: str | None = None) -> Counter[tuple[int, int]]:
    """(partition, offset) of every record the group's live blocks hold for ``topic`` (quarantined included),
    counted: the exact multiset read from the bucket."""
    offsets = stored_offsets(bucket, group_blocks(metastore, group, 1, topic, incarnation), topic).offsets
    return Counter((p, o) for p, values in offsets.items() for o in values)


def json_value(i: int, **extra: object) -> bytes:
    return json.dumps({"ts": 1_795_000_000 + i, "level": ["INFO", "WARN", "ERROR"][i % 3], "msg": f"event {i}",
                       **extra}).encode()


@dataclass
class TransactionalProducer:
    """Writes transactions of ``size`` records over the topic's partitions, aborting one in ``abort_every``, until
    ``stop`` is set and at least ``transactions`` were written. Records the (partition, offset) of every committed
    and every aborted record."""

    bootstrap: str
    topic: str
    transactions: int
    size: int
    abort_every: int = 5
    pause: float = 0.02
    committed: set[tuple[int, int]] = field(default_factory=set)
    aborted: set[tuple[int, int]] = field(default_factory=set)
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)
    written: int = 0

    def run(self) -> None:
        try:
            producer = Producer({"bootstrap.servers": self.bootstrap, "transactional.id": f"shale-test-{self.topic}",
                                 "linger.ms": 5})
            producer.init_transactions(30)
            n = 0
            t = 0
            while t < self.transactions or not self.stop.is_set():
                abort = t % self.abort_every == self.abort_every - 1
                landed: list[tuple[int, int]] = []
                producer.begin_transaction()
                for _ in range(self.size):
                    value = json_value(n, tx=t, aborted=abort)
                    producer.produce(self.topic, value=value, key=str(n).encode(),
                                     on_delivery=lambda err, msg, into=landed: (
                                         into.append((msg.partition(), msg.offset())) if err is None else None))
                    n += 1
                    producer.poll(0)
                producer.flush(30)
                assert len(landed) == self.size, "a transactional record was not delivered"
                if abort:
                    producer.abort_transaction(30)
                    self.aborted.update(landed)
                else:
                    producer.commit_transaction(30)
                    self.committed.update(landed)
                t += 1
                self.written = t
                time.sleep(self.pause * random.uniform(0.5, 1.5))
        except BaseException as exc:  # reported to the test thread
            self.error = exc
        finally:
            self.done.set()

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, daemon=True, name="transactional-producer")
        thread.start()
        return thread
