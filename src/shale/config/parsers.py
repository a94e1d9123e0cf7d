"""Parser options as typed models, checked when the configuration loads (not when the first record arrives).

Each parser of the partition group declares its options as a subclass of ``ParserOptions`` (its ``options_model``
class attribute), next to the parser itself; ``[[ingest.parsers]]`` rules are validated against the model of the
parser they name, found through the ``shale.parsers`` entry points. Adding a parser is one place: its module, with
its options model, and its entry point. ``shale config explain ingest.parsers`` and docs/CONFIG.md are generated
from the same models (tests/unit/config/test_reference.py keeps the document true).
"""

from __future__ import annotations

import functools
import re
import zoneinfo
from collections.abc import Sequence
from importlib.metadata import EntryPoint, entry_points
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict

from shale.config.types import check_regex

ENTRY_POINT_GROUP = "shale.parsers"
NAMED_TIME_FORMATS = ("iso8601", "epoch_ms", "epoch_s", "epoch_us")
# strptime's directives: a pattern naming another one would fail on every record, so it fails here.
_DIRECTIVES = set("aAbBcdfGHIjmMpSuUVwWxXyYzZ%")
_DIRECTIVE_RE = re.compile(r"%(.?)", re.DOTALL)


def check_strftime(value: str) -> str:
    """A strftime/strptime pattern: at least one directive, and only directives strptime knows."""
    found = _DIRECTIVE_RE.findall(value)
    if not found:
        raise ValueError(f"{value!r} is not a strftime pattern (no % directive), e.g. '%Y-%m-%d %H:%M:%S'")
    bad = sorted({f"%{d}" for d in found if d not in _DIRECTIVES or not d})
    if bad:
        raise ValueError(f"{value!r} uses unknown strftime directives {', '.join(bad)}")
    return value


def check_time_format(value: str) -> str:
    """One of the named formats, or a strftime pattern."""
    if value in NAMED_TIME_FORMATS or "%" in value:
        return value if value in NAMED_TIME_FORMATS else check_strftime(value)
    raise ValueError(f"{value!r} is not a time format; use one of {', '.join(NAMED_TIME_FORMATS)} or a strftime "
                     "pattern such as '%Y-%m-%d %H:%M:%S'")


def check_timezone(value: str) -> str:
    if value == "UTC":
        return value
    try:
        zoneinfo.ZoneInfo(value)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"{value!r} is not a time zone; use an IANA name such as 'UTC' or 'Europe/Paris'") from None
    return value


TimeFormat = Annotated[str, AfterValidator(check_time_format)]
"""iso8601, epoch_ms, epoch_s, epoch_us, or a strftime pattern."""

StrftimeFormat = Annotated[str, AfterValidator(check_strftime)]
"""A strftime pattern such as ``%Y-%m-%d %H:%M:%S``."""

TimeZone = Annotated[str, AfterValidator(check_timezone)]
"""An IANA time zone name."""

Pattern = Annotated[str, AfterValidator(check_regex)]
"""A Python regular expression."""


class ParserOptions(BaseModel):
    """A parser's options: unknown keys are errors, every field has a type, a default (or is required) and a
    description (``shale config explain ingest.parsers`` prints them)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@functools.cache
def parser_entry_points() -> dict[str, EntryPoint]:
    """The installed parsers' entry points by name, read once per process: reading them scans every installed
    distribution's metadata (milliseconds), and every Spark task checks its configuration and loads its parser."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def installed_parsers() -> list[str]:
    return sorted(parser_entry_points())


def options_model(name: str) -> type[ParserOptions]:
    """The options model of the parser registered as ``name``; ValueError naming the installed ones."""
    ep = parser_entry_points().get(name)
    if ep is not None:
        model = getattr(ep.load(), "options_model", ParserOptions)
        if not (isinstance(model, type) and issubclass(model, ParserOptions)):
            raise ValueError(f"parser {name!r} declares no ParserOptions model")
        return model
    raise ValueError(f"unknown parser {name!r}; installed parsers: {', '.join(installed_parsers()) or 'none'}")


def describe_errors(errors: Sequence[Any], prefix: str, model: type[BaseModel] | None = None) -> list[str]:
    """One line per pydantic error: the option's path under ``prefix``, the value, what is wrong and allowed."""
    lines = []
    for item in errors:
        key = ".".join([prefix, *(str(p) for p in item["loc"])]) if prefix else ".".join(map(str, item["loc"]))
        if item["type"] == "extra_forbidden":
            allowed = f"; options: {', '.join(model.model_fields)}" if model is not None else ""
            lines.append(f"{key}: unknown option{allowed}")
        elif item["type"] == "missing":
            lines.append(f"{key} is required")
        else:
            lines.append(f"{key} = {item['input']!r}: {item['msg'].removeprefix('Value error, ')}")
    return lines
