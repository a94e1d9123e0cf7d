"""One configuration model for every Shale component.

Sources, later ones winning: embedded defaults, a TOML file (``--config``, ``$SHALE_CONFIG`` or ``./shale.toml``),
environment variables ``SHALE_<SECTION>__<KEY>`` (nested keys joined by ``__``) and ``--set section.key=value``
flags. Everything is validated on load; an invalid value is a ``ConfigError`` that names the key, the bad value
and what is allowed. ``shale config check`` runs exactly this validation.
"""

from shale.config.load import load_config, parse_override
from shale.config.model import (
    BlockConfig,
    BucketConfig,
    BucketIndexConfig,
    CompactionConfig,
    IcebergConfig,
    IngestConfig,
    KafkaConfig,
    LoggingConfig,
    MetastoreConfig,
    MetastoreMember,
    ParserRule,
    RetentionConfig,
    SchemaRegistryConfig,
    ShaleConfig,
    SparkConfig,
    TenantRule,
    granted_delete_delay,
)
from shale.config.secrets import Secret, masked, secret_values
from shale.config.types import parse_duration, parse_size

__all__ = [
    "BlockConfig",
    "BucketConfig",
    "BucketIndexConfig",
    "CompactionConfig",
    "IcebergConfig",
    "IngestConfig",
    "KafkaConfig",
    "LoggingConfig",
    "MetastoreConfig",
    "MetastoreMember",
    "ParserRule",
    "RetentionConfig",
    "SchemaRegistryConfig",
    "Secret",
    "ShaleConfig",
    "SparkConfig",
    "TenantRule",
    "granted_delete_delay",
    "load_config",
    "masked",
    "parse_duration",
    "parse_override",
    "parse_size",
    "secret_values",
]
