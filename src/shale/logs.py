"""Structured logging: ``key=value`` text for people, one JSON object per line for machines.

Pass context as ``extra``: ``log.info("block written", extra={"tenant": t, "block": id})``. Every extra field
appears in both formats, so the tenant, block and job ids are in every line that concerns them.

As a last line of defence, both formats replace every registered secret (the configuration's secrets, API
tokens) by ``***``: in every string of the message's arguments and the extra fields before they are written out
(a dict's ``str`` or JSON escapes a quote, a backslash or a non-ASCII letter, which would hide the secret), then in
the finished line, tracebacks included. Secrets should never be logged in the first place.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Iterable
from typing import Any

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime", "taskName"}
# Shorter values are not redacted: replacing every "ab" in every line would garble the logs and protect nothing.
MIN_REDACTED_LENGTH = 4
_secrets: tuple[str, ...] = ()
_secrets_lock = threading.Lock()


def register_secrets(values: Iterable[str]) -> None:
    """Redact these values from every log line this process writes from now on."""
    global _secrets
    with _secrets_lock:
        merged = set(_secrets) | {v for v in values if len(v) >= MIN_REDACTED_LENGTH}
        _secrets = tuple(sorted(merged, key=len, reverse=True))


def redact(text: str) -> str:
    """``text`` with every registered secret replaced by ``***`` (longest first, so no secret leaks a part)."""
    for secret in _secrets:
        if secret in text:
            text = text.replace(secret, "***")
    return text


def _scrubbed(value: Any) -> Any:
    """``value`` with every string in it redacted, nested ones too: once a dict or a list is written out (``str``,
    JSON), a secret holding a quote, a backslash or a non-ASCII letter is escaped and no longer found by ``redact``."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {_scrubbed(k): _scrubbed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrubbed(v) for v in value]
    if type(value) is tuple:  # a named tuple keeps its own str (a secret in one is caught in the finished line)
        return tuple(_scrubbed(v) for v in value)
    return value


def _message(record: logging.LogRecord) -> str:
    """The record's message, its arguments redacted before they are formatted into it."""
    if not record.args or not _secrets:
        return record.getMessage()
    try:
        return str(str(record.msg) % _scrubbed(record.args))
    except (TypeError, ValueError):
        return record.getMessage()


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: _scrubbed(v) for k, v in record.__dict__.items() if k not in _STANDARD and not k.startswith("_")}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": _message(record),
        }
        entry.update(_fields(record))
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        # Redacted before encoding too: JSON escapes quotes and backslashes, which would hide such a secret.
        return redact(json.dumps({k: redact(v) if isinstance(v, str) else v for k, v in entry.items()},
                                 default=lambda v: redact(str(v))))


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%H:%M:%S", time.localtime(record.created))
        extra = " ".join(f"{k}={v}" for k, v in _fields(record).items())
        line = f"{ts} {record.levelname:<7} {record.name}: {_message(record)}" + (f" {extra}" if extra else "")
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return redact(line)


def setup_logging(level: str = "INFO", fmt: str = "text", secrets: Iterable[str] = ()) -> None:
    """Configure the root logger once for a Shale process (CLI commands and services call this). ``secrets`` are
    redacted from every line."""
    register_secrets(secrets)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("py4j", "urllib3", "httpx", "httpcore", "pysyncobj", "uvicorn.access", "shale.kafka.librdkafka"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLevelName(level)))
