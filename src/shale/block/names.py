"""Names that become parts of object keys or labels: validated strictly (whole-string matches: ``$`` would let
a trailing newline through), never used as raw paths."""

from __future__ import annotations

import re

from shale.errors import InvalidNameError

TENANT_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
LABEL_NAME_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]{0,63}")
KAFKA_TOPIC_RE = re.compile(r"[a-zA-Z0-9._-]{1,249}")


def check_tenant(name: str) -> str:
    """A tenant is 1-63 characters of ``a-z 0-9 _ -``, starting with a letter or digit.

    No separators, dots or upper case: the name becomes the first segment of every key of the tenant, and
    names starting with ``_`` are reserved for Shale (``_shale/``).
    """
    if not isinstance(name, str) or not TENANT_RE.fullmatch(name):
        raise InvalidNameError(
            f"tenant {name!r} is not allowed: use 1-63 characters of a-z, 0-9, '_' and '-', "
            "starting with a letter or digit (e.g. 'acme' or 'team-7')"
        )
    return name


def check_label_name(name: str) -> str:
    if not isinstance(name, str) or not LABEL_NAME_RE.fullmatch(name):
        raise InvalidNameError(f"label name {name!r} is not allowed: use [a-zA-Z_][a-zA-Z0-9_]*, at most 64 characters")
    return name


def check_topic(name: str) -> str:
    if not isinstance(name, str) or not KAFKA_TOPIC_RE.fullmatch(name) or name in (".", ".."):
        raise InvalidNameError(f"{name!r} is not a Kafka topic name (1-249 characters of a-z A-Z 0-9 . _ -)")
    return name
