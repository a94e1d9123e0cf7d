"""The configuration model: one section per component, every field validated and documented."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, field_validator

from shale.config.types import Duration

SUPPORTED_BUCKET_SCHEMES = ("file", "s3", "gs", "az", "memory")


class _Section(BaseModel):
    # Unknown keys are errors, so that a typo never silently falls back to a default.
    model_config = ConfigDict(extra="forbid", frozen=True)


class RetryConfig(_Section):
    """Retries of transient object-store failures (5xx, timeouts, connection resets), never of 4xx."""

    attempts: int = Field(default=5, ge=1, le=20, description="total tries of one call, the first included")
    base_delay: Duration = Field(default=0.1, description="first backoff; doubles each retry, with full jitter")
    max_delay: Duration = Field(default=5.0, description="the largest single backoff")


class BucketConfig(_Section):
    """Where blocks live. ``url`` picks the backend by scheme: file://, s3://, gs://, az:// or memory://."""

    url: str = Field(default="file://.shale/bucket", description="bucket URL, e.g. s3://my-bucket")
    endpoint: str = Field(default="", description="S3-compatible endpoint, e.g. http://127.0.0.1:9000 (MinIO)")
    region: str = Field(default="us-east-1")
    access_key_id: str = Field(default="", description="S3 access key; empty means the environment's credentials")
    secret_access_key: str = Field(default="", repr=False)
    allow_http: bool = Field(default=False, description="allow plain HTTP endpoints (development only)")
    options: dict[str, str] = Field(default_factory=dict, description="extra obstore options for the backend")
    retry: RetryConfig = Field(default_factory=RetryConfig)

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        scheme = urlparse(value).scheme
        if scheme not in SUPPORTED_BUCKET_SCHEMES:
            allowed = ", ".join(f"{s}://" for s in SUPPORTED_BUCKET_SCHEMES)
            raise ValueError(f"unsupported scheme {scheme or '(none)'!r}; use one of {allowed}")
        return value


class BlockConfig(_Section):
    """The object-storage contract's delays (seed 000)."""

    sync_delay: Duration = Field(
        default=900.0, description="blocks younger than this are Fresh: bucket scanners do not trust them yet"
    )
    delete_delay: Duration = Field(
        default=900.0, description="time between a deletion mark and the removal of the block's objects"
    )


class KafkaConfig(_Section):
    bootstrap_servers: str = Field(default="127.0.0.1:9092", description="comma-separated host:port list")
    options: dict[str, str] = Field(
        default_factory=dict, description="extra Kafka client options (security.protocol, sasl.*, ...)"
    )

    @field_validator("bootstrap_servers")
    @classmethod
    def _check_servers(cls, value: str) -> str:
        for server in value.split(","):
            host, _, port = server.strip().rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"{server.strip()!r} is not host:port")
        return value


class SparkConfig(_Section):
    master: str = Field(default="local[*]", description="Spark master URL; local[*] runs in this process")
    conf: dict[str, str] = Field(default_factory=dict, description="extra Spark configuration")


class LoggingConfig(_Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    format: Literal["text", "json"] = Field(default="text", description="json writes one object per line")


class MetastoreMember(_Section):
    raft: str = Field(description="the member's Raft address, host:port")
    http: str = Field(description="the member's HTTP API, http://host:port")


class MetastoreConfig(_Section):
    """The metadata index service (seed 004). ``embedded`` runs it inside the calling process on a local SQLite
    file (no network); ``remote`` talks to ``shale metastore serve`` nodes over HTTP."""

    mode: Literal["embedded", "remote"] = "embedded"
    addresses: list[str] = Field(default_factory=lambda: ["http://127.0.0.1:7070"],
                                 description="HTTP addresses of the metastore nodes (remote mode)")
    data_dir: str = Field(default=".shale/metastore", description="state, Raft journal and snapshots")
    listen: str = Field(default="127.0.0.1:7070", description="HTTP listen address of `shale metastore serve`")
    raft_address: str = Field(default="", description="this node's Raft address; empty runs a single node")
    members: list[MetastoreMember] = Field(default_factory=list, description="every Raft member, this one included")
    secret: str = Field(default="", repr=False, description="encrypts Raft traffic between members when set")
    request_timeout: Duration = Field(default=10.0, description="one HTTP request")
    client_deadline: Duration = Field(default=60.0, description="a client call's total time, retries included")
    dlq_interval: Duration = Field(default=15.0, description="how often the leader replays the dead letter queue")
    maintenance_interval: Duration = Field(default=30.0, description="retention and tombstone collection period")
    snapshot_entries: int = Field(default=20_000, ge=10, description="Raft log entries between snapshots")

    @field_validator("addresses")
    @classmethod
    def _check_addresses(cls, value: list[str]) -> list[str]:
        for address in value:
            if not address.startswith(("http://", "https://")):
                raise ValueError(f"{address!r} is not an http:// or https:// address")
        return value


class RetentionConfig(_Section):
    """Time-based retention per tenant (seed 004): index partitions older than this are removed. 0 keeps forever."""

    default: Duration = Field(default=0.0, description="retention of tenants not listed in `tenants`")
    tenants: dict[str, Duration] = Field(default_factory=dict, description="per-tenant retention, e.g. acme = '30d'")

    def for_tenant(self, tenant: str) -> float:
        return self.tenants.get(tenant, self.default)


class ShaleConfig(_Section):
    """The whole configuration. Sections are documented field by field; see ``shale config check``."""

    bucket: BucketConfig = Field(default_factory=BucketConfig)
    block: BlockConfig = Field(default_factory=BlockConfig)
    kafka: KafkaConfig = Field(default_factory=KafkaConfig)
    spark: SparkConfig = Field(default_factory=SparkConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    metastore: MetastoreConfig = Field(default_factory=MetastoreConfig)
    retention: RetentionConfig = Field(default_factory=RetentionConfig)
