"""Parsers of the partition group: built-ins (json, text, msgpack) and any plug-in registered under the
``shale.parsers`` entry point group."""

from __future__ import annotations

from typing import Any

from shale.config import parser_entry_points
from shale.encoder.parsers.base import BatchParse, ParseError, Parser, infer_year, to_ms, to_us
from shale.errors import ConfigError


def available_parsers() -> dict[str, type[Parser]]:
    found: dict[str, type[Parser]] = {}
    for ep in parser_entry_points().values():
        cls = ep.load()
        if isinstance(cls, type) and issubclass(cls, Parser):
            found[ep.name] = cls
    return found


def load_parser(name: str, options: dict[str, Any] | None = None) -> Parser:
    """An instance of the parser registered as ``name``, with its options checked."""
    # Only the named entry point is loaded: a task that parses JSON does not import the registry parsers'
    # libraries (protobuf, jsonschema_rs), which cost tens of milliseconds per task.
    named = parser_entry_points().get(name)
    cls = named.load() if named is not None else None
    if not (isinstance(cls, type) and issubclass(cls, Parser)):
        installed = sorted(available_parsers())
        raise ConfigError(f"no parser named {name!r}; installed: {', '.join(installed) or 'none'}")
    parser = cls(**(options or {}))
    parser.check()
    return parser


__all__ = ["BatchParse", "ParseError", "Parser", "available_parsers", "infer_year", "load_parser", "to_ms", "to_us"]
