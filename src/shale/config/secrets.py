"""Secrets in the configuration: one type, masked everywhere the configuration is shown.

A field declared ``Secret`` (pydantic's ``SecretStr``) shows as ``***`` in ``shale config show``, in reprs, in
JSON dumps and in validation errors; code reads it with ``.get_secret_value()`` at the one place that needs it.
Free-form option maps (``kafka.client_options``, ``bucket.options``, ``spark.conf``, ``iceberg.rest_options``)
cannot be typed per key, so a value whose key looks secret (``SECRET_KEY_PATTERN``: password, secret, jaas,
token, key, credential, authorization, cookie, signature, and every HTTP header a REST client sends, ``header.*``)
is masked the same way, registered for the log redactor, kept off command lines (``shale.spark``) and named by
the Spark redaction regex Shale sets (``spark_redaction_regex``). A new secret field needs nothing more than its
type.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import BaseModel, BeforeValidator, SecretStr

MASK = "***"
SECRET_KEY_PATTERN = (r"password|passwd|secret|jaas|token|key|credential|authori[sz]ation|cookie|signature"  # noqa: S105 (a pattern of key names)
                      r"|(^|[.])headers?[.]")
"""What an option key naming a secret contains (case ignored). ``header.<name>``: a REST catalog client sends
``header.Authorization``, ``header.X-Api-Key`` and the like as HTTP headers, so every header is taken as secret. The
pattern is written so that Java reads it the same way (Spark's ``spark.redaction.regex``)."""
_SECRET_KEY = re.compile(SECRET_KEY_PATTERN, re.IGNORECASE)
SPARK_DEFAULT_REDACTION = r"(?i)secret|password|token|access[.]?key"
"""Spark's default ``spark.redaction.regex`` (4.0 and 4.1.1): it misses ``credential`` and ``header.Authorization``."""


def _as_text(value: object) -> object:
    # A secret given as --set metastore.secret=12345 parses as a number; take it as the text it was, so that the
    # validation error (which would print the value) never happens.
    return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


Secret = Annotated[SecretStr, BeforeValidator(_as_text)]
"""A configured secret: masked when shown, read with ``.get_secret_value()``."""


def looks_secret(key: str) -> bool:
    """Does an option key name a secret (``sasl.password``, ``sasl.jaas.config``, ``ssl.key.password``)?"""
    return bool(_SECRET_KEY.search(key))


def spark_redaction_regex(configured: str = "") -> str:
    """The ``spark.redaction.regex`` of a session Shale builds: Spark's default (or the ``configured`` one) and every
    key ``looks_secret`` names, so Spark's UI, its REST API and the event log show those settings' values as
    ``*********(redacted)``."""
    theirs = configured or SPARK_DEFAULT_REDACTION
    if SECRET_KEY_PATTERN in theirs:
        return theirs
    return f"(?i)(?:{theirs.removeprefix('(?i)')})|(?:{SECRET_KEY_PATTERN})"


def mask_options(options: dict[str, Any]) -> dict[str, Any]:
    """The option map with every secret-looking value replaced by ``***``."""
    return {k: MASK if looks_secret(k) and v else v for k, v in options.items()}


def _url_password(value: str) -> str:
    """The password of a URL's user information (``https://user:PASSWORD@host``), '' if none."""
    if "://" not in value or "@" not in value:
        return ""
    try:
        return urlsplit(value).password or ""
    except ValueError:
        return ""


def masked(value: object) -> Any:
    """A JSON-ready copy of a configuration (or any part of it) with every secret masked, a URL's password too
    (the settings that take a URL refuse one, but a refused value is shown in the error)."""
    if isinstance(value, SecretStr):
        return MASK if value.get_secret_value() else ""
    if isinstance(value, str) and (password := _url_password(value)):
        return value.replace(f":{password}@", f":{MASK}@")
    if isinstance(value, BaseModel):
        return {name: masked(getattr(value, name)) for name in type(value).model_fields}
    if isinstance(value, dict):
        return {k: masked(v) for k, v in mask_options(value).items()}
    if isinstance(value, list | tuple):
        return [masked(v) for v in value]
    return value


def _secrets(value: object) -> Iterator[str]:
    if isinstance(value, SecretStr):
        yield value.get_secret_value()
    elif isinstance(value, str):
        yield _url_password(value)
    elif isinstance(value, BaseModel):
        for name in type(value).model_fields:
            yield from _secrets(getattr(value, name))
    elif isinstance(value, dict):
        for k, v in value.items():
            if looks_secret(str(k)) and isinstance(v, str):
                yield v
            else:
                yield from _secrets(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _secrets(v)


def secret_values(config: BaseModel) -> list[str]:
    """Every non-empty secret value in a configuration (for the log redactor)."""
    return sorted({s for s in _secrets(config) if s})


def is_secret_location(model: type[BaseModel], loc: Sequence[int | str]) -> bool:
    """Does a validation error's location point into a secret (a ``Secret`` field or a secret-looking option)?"""
    current: Any = model
    for part in loc:
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(str(part))
            if field is None:
                return False
            current = field.annotation
            if current is SecretStr or "SecretStr" in repr(current):
                return True
        elif isinstance(part, str) and looks_secret(part):
            return True
        else:
            args = getattr(current, "__args__", ())
            current = args[-1] if args else None
    return False
