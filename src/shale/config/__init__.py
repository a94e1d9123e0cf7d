"""One configuration model for every Shale component.

Sources, later ones winning: embedded defaults, a TOML file (``--config``, ``$SHALE_CONFIG`` or ``./shale.toml``),
environment variables ``SHALE_<SECTION>__<KEY>`` (nested keys joined by ``__``) and ``--set section.key=value``
flags. Everything is validated on load; an invalid value is a ``ConfigError`` that names the key, the bad value
and what is allowed. ``shale config check`` runs exactly this validation.
"""

import typing as _typing

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
from shale.config.parsers import (
    ParserOptions,
    Pattern,
    StrftimeFormat,
    TimeFormat,
    TimeZone,
    describe_errors,
    parser_entry_points,
)
from shale.config.secrets import (
    Secret,
    is_secret_location,
    looks_secret,
    masked,
    secret_values,
    spark_redaction_regex,
)
from shale.config.types import parse_duration, parse_size
from shale.exports import lazy_exports as _lazy_exports

if _typing.TYPE_CHECKING:
    from shale.config.explain import explain_key, render_markdown, render_text

__getattr__ = _lazy_exports(__name__, {  # each public name's module, imported on first use
    "explain_key": "explain",
    "render_markdown": "explain",
    "render_text": "explain",
})

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
    "ParserOptions",
    "ParserRule",
    "Pattern",
    "RetentionConfig",
    "SchemaRegistryConfig",
    "Secret",
    "ShaleConfig",
    "SparkConfig",
    "StrftimeFormat",
    "TenantRule",
    "TimeFormat",
    "TimeZone",
    "describe_errors",
    "explain_key",
    "granted_delete_delay",
    "is_secret_location",
    "load_config",
    "looks_secret",
    "masked",
    "parse_duration",
    "parse_override",
    "parse_size",
    "parser_entry_points",
    "render_markdown",
    "render_text",
    "secret_values",
    "spark_redaction_regex",
]
