"""Loading and validating configuration: file, then environment, then ``--set`` flags."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from shale.config.model import ShaleConfig
from shale.config.secrets import MASK, is_secret_location, masked
from shale.errors import ConfigError

ENV_PREFIX = "SHALE_"
_NOT_CONFIG_ENV = {"SHALE_CONFIG", "SHALE_CACHE_DIR"}


def _parse_value(raw: str) -> Any:
    """A TOML value when the text is one (``5``, ``true``, ``["a", "b"]``), else the text itself."""
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def _set_path(tree: dict[str, Any], path: Sequence[str], value: Any, source: str) -> None:
    node = tree
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{source}: {'.'.join(path)} cannot be set because {part!r} is not a section")
        node = child
    node[path[-1]] = value


def parse_override(text: str) -> tuple[list[str], Any]:
    """``section.key=value`` as a key path and a parsed value."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {text!r}: write it as section.key=value, e.g. --set bucket.url=memory://")
    return [p.strip() for p in key.strip().split(".")], _parse_value(raw.strip())


def section(item: Mapping[str, Any]) -> str:
    """The dotted section holding an error's key, for the advice to explain it (``ingest.parsers``)."""
    return ".".join(str(p) for p in item["loc"][:-1] if not isinstance(p, int))


def _format_errors(error: ValidationError, origin: str) -> str:
    lines = [f"invalid configuration ({origin}):"]
    for item in error.errors():
        key = ".".join(str(p) for p in item["loc"])
        if item["type"] == "extra_forbidden":
            explain = f"shale config explain {section(item)}".strip()
            lines.append(f"  {key}: unknown key; check its spelling against `{explain}`")
            continue
        if item["type"] == "parser_options":  # each option's own error, under the rule's path
            rule = ".".join(str(p) for p in item["loc"][:-1])
            lines.extend(f"  {rule}.{line}" for line in item["ctx"]["lines"])
            continue
        message = item["msg"].removeprefix("Value error, ")
        shown = MASK if is_secret_location(ShaleConfig, item["loc"]) else masked(item.get("input"))
        lines.append(f"  {key} = {shown!r}: {message}")
    return "\n".join(lines)


def load_config(
    path: Path | str | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Sequence[str] = (),
) -> ShaleConfig:
    """Load, merge and validate the configuration; raise ``ConfigError`` naming every bad key."""
    env = os.environ if env is None else env
    tree: dict[str, Any] = {}
    origin = "embedded defaults"
    if path is None and env.get("SHALE_CONFIG"):
        path = env["SHALE_CONFIG"]
    if path is None and Path("shale.toml").exists():
        path = "shale.toml"
    if path is not None:
        file = Path(path)
        try:
            tree = tomllib.loads(file.read_text())
        except FileNotFoundError as exc:
            raise ConfigError(f"config file {file} does not exist; pass an existing file to --config") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {file} is not valid TOML: {exc}") from exc
        origin = str(file)
    for name, raw in sorted(env.items()):
        if name.startswith(ENV_PREFIX) and name not in _NOT_CONFIG_ENV and "__" in name:
            parts = [p.lower() for p in name[len(ENV_PREFIX) :].split("__")]
            _set_path(tree, parts, _parse_value(raw), f"environment variable {name}")
            origin += f" + ${name}"
    for text in overrides:
        parts, value = parse_override(text)
        _set_path(tree, parts, value, f"--set {text}")
        origin += f" + --set {'.'.join(parts)}"
    try:
        return ShaleConfig.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc, origin)) from None
