"""Development services: fetch and run a real Kafka broker and a real MinIO server on loopback ports.

Used by ``shale dev up | down | status``, by the test fixtures and by ``make demo``. Nothing here is needed in
production, where Kafka and the bucket already exist.
"""

from shale.dev.kafka import KafkaBroker
from shale.dev.minio import MinioServer
from shale.dev.process import ManagedProcess, free_port
from shale.dev.stack import DevStack, StackState

__all__ = ["DevStack", "KafkaBroker", "ManagedProcess", "MinioServer", "StackState", "free_port"]
