"""Real services for benchmarks: MinIO and Kafka in a scratch folder, stopped afterwards."""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from shale.config import BucketConfig
from shale.dev import KafkaBroker, MinioServer


@contextmanager
def minio_bucket() -> Iterator[BucketConfig]:
    with tempfile.TemporaryDirectory(prefix="shale-bench-minio-") as tmp:
        server = MinioServer(Path(tmp)).start()
        try:
            name = f"bench-{uuid.uuid4().hex[:8]}"
            server.create_bucket(name)
            yield BucketConfig(url=f"s3://{name}", endpoint=server.endpoint, access_key_id=server.access_key,
                               secret_access_key=server.secret_key, allow_http=True)
        finally:
            server.stop()


@contextmanager
def kafka_broker() -> Iterator[KafkaBroker]:
    with tempfile.TemporaryDirectory(prefix="shale-bench-kafka-") as tmp:
        broker = KafkaBroker(Path(tmp)).start()
        try:
            yield broker
        finally:
            broker.stop()
