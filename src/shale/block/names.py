"""Names that become parts of object keys or labels: validated strictly (whole-string matches: ``$`` would let
a trailing newline through), never used as raw paths."""

from __future__ import annotations

import re

from shale.errors import InvalidNameError

TENANT_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
LABEL_NAME_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]{0,63}")
KAFKA_TOPIC_RE = re.compile(r"[a-zA-Z0-9._-]{1,249}")
RECORD_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*){0,63}")
MAX_RECORD_NAME = 200
RECORD_LABEL = "record"
"""The label naming a dataset's record type (``Dataset.record``), in each of its label sets."""


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


def check_record_name(name: str) -> str:
    """A record type's name (an Avro full name, a Protobuf message's full name, a JSON Schema title): dotted
    identifiers, at most 200 characters. It names a dataset, a label value and (dots as ``_``) an Iceberg table."""
    if not isinstance(name, str) or len(name) > MAX_RECORD_NAME or not RECORD_NAME_RE.fullmatch(name):
        raise InvalidNameError(f"record type {name!r} is not allowed: use dotted identifiers such as 'shop.Order' "
                               f"([A-Za-z_][A-Za-z0-9_]* separated by '.'), at most {MAX_RECORD_NAME} characters")
    return name


MORE_LABEL_SETS = "__shale_more__"
"""A label name no parser may declare (``__`` names are reserved, as in Prometheus): a dataset whose rows have
more distinct label sets than a block keeps lists a set with this label, holding only the labels every row
shares. Pruning treats any other label of that set as unknown: it may match (``shale.index.matchers``)."""


def cap_label_sets(label_sets: list[dict[str, str]], limit: int) -> list[dict[str, str]]:
    """At most ``limit`` label sets that still let pruning find every row: the first ``limit - 1`` and, when
    some were left out, one "more" set of the labels all of them share."""
    if len(label_sets) <= limit:
        return label_sets
    plain = [ls for ls in label_sets if MORE_LABEL_SETS not in ls]
    common = dict(label_sets[0])
    for ls in label_sets[1:]:
        common = {k: v for k, v in common.items() if ls.get(k) == v}
    common.pop(MORE_LABEL_SETS, None)
    return [*plain[:limit - 1], {**common, MORE_LABEL_SETS: "1"}]

