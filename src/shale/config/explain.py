"""The configuration reference, from the models themselves: ``shale config explain`` and docs/CONFIG.md.

Every field of every section (and of the list-of-table rules: ``[[ingest.parsers]]``, ``[[ingest.tenants]]``,
``[[metastore.members]]``) is listed with its type, default and one line of meaning; each installed parser's
options model follows ``ingest.parsers``. tests/unit/config/test_reference.py checks docs/CONFIG.md against it.
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from shale.config import parsers
from shale.config.model import ShaleConfig
from shale.config.secrets import masked
from shale.config.types import check_regex, format_duration, format_size, parse_duration, parse_size

_VALIDATED = {parse_duration: "duration ('250ms', '30s', '15m', '6h', '7d')",
              parse_size: "size ('512KiB', '64MiB', '1GB')", check_regex: "regex",
              parsers.check_time_format: "time format (iso8601, epoch_ms, epoch_s, "
              "epoch_us or a strftime pattern)", parsers.check_strftime: "strftime pattern ('%Y-%m-%d %H:%M:%S')",
              parsers.check_timezone: "IANA time zone"}

# Defaults are shown as they are written in shale.toml ("15m", "64MiB"), not as the seconds and bytes they parse to.
_SPELLED: dict[Any, Callable[[Any], str]] = {parse_duration: format_duration, parse_size: format_size}


@dataclass(frozen=True)
class Entry:
    key: str
    type: str
    default: str
    meaning: str


def _validator(annotation: Any, metadata: list[Any] | None = None) -> Any:
    """The value parser of a field (``parse_duration``, ``parse_size``, ...), optional fields included; else None."""
    for item in metadata or []:
        func = getattr(item, "func", None)
        if func in _VALIDATED:
            return func
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _validator(args[0], list(args[1:]))
    if origin in (typing.Union, types.UnionType):
        found = {_validator(a) for a in args if a is not type(None)}
        return found.pop() if len(found) == 1 else None
    return None


def type_name(annotation: Any, metadata: list[Any] | None = None) -> str:
    for item in metadata or []:
        func = getattr(item, "func", None)
        if func in _VALIDATED:
            return _VALIDATED[func]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return type_name(args[0], list(args[1:]))
    if origin is Literal:
        return "one of " + ", ".join(str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        return " or ".join(type_name(a) for a in rest) + (" (optional)" if len(rest) < len(args) else "")
    if origin is list:
        inner = args[0] if args else Any
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            return "list of tables"
        return f"list of {type_name(inner)}"
    if origin is dict:
        return f"table of {type_name(args[1])}" if args else "table"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    if getattr(annotation, "__name__", "") == "SecretStr":
        return "secret"
    return {str: "string", int: "integer", float: "number", bool: "boolean", object: "any"}.get(
        annotation, getattr(annotation, "__name__", str(annotation)))


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "(required)"
    value = masked(field.get_default(call_default_factory=True))
    spell = _SPELLED.get(_validator(field.annotation, field.metadata))
    if spell is not None and isinstance(value, int | float) and not isinstance(value, bool):
        value = spell(value)
    return json.dumps(value, default=str)


def _meaning(field: FieldInfo, model: type[BaseModel]) -> str:
    text = field.description or ""
    annotation = field.annotation
    nested = _nested(annotation)
    if not text and nested is not None:
        text = (nested.__doc__ or "").strip().split("\n\n")[0]
    return " ".join(text.split())


def _nested(annotation: Any) -> type[BaseModel] | None:
    """The model of a section or of a list of tables, else None."""
    if typing.get_origin(annotation) is list:
        annotation = (typing.get_args(annotation) or [None])[0]
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def entries(model: type[BaseModel], prefix: str = "") -> Iterator[Entry]:
    """Every field of ``model`` and its sections, depth first, with its dotted key."""
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        nested = _nested(field.annotation)
        yield Entry(key, type_name(field.annotation, field.metadata), _default(field) if nested is None or
                    typing.get_origin(field.annotation) is list else "", _meaning(field, model))
        if nested is not None:
            yield from entries(nested, f"{key}.")
        if key == "ingest.parsers":
            for parser in parsers.installed_parsers():
                yield Entry(f"{key}.options ({parser})", "table", "{}",
                            f"options of parser = \"{parser}\"")
                yield from entries(parsers.options_model(parser), f"{key}.options.")


def explain_key(key: str = "") -> list[Entry]:
    """The entries under ``key`` (a section, a rule list or one field); ValueError if there are none."""
    found = [e for e in entries(ShaleConfig) if not key or e.key == key or e.key.startswith(key + ".")
             or e.key.startswith(key + " (")]
    if not found:
        sections = sorted(ShaleConfig.model_fields)
        raise ValueError(f"no configuration key {key!r}; sections: {', '.join(sections)}")
    return found


def render_text(found: list[Entry]) -> str:
    width = max(len(e.key) for e in found)
    return "\n".join(f"{e.key:<{width}}  {e.type}" + (f"  {_shown(e.default)}" if e.default else "")
                     + (f"\n{'':<{width}}  {e.meaning}" if e.meaning else "") for e in found)


def _shown(default: str) -> str:
    return "required" if default == "(required)" else f"default {default}"


def render_markdown() -> str:
    """docs/CONFIG.md."""
    lines = ["# Configuration reference", "",
             "Generated from the configuration models by `shale config explain --markdown`; "
             "tests/unit/config/test_reference.py fails when this file and the models differ. Keys are written in",
             "`shale.toml` (`[section]`, `[[ingest.parsers]]`), as `SHALE_SECTION__KEY` environment variables, or",
             "with `--set section.key=value`; `shale config check` refuses an unknown key or a bad value.", ""]
    section = None
    for e in entries(ShaleConfig):
        top = e.key.split(".")[0]
        if top != section:
            section = top
            lines += ["", f"## `{top}`", "", "| key | type | default | meaning |", "|---|---|---|---|"]
        if e.key == top and e.type == "section":
            continue
        cell = e.meaning.replace("|", "\\|")
        default = e.default.replace("|", "\\|")
        lines.append(f"| `{e.key}` | {e.type} | {f'`{default}`' if default else ''} | {cell} |")
    return "\n".join(lines) + "\n"
