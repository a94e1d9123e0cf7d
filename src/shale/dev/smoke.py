"""The smoke pipeline: real Kafka -> Spark's Kafka source -> Parquet through obstore -> the bucket, read back.

It proves the stack (broker, connector jars, Spark, object store) works end to end; ``make demo`` and the
integration suite both run it.
"""

from __future__ import annotations

import io
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from shale.config import BucketConfig
from shale.objstore import open_bucket

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

Record = tuple[str, int, int, bytes]  # topic, partition, offset, value


@dataclass(frozen=True)
class SmokeResult:
    topic: str
    produced: int
    stored: int
    objects: int
    missing: int
    unexpected: int
    seconds: float

    @property
    def ok(self) -> bool:
        return self.produced == self.stored and self.missing == 0 and self.unexpected == 0


def produce(bootstrap: str, topic: str, count: int, partitions: int = 3) -> set[Record]:
    """Create ``topic`` and produce ``count`` records; return what the broker acknowledged."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(timeout=30)
    acked: set[Record] = set()
    errors: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            acked.add((msg.topic(), msg.partition(), msg.offset(), msg.value()))

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for i in range(count):
        producer.produce(topic, key=str(i).encode(), value=f"record-{i}".encode(), on_delivery=on_delivery)
        if i % 1000 == 0:
            producer.poll(0)
    if producer.flush(60) != 0 or errors:
        raise RuntimeError(f"producing to {topic} failed: {errors[:3]}")
    return acked


def _writer(bucket_config: BucketConfig, prefix: str) -> Any:
    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        table = pa.Table.from_batches(list(batches))
        if table.num_rows == 0:
            return
        first = table.slice(0, 1).to_pylist()[0]
        key = f"{prefix}/part-{first['topic']}-{first['partition']}-{first['offset']}.parquet"
        sink = io.BytesIO()
        pq.write_table(table.select(["topic", "partition", "offset", "value"]), sink, compression="zstd")
        open_bucket(bucket_config).put_if_absent(key, sink.getvalue())
        yield pa.RecordBatch.from_pydict({"key": [key], "rows": [table.num_rows]})

    return write


def run_smoke(spark: SparkSession, bootstrap: str, bucket_config: BucketConfig, checkpoint_dir: str,
              count: int = 10_000) -> SmokeResult:
    started = time.monotonic()
    run = uuid.uuid4().hex[:8]
    topic = f"smoke-{run}"
    produced = produce(bootstrap, topic, count)
    prefix = f"_smoke/{run}"
    written: list[str] = []

    def on_batch(df: DataFrame, batch_id: int) -> None:
        out = df.mapInArrow(_writer(bucket_config, f"{prefix}/batch={batch_id}"), "key string, rows long")
        written.extend(row["key"] for row in out.collect())

    query = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.trigger(availableNow=True)
        .option("checkpointLocation", f"{checkpoint_dir}/{run}")
        .foreachBatch(on_batch)
        .start()
    )
    query.awaitTermination()
    bucket = open_bucket(bucket_config)
    stored: list[Record] = []
    keys = [info.key for info in bucket.list(prefix + "/")]
    for key in keys:
        table = pq.read_table(io.BytesIO(bucket.get(key)))
        stored.extend((r["topic"], r["partition"], r["offset"], r["value"]) for r in table.to_pylist())
    stored_set = set(stored)
    return SmokeResult(
        topic=topic,
        produced=len(produced),
        stored=len(stored),
        objects=len(keys),
        missing=len(produced - stored_set),
        unexpected=len(stored_set - produced) + (len(stored) - len(stored_set)),
        seconds=time.monotonic() - started,
    )
