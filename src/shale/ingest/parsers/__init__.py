"""Parsers of the partition group: built-ins (json, text, msgpack) and any plug-in registered under the
``shale.parsers`` entry point group."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from shale.errors import ConfigError
from shale.ingest.parsers.base import ParseError, Parser, infer_year, to_ms, to_us

ENTRY_POINT_GROUP = "shale.parsers"


def available_parsers() -> dict[str, type[Parser]]:
    found: dict[str, type[Parser]] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        cls = ep.load()
        if isinstance(cls, type) and issubclass(cls, Parser):
            found[ep.name] = cls
    return found


def load_parser(name: str, options: dict[str, Any] | None = None) -> Parser:
    """An instance of the parser registered as ``name``, with its options checked."""
    parsers = available_parsers()
    if name not in parsers:
        raise ConfigError(f"no parser named {name!r}; installed: {', '.join(sorted(parsers)) or 'none'}")
    parser = parsers[name](**(options or {}))
    parser.check()
    return parser


__all__ = ["ParseError", "Parser", "available_parsers", "infer_year", "load_parser", "to_ms", "to_us"]
