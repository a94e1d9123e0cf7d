"""Real services for benchmarks: MinIO, Kafka and an Iceberg REST catalog in a scratch folder, stopped afterwards."""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from shale.config import BucketConfig
from shale.dev import KafkaBroker, MinioServer
from shale.dev.iceberg_rest import IcebergRestCatalog


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
def kafka_broker(heap: str = KafkaBroker.heap) -> Iterator[KafkaBroker]:
    with tempfile.TemporaryDirectory(prefix="shale-bench-kafka-") as tmp:
        broker = KafkaBroker(Path(tmp), heap=heap, quick_jit=False).start()  # a benchmark measures C2's steady state
        try:
            yield broker
        finally:
            broker.stop()


@contextmanager
def iceberg_rest_catalog(bucket: BucketConfig, data_dir: Path) -> Iterator[IcebergRestCatalog]:
    """Apache Iceberg 1.11's REST catalog server on loopback, its warehouse under ``_rest/`` in ``bucket``."""
    catalog = IcebergRestCatalog(data_dir, f"{bucket.url}/_rest", bucket.endpoint, bucket.access_key_id,
                                 bucket.secret_access_key.get_secret_value()).start()
    try:
        yield catalog
    finally:
        catalog.stop()
