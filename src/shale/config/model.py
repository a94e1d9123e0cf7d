"""The configuration model: one section per component, every field validated and documented."""

from __future__ import annotations

import re
import string
from collections.abc import Iterator
from typing import Annotated, Any, Literal
from urllib.parse import urlparse

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from shale.config.parsers import describe_errors, options_model
from shale.config.profiles import apply_profile, describe
from shale.config.secrets import Secret, mask_options
from shale.config.types import ByteSize, Duration, Regex

SUPPORTED_BUCKET_SCHEMES = ("file", "s3", "gs", "az", "memory")


class _Section(BaseModel):
    # Unknown keys are errors, so that a typo never silently falls back to a default.
    model_config = ConfigDict(extra="forbid", frozen=True)

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        # Secret fields mask themselves; option maps mask their secret-looking keys (kafka.options' passwords).
        for name, value in super().__repr_args__():
            yield name, mask_options(value) if isinstance(value, dict) else value


class RetryConfig(_Section):
    """Retries of transient object-store failures (5xx, timeouts, connection resets), never of 4xx."""

    attempts: int = Field(default=5, ge=1, le=20, description="total tries of one call, the first included")
    base_delay: Duration = Field(default=0.1, description="first backoff; doubles each retry, with full jitter")
    max_delay: Duration = Field(default=5.0, description="the largest single backoff")


class BucketConfig(_Section):
    """Where blocks live. ``url`` picks the backend by scheme: file://, s3://, gs://, az:// or memory://."""

    url: str = Field(default="file://.shale/bucket", description="bucket URL, e.g. s3://my-bucket")
    endpoint: str = Field(default="", description="S3-compatible endpoint, e.g. http://127.0.0.1:9000 (MinIO)")
    region: str = Field(default="us-east-1", description="S3 region of the bucket")
    access_key_id: str = Field(default="", description="S3 access key; empty means the environment's credentials")
    secret_access_key: Secret = Field(default=SecretStr(""), description="S3 secret key (masked when shown)")
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
        default=7200.0, description="time between a deletion mark and the removal of the block's objects; at "
                                    "least bucket_index.max_stale_period (a reader may use an index that old)"
    )


class KafkaConfig(_Section):
    """How Shale reaches Kafka. Every client Shale runs is librdkafka's (ingest tasks' consumers, offsets, lag,
    verify, restore's producer): security settings are typed, anything else goes through ``client_options``."""

    bootstrap_servers: str = Field(default="127.0.0.1:9092", description="comma-separated host:port list")
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        default="PLAINTEXT", description="how clients connect to the brokers")
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = Field(
        default="SCRAM-SHA-512", description="SASL mechanism (SASL_PLAINTEXT and SASL_SSL)")
    sasl_username: str = Field(default="", description="SASL user name")
    sasl_password: Secret = Field(default=SecretStr(""),
                                     description="SASL password (or $SHALE_KAFKA__SASL_PASSWORD)")
    ssl_ca_file: str = Field(default="", description="PEM file of the CAs that sign the brokers' certificates "
                                                     "(SSL and SASL_SSL; empty: the system's CAs)")
    ssl_verify_hostname: bool = Field(default=True, description="check the broker's certificate names its host")
    client_options: dict[str, str] = Field(
        default_factory=dict, description="extra options of Shale's librdkafka clients (ingest, verify, offsets, "
                                          "lag, restore)")

    @model_validator(mode="before")
    @classmethod
    def _no_shared_options(cls, data: object) -> object:
        if isinstance(data, dict) and "options" in data:
            raise ValueError("kafka.options is gone: use the typed security keys (security_protocol, sasl_*, ssl_*) "
                             "and kafka.client_options (librdkafka's names) for anything else")
        if isinstance(data, dict) and "spark_options" in data:
            raise ValueError("kafka.spark_options is gone: ingest tasks read Kafka with librdkafka, not Spark's "
                             "Java consumer. Put the setting in kafka.client_options under librdkafka's name "
                             "(for example fetch.wait.max.ms, not fetch.max.wait.ms)")
        return data

    @field_validator("bootstrap_servers")
    @classmethod
    def _check_servers(cls, value: str) -> str:
        for server in value.split(","):
            host, _, port = server.strip().rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"{server.strip()!r} is not host:port")
        return value

    @model_validator(mode="after")
    def _check_security(self) -> KafkaConfig:
        if self.security_protocol.startswith("SASL") and not self.sasl_username:
            raise ValueError(f"security_protocol {self.security_protocol} needs sasl_username and sasl_password")
        return self


class SparkConfig(_Section):
    master: str = Field(default="local[*]", description="Spark master URL; local[*] runs in this process")
    conf: dict[str, str] = Field(default_factory=dict, description="extra Spark configuration")


class LoggingConfig(_Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(default="INFO", description="least severe level logged")
    format: Literal["text", "json"] = Field(default="text", description="json writes one object per line")


class MetastoreMember(_Section):
    raft: str = Field(description="the member's Raft address, host:port")
    http: str = Field(description="the member's HTTP API, http://host:port")


class MetastoreConfig(_Section):
    """The metadata index service (seed 004). ``embedded`` runs it inside the calling process on a local SQLite
    file (no network); ``remote`` talks to ``shale metastore serve`` nodes over HTTP."""

    mode: Literal["embedded", "remote"] = Field(default="embedded", description="embedded: in this process, on "
                                                "data_dir; remote: the metastore nodes at addresses")
    addresses: list[str] = Field(default_factory=lambda: ["http://127.0.0.1:7070"],
                                 description="HTTP addresses of the metastore nodes (remote mode)")
    data_dir: str = Field(default=".shale/metastore", description="state, Raft journal and snapshots")
    listen: str = Field(default="127.0.0.1:7070", description="HTTP listen address of `shale metastore serve`")
    raft_address: str = Field(default="", description="this node's Raft address; empty runs a single node")
    members: list[MetastoreMember] = Field(default_factory=list, description="every Raft member, this one included")
    raft_listen: str = Field(default="", description="address the Raft port binds to, host:port (empty: raft_address)")
    secret: Secret = Field(default=SecretStr(""), description="cluster secret: authenticates and encrypts Raft "
                           "traffic and peer calls; required with raft_address (DESIGN 9.6)")
    accepted_secrets: list[Secret] = Field(default_factory=list, description="further cluster secrets accepted "
                                           "from peers but never sent: for a rolling rotation (DESIGN 9.6)")
    tokens_file: str = Field(default="", description="server: API tokens (TOML: name, role, scope, sha256); "
                             "required with raft_address. `shale metastore token create` writes entries")
    token: Secret = Field(default=SecretStr(""), description="client: this process's API token (better: "
                          "token_file or $SHALE_METASTORE__TOKEN); empty uses <data_dir>/admin.token if readable")
    token_file: str = Field(default="", description="client: a file holding this process's API token")
    tls_cert_file: str = Field(default="", description="server: PEM certificate (chain); set with tls_key_file to "
                               "serve HTTPS only")
    tls_key_file: str = Field(default="", description="server: the certificate's PEM private key")
    tls_ca_file: str = Field(default="", description="clients and peers verify the API's certificate against this "
                             "PEM CA bundle (empty: the system's CAs)")
    max_request_bytes: ByteSize = Field(default=16 * 2**20, ge=1024, description="larger request bodies are "
                                        "refused (413) before they are read")
    query_timeout: Duration = Field(default=30.0, description="a block or label query running longer is stopped "
                                    "with a clear error")
    request_timeout: Duration = Field(default=10.0, description="one HTTP request")
    client_deadline: Duration = Field(default=60.0, description="a client call's total time, retries included")
    dlq_interval: Duration = Field(default=15.0, description="how often the leader replays the dead letter queue")
    maintenance_interval: Duration = Field(default=30.0, description="retention and tombstone collection period")
    snapshot_entries: int = Field(default=20_000, ge=10, description="Raft log entries between snapshots")
    bucket_scan_interval: Duration = Field(
        default=600.0, description="how often the leader scans the bucket for partial blocks and cleans it")

    @field_validator("addresses")
    @classmethod
    def _check_addresses(cls, value: list[str]) -> list[str]:
        for address in value:
            if not address.startswith(("http://", "https://")):
                raise ValueError(f"{address!r} is not an http:// or https:// address")
        return value

    @model_validator(mode="after")
    def _tls_pair(self) -> MetastoreConfig:
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError("set tls_cert_file and tls_key_file together (HTTPS needs both), or neither")
        return self


class RetentionConfig(_Section):
    """Time-based retention per tenant (seed 004): index partitions older than this are removed. 0 keeps forever."""

    default: Duration = Field(default=0.0, description="retention of tenants not listed in `tenants`")
    tenants: dict[str, Duration] = Field(default_factory=dict, description="per-tenant retention, e.g. acme = '30d'")

    def for_tenant(self, tenant: str) -> float:
        return self.tenants.get(tenant, self.default)


class TenantRule(_Section):
    """Map topics to a tenant: the first rule whose ``topic_pattern`` matches (Python regex, full match) wins.
    ``tenant`` may use the pattern's named groups, e.g. pattern ``(?P<team>[a-z]+)\\..*`` and tenant ``{team}``."""

    topic_pattern: Regex = Field(description="topics this rule maps (Python regex, full match)")
    tenant: str = Field(description="the tenant: a name (a-z, 0-9, '_', '-') or a template of the pattern's "
                        "named groups, e.g. {team}")

    @model_validator(mode="after")
    def _template(self) -> TenantRule:
        """Every ``{field}`` of the tenant must be a named group of the pattern, used as it is (no attribute,
        index, conversion or format spec): anything else would fail on every record of the topics it matches."""
        groups = sorted(re.compile(self.topic_pattern).groupindex)
        try:
            fields = list(string.Formatter().parse(self.tenant))
        except ValueError as exc:
            raise ValueError(f"tenant {self.tenant!r} is not a valid template: {exc}") from None
        for _, name, spec, conversion in fields:
            if name is not None and (spec or conversion or name not in groups):
                raise ValueError(f"tenant {self.tenant!r}: {{{name}}} is not a named group of topic_pattern "
                                 f"{self.topic_pattern!r} used as it is (its groups: {groups or 'none'}); write "
                                 "{group} with no attribute, index, conversion or format spec")
        fixed = "".join(text for text, _, _, _ in fields)
        if not self.tenant or re.search(r"[^a-z0-9_-]", fixed):
            raise ValueError(f"tenant {self.tenant!r}: a tenant is made of a-z, 0-9, '_' and '-' (or named groups "
                             "of topic_pattern in braces, e.g. {team})")
        return self


class ParserRule(_Section):
    """Which parser the partition group uses for which topics (first match wins). ``options`` are checked against
    the parser's options model when the configuration loads: `shale config explain ingest.parsers` lists them."""

    topic_pattern: Regex = Field(default=".*", description="topics this rule applies to (Python regex, full match)")
    parser: str = Field(description="a parser name from the shale.parsers entry points: json, text, msgpack, ...")
    options: dict[str, object] = Field(default_factory=dict, description="the parser's options (per parser: "
                                       "`shale config explain ingest.parsers`)")
    table: Literal["append", "upsert", "debezium"] = Field(
        default="append", description="append: every record a row (the history); upsert: also a table of the "
        "latest row per key, a null value deleting its key (Kafka's log compaction); debezium: the latest row of "
        "Debezium change events (op c/r/u/d/t, the key from the record key); read with --latest "
        "(docs/design/change-tables.md)")
    key: str = Field(default="", description="upsert: what identifies a row: '' = the Kafka record key, or a "
                     "column path (a parser column such as id, or a struct field such as after.id)")

    @field_validator("parser")
    @classmethod
    def _known_parser(cls, value: str) -> str:
        options_model(value)  # ValueError naming the installed parsers
        return value

    @field_validator("options")
    @classmethod
    def _parser_options(cls, value: dict[str, object], info: ValidationInfo) -> dict[str, object]:
        name = info.data.get("parser")
        if name is None:
            return value  # the parser name was wrong: that error is reported already
        model = options_model(name)
        try:
            model.model_validate(value)
        except ValidationError as exc:
            lines = describe_errors(exc.errors(), "options", model)
            raise PydanticCustomError("parser_options", "parser {parser}: {problems}",
                                      {"parser": name, "problems": "; ".join(lines), "lines": lines}) from None
        return value

    @model_validator(mode="after")
    def _table_key(self) -> ParserRule:
        if self.key and self.table != "upsert":
            raise ValueError(f"key {self.key!r} is for table = \"upsert\" (a {self.table} table's key is the Kafka "
                             "record key): remove it, or set table = \"upsert\"")
        if self.key and not all(self.key.split(".")):
            raise ValueError(f"key {self.key!r} is not a column path: names joined by dots, e.g. id or after.id")
        return self


class SchemaRegistryConfig(_Section):
    """The Schema Registry the typed parsers (``avro``, ``protobuf``, ``json_schema``) fetch writer schemas from by
    id: its Confluent-compatible API (Confluent Schema Registry, or Apicurio's ``/apis/ccompat/v7``). Schemas are
    cached per process."""

    url: str = Field(default="", description="base URL of the Confluent-compatible API, e.g. "
                     "http://registry:8080/apis/ccompat/v7 ('' = no registry)")
    username: str = Field(default="", description="HTTP basic-auth user ('' = no authentication)")
    password: Secret = Field(default=SecretStr(""), description="HTTP basic-auth password (masked when shown)")
    ca_file: str = Field(default="", description="PEM file of the CAs that sign the registry's certificate "
                         "('' = the system's)")
    timeout: Duration = Field(default=10.0, description="one request's timeout; a registry that does not answer "
                              "in time pauses the partitions whose schemas are not cached, which are retried "
                              "with a backoff (their records are never quarantined for it)")
    available_now_attempts: int = Field(default=5, ge=1, description="with --available-now (a one-shot run): how "
                                        "many times in a row a partition may pause on a registry that does not "
                                        "answer usefully (down, a wrong url, refused credentials) before the run "
                                        "fails naming the registry and what to check; a continuous run waits for "
                                        "it, with a backoff up to a minute, however long it takes")

    @field_validator("url")
    @classmethod
    def _http(cls, value: str) -> str:
        if urlparse(value).username or urlparse(value).password:  # checked first: never echo a credential
            raise ValueError("put the registry's credentials in username and password, not in the url")
        if value and urlparse(value).scheme not in ("http", "https"):
            raise ValueError(f"schema registry url {value!r} must start with http:// or https://")
        return value.rstrip("/")


class IngestConfig(_Section):
    """Kafka to blocks (seed 002). Each group (backup, partition) is one ingest process: it plans every batch's
    exact Kafka offsets from the metastore's committed offsets, reads them with Spark and commits them."""

    topics: list[str] = Field(default_factory=list, description="topics to persist (or use topic_pattern)")
    topic_pattern: Regex = Field(default="", description="persist every topic matching this regex, new ones too")
    generation: int = Field(default=1, ge=0, description="the output generation (seed 002's upgrade isolation)")
    default_tenant: str = Field(default="default", description="tenant of topics no rule matches")
    tenants: list[TenantRule] = Field(default_factory=list, description="topic-to-tenant rules")
    tenant_header: str = Field(default="", description="take the tenant from this record header when present")
    parsers: list[ParserRule] = Field(default_factory=list, description="partition group: parser per topic")
    schema_registry: SchemaRegistryConfig = Field(default_factory=SchemaRegistryConfig,
                                                  description="where typed parsers (avro, protobuf, json_schema) "
                                                  "find writer schemas")
    quarantine_warn_share: float = Field(default=0.5, ge=0.0, le=1.0, description="a batch that quarantines all "
                                         "of a topic's records, or more than this share, logs a warning and sets "
                                         "shale_ingest_quarantining")
    partition_by_hour: bool = Field(default=False, description="partition values dt and hour (default: dt)")
    trigger_interval: Duration = Field(default=5.0, description="time policy: a caught-up group plans its next "
                                       "batch this long after its last plan (at once if that batch took longer)")
    backup_trigger_interval: Duration = Field(default=30.0, description="the backup group's trigger_interval: its "
                                              "blocks are read only to restore or reprocess, so it writes fewer, "
                                              "larger objects (seed 002's upload policy is per group)")
    max_records_per_batch: int = Field(default=2_000_000, ge=1, description="size policy: at most this many "
                                                                             "records in one batch")
    max_batch_bytes: ByteSize = Field(default=1024 * 2**20, ge=2**20, description="size policy: about this many "
                                      "bytes of records in one batch (planned from the sizes seen so far)")
    max_task_bytes: ByteSize = Field(default=512 * 2**20, ge=64 * 2**20, description="resident memory of one "
                                     "Spark task's Python worker: records are written in chunks sized to stay "
                                     "within it")
    min_records_per_batch: int = Field(default=0, ge=0, description="wait for this many records ...")
    max_batch_delay: Duration = Field(default=60.0, description="... but no longer than this")
    starting_offsets: Literal["earliest", "latest"] = Field(
        default="earliest", description="where partitions the metastore has never committed start")
    metrics_port: int = Field(default=0, ge=0, le=65535, description="Prometheus metrics port (0: none)")
    lease_duration: Duration = Field(default=15.0, ge=1.0, le=3600.0, description="a driver's ingest lease lasts "
                                     "this long unless renewed (every third of it): a dead driver's shard is free "
                                     "two thirds to all of this after it died; the records then wait for the next "
                                     "holder's start and first batch too (docs/OPERATING.md, Recovery after a kill)")
    shards: Annotated[int, Field(ge=1, le=1024)] | Literal["auto"] = Field(
        default=1, description="how many shards split a group's topic-partitions (jump consistent hash of topic and "
        "partition), each written by one driver at a time; seeds the group's shard map in the metastore, changed "
        "later online with shale shards set. auto: the count follows the group's live drivers (one shard each, no "
        "standby; a driver that joins or leaves reshards the group, DESIGN 10.7)")

    @model_validator(mode="before")
    @classmethod
    def _gone(cls, data: object) -> object:
        gone = {"checkpoint_dir": "ingestion keeps no Spark checkpoint: the metastore holds the committed offsets",
                "allow_offset_gaps": "gaps Kafka explains (transaction markers, aborted records, compaction) are "
                                     "accepted; offsets deleted before they were read are reported per partition "
                                     "and accepted with `shale offsets acknowledge-loss`",
                "fail_on_data_loss": "lost offsets are always detected and reported per partition; accept them with "
                                     "`shale offsets acknowledge-loss`"}
        if isinstance(data, dict):
            for key, why in gone.items():
                if key in data:
                    raise ValueError(f"ingest.{key} is gone: {why}")
        return data

    @model_validator(mode="after")
    def _topics(self) -> IngestConfig:
        if self.topics and self.topic_pattern:
            raise ValueError("set topics or topic_pattern, not both")
        return self


class BucketIndexConfig(_Section):
    """The per-tenant bucket index (seed 001): written by the metastore leader, read with one GET."""

    debounce: Duration = Field(default=5.0, description="the writer waits this long after a change")
    rewrite_interval: Duration = Field(default=300.0, description="rewrite unchanged indexes this often")
    max_stale_period: Duration = Field(default=3600.0, description="readers refuse an index older than this")
    refresh_interval: Duration = Field(default=60.0, description="readers refresh a cached index this often")
    idle_timeout: Duration = Field(default=3600.0, description="readers drop a tenant unused for this long")
    deltas: bool = Field(default=True, description="stale-tolerant mode: writers also drop small delta objects")


class CompactionConfig(_Section):
    """The compaction service (seed 003) and its Spark workers."""

    blocks_per_job: list[int] = Field(default_factory=lambda: [20, 10, 10],
                                      description="a job closes at this many blocks, per level (last repeats)")
    max_level: int = Field(default=3, ge=1, description="blocks at this level are not compacted further")
    job_byte_limit: ByteSize = Field(default=512 * 2**20, description="worker memory per job (see DESIGN 11.4)")
    max_age: Duration = Field(default=3600.0, description="a queue of 2+ blocks this old closes a job anyway")
    lease_duration: Duration = Field(default=15.0, description="a job's lease; workers refresh it")
    queue_limit: int = Field(default=10_000, ge=1, description="jobs kept at most; excluded ones are evicted")
    poll_interval: Duration = Field(default=2.0, description="how often a worker polls and refreshes leases")
    slots: int = Field(default=0, ge=0, le=256, description="jobs one worker claims at once, run as the tasks of "
                       "one Spark job (0: eight per Spark core)")
    metrics_port: int = Field(default=0, ge=0, le=65535, description="worker's Prometheus metrics port (0: none)")

    @field_validator("blocks_per_job")
    @classmethod
    def _counts(cls, value: list[int]) -> list[int]:
        if not value or any(n < 2 for n in value):
            raise ValueError("give at least one count, each at least 2")
        return value


class IcebergConfig(_Section):
    """Apache Iceberg tables over the stored blocks (docs/DESIGN.md, section 16): one table per tenant and topic of
    the partition group, published by the metastore leader, in a SQLite catalog or a REST catalog service that
    Spark, Trino, DuckDB or Polars read. Credentials of the bucket are those of ``[bucket]``."""

    enabled: bool = Field(default=False, description="publish every committed change as an Iceberg snapshot")
    catalog: Literal["sql", "rest"] = Field(
        default="sql", description="sql: a SQL catalog database Shale writes itself (one machine); rest: an "
                                   "Iceberg REST catalog service (Polaris, Lakekeeper, Nessie, Glue, ...)")
    catalog_uri: str = Field(
        default="sqlite:///.shale/iceberg/catalog.db",
        description="sql: the catalog's SQLite file, sqlite:///PATH, on the metastore leader's disk (one machine; "
                    "for several, use rest); rest: the catalog's base URL, http(s)://host:port[/path]")
    catalog_name: str = Field(default="shale", description="the catalog's name (engines must use the same one)")
    warehouse: str = Field(default="", description="sql: where table metadata goes (empty: <bucket url>/_shale/"
                           "iceberg); rest: the warehouse the catalog serves, a name or a location as the catalog "
                           "defines it (empty: the catalog's default)")
    credential: Secret = Field(default=SecretStr(""), description="rest: an OAuth2 client credential, "
                               "client_id:client_secret, exchanged for tokens (or $SHALE_ICEBERG__CREDENTIAL)")
    token: Secret = Field(default=SecretStr(""), description="rest: a bearer token sent as it is (or "
                          "$SHALE_ICEBERG__TOKEN)")
    oauth2_server_uri: str = Field(default="", description="rest: where the credential is exchanged (empty: the "
                                   "catalog's own v1/oauth/tokens)")
    scope: str = Field(default="", description="rest: the OAuth2 scope asked for (empty: the catalog's default)")
    rest_options: dict[str, str] = Field(
        default_factory=dict, description="rest: further pyiceberg REST catalog properties, e.g. "
        "rest.sigv4-enabled, rest.signing-name, header.X-Iceberg-Access-Delegation (docs/DEPLOY.md)")
    interval: Duration = Field(default=1.0, description="how often the leader looks for changes to publish")
    max_entries_per_round: int = Field(default=2000, ge=1, description="log entries published per round at most")
    snapshot_retention: Duration = Field(
        default=7 * 86_400, description="snapshots of Shale's tables older than this are expired: removed from the "
        "table's metadata only (the data files are Shale's blocks and stay); the newest snapshot Shale wrote is "
        "always kept; 0 keeps every snapshot")
    expire_interval: Duration = Field(default=3600.0, description="how often the leader expires old snapshots")
    erasure_hold: Duration = Field(
        default=600.0, description="while an erasure's blocks are being rewritten, the leader holds the tables' "
        "snapshots back for at most this long, so each table gets one snapshot for the whole erasure (keep it well "
        "below block.delete_delay: the tables still name the replaced blocks meanwhile)")

    @field_validator("catalog_uri", "oauth2_server_uri")
    @classmethod
    def _no_userinfo(cls, value: str) -> str:
        if urlparse(value).username or urlparse(value).password:
            raise ValueError("put the REST catalog's credentials in credential or token (secrets, masked wherever "
                             "shown), not in a url")
        return value

    @field_validator("catalog_name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not value.replace("_", "").isalnum():
            raise ValueError("use letters, digits and underscores")
        return value

    @model_validator(mode="after")
    def _rest(self) -> IcebergConfig:
        if self.catalog == "rest" and not self.catalog_uri.startswith(("http://", "https://")):
            raise ValueError("with catalog = \"rest\", catalog_uri is the REST catalog's http(s):// URL")
        if self.catalog == "sql" and not self.catalog_uri.startswith("sqlite:///"):
            raise ValueError("with catalog = \"sql\", catalog_uri is a SQLite file, sqlite:///PATH (one machine); a "
                             "catalog several machines reach is a REST catalog: catalog = \"rest\" (docs/DEPLOY.md)")
        if self.credential.get_secret_value() and self.token.get_secret_value():
            raise ValueError("set credential or token, not both")
        return self


class RunConfig(_Section):
    """``shale run``: one machine's deployment from this configuration (all of it, or the services it lists)."""

    services: list[Literal["metastore", "ingest", "compaction"]] = Field(
        default_factory=lambda: ["metastore", "ingest", "compaction"],  # type: ignore[arg-type]
        description="what this machine runs; without metastore, metastore.mode must be remote (docs/DEPLOY.md)")
    ingest_groups: list[Literal["backup", "partition"]] = Field(
        default_factory=lambda: ["backup", "partition"],  # type: ignore[arg-type]
        description="the ingest groups `shale run` starts")
    ingest_processes: int = Field(default=1, ge=1, le=64, description="`shale ingest` processes `shale run` starts "
                                  "per group: each holds a free shard's lease or waits as a standby of every shard "
                                  "(DESIGN 10.7); more than ingest.shards across the machines means standbys (with "
                                  "ingest.shards = auto, each takes a shard of its own)")
    compaction_workers: int = Field(default=1, ge=0, description="compaction worker processes `shale run` starts")
    metrics_base_port: int = Field(default=9400, ge=0, le=65000,
                                   description="ingest groups and workers expose metrics from this port up (0: any "
                                               "free ports)")
    restart_delay: Duration = Field(default=5.0, description="wait before restarting a process that died")


def granted_delete_delay(asked: float, floor: float, delete_delay: float) -> float:
    """How long the objects an erasure replaced stay, in seconds: ``delete_delay``, or the shorter delay the
    erasure asked for (0: none), never below ``floor`` (``ShaleConfig.erasure_delay_floor`` of the one deleting,
    so a client with another configuration cannot go below it)."""
    return min(delete_delay, max(asked, floor)) if asked else delete_delay


class ShaleConfig(_Section):
    """The whole configuration. Sections are documented field by field; see ``shale config check``."""

    profile: Literal["default", "trial"] = Field(  # the keys of PROFILES
        default="default", description="trial: the delays that protect readers shortened for a one-machine trial "
        f"({describe('trial')}; a key set explicitly keeps its value), so that an erasure's receipt comes in "
        "minutes instead of about two hours; never in production")
    bucket: BucketConfig = Field(default_factory=BucketConfig)
    block: BlockConfig = Field(default_factory=BlockConfig)
    kafka: KafkaConfig = Field(default_factory=KafkaConfig)
    spark: SparkConfig = Field(default_factory=SparkConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    metastore: MetastoreConfig = Field(default_factory=MetastoreConfig)
    retention: RetentionConfig = Field(default_factory=RetentionConfig)
    ingest: IngestConfig = Field(default_factory=IngestConfig)
    bucket_index: BucketIndexConfig = Field(default_factory=BucketIndexConfig)
    compaction: CompactionConfig = Field(default_factory=CompactionConfig)
    iceberg: IcebergConfig = Field(default_factory=IcebergConfig)
    run: RunConfig = Field(default_factory=RunConfig)

    @model_validator(mode="before")
    @classmethod
    def _profile(cls, data: Any) -> Any:
        return apply_profile(data)

    @model_validator(mode="after")
    def _delays(self) -> ShaleConfig:
        """A bucket-index reader may list blocks from an index up to ``max_stale_period`` old (seed 001): a block
        marked for deletion just after that index was written must outlive it, or the reader lists deleted
        objects. Cortex states the same rule for its deletion delay."""
        if self.block.delete_delay < self.block.sync_delay:
            raise ValueError(f"block.delete_delay ({self.block.delete_delay:g} s) must be at least block.sync_delay "
                             f"({self.block.sync_delay:g} s): a compaction's sources are marked once its output is "
                             "past the sync delay, and bucket scanners must always see one of the two")
        if self.block.delete_delay < self.bucket_index.max_stale_period:
            raise ValueError(f"block.delete_delay ({self.block.delete_delay:g} s) must be at least "
                             f"bucket_index.max_stale_period ({self.bucket_index.max_stale_period:g} s): a reader "
                             "may use an index that old, and would list blocks already deleted")
        return self

    @property
    def erasure_delay_floor(self) -> float:
        """The shortest delete delay an erasure may ask for (``shale erase --delete-delay``), in seconds: the
        rules above without their margin. A reader may use a bucket index ``max_stale_period`` old, a bucket
        scanner trusts no block younger than ``sync_delay``, and an index query runs up to ``query_timeout``."""
        return max(self.bucket_index.max_stale_period, self.block.sync_delay, self.metastore.query_timeout)
