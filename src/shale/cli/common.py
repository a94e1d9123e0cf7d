"""What every subcommand shares: loading the configuration once, and turning Shale errors into exit codes."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click

from shale.config import ShaleConfig, load_config, secret_values
from shale.errors import ShaleError
from shale.logs import redact, setup_logging

F = TypeVar("F", bound=Callable[..., Any])


def get_config(ctx: click.Context) -> ShaleConfig:
    """The configuration for this invocation (validated once, cached on the root context)."""
    root = ctx.find_root()
    if "config" not in root.obj:
        root.obj["config"] = load_config(root.obj["config_path"], overrides=root.obj["overrides"])
        config: ShaleConfig = root.obj["config"]
        setup_logging(config.logging.level, root.obj["log_format"] or config.logging.format, secret_values(config))
    result: ShaleConfig = root.obj["config"]
    return result


def shale_errors(fn: F) -> F:
    """Print a ShaleError as one clear message and exit with status 1 instead of a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ShaleError as exc:
            raise click.ClickException(redact(str(exc))) from exc

    return wrapper  # type: ignore[return-value]
