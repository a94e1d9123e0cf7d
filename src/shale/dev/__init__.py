"""Development services: fetch and run a real Kafka broker, a real MinIO server, a Schema Registry (Apicurio) and a
Spark standalone cluster on loopback ports.

Used by ``shale dev up | down | status``, by the test fixtures, the benchmarks and ``make demo``. Nothing here is
needed in production, where Kafka, the bucket and Spark already exist; no module outside ``shale.dev``,
``shale.demo`` and the ``shale dev`` command imports it (``tests/unit/test_layering.py`` checks).
"""

from shale.dev.fetch import DUCKDB_VERSION, fetch_duckdb
from shale.dev.kafka import KafkaBroker
from shale.dev.minio import MinioServer
from shale.dev.registry import SchemaRegistry
from shale.dev.spark_cluster import SparkStandalone, connector_conf, driver_conf
from shale.dev.stack import DevStack, StackState

__all__ = [
    "DUCKDB_VERSION",
    "DevStack",
    "KafkaBroker",
    "MinioServer",
    "SchemaRegistry",
    "SparkStandalone",
    "StackState",
    "connector_conf",
    "driver_conf",
    "fetch_duckdb",
]
