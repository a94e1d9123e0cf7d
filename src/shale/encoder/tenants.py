"""Which tenant a record belongs to: a record header (when configured and present), else the first topic rule
that matches, else the default tenant."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from shale.block import check_tenant
from shale.config import IngestConfig
from shale.errors import ConfigError, InvalidNameError


@dataclass
class TenantMapper:
    rules: list[tuple[re.Pattern[str], str]]
    default: str
    header: str = ""
    _cache: dict[str, tuple[str, str | None]] = field(default_factory=dict)

    @classmethod
    def from_config(cls, config: IngestConfig) -> TenantMapper:
        try:
            check_tenant(config.default_tenant)
        except InvalidNameError as exc:
            raise ConfigError(f"ingest.default_tenant: {exc}") from None
        return cls([(re.compile(r.topic_pattern), r.tenant) for r in config.tenants], config.default_tenant,
                   config.tenant_header)

    def for_topic(self, topic: str) -> tuple[str, str | None]:
        """The topic's tenant, or the default tenant and the reason when the topic's rule gives no valid tenant
        (its records then go to quarantine: one topic's bad name never stops the others)."""
        found = self._cache.get(topic)
        if found is None:
            found = (self.default, None)
            for pattern, template in self.rules:
                match = pattern.fullmatch(topic)
                if match:
                    try:
                        found = (check_tenant(template.format(**match.groupdict())), None)
                    except (KeyError, IndexError, AttributeError, ValueError, InvalidNameError) as exc:
                        found = (self.default, f"ingest.tenants rule {pattern.pattern!r} -> {template!r} gives no "
                                               f"valid tenant for topic {topic!r}: {exc}")
                    break
            self._cache[topic] = found
        return found

    def for_header(self, value: bytes | None) -> tuple[str | None, str | None]:
        """(tenant, None) from a header value, or (None, reason) when the value is not a valid tenant."""
        if value is None:
            return None, None
        try:
            return check_tenant(value.decode()), None
        except (UnicodeDecodeError, InvalidNameError) as exc:
            return None, f"header {self.header!r} holds an invalid tenant: {exc}"
