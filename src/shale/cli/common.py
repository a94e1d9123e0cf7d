"""What the subcommands share: loading the configuration once, turning Shale errors into exit codes, and
reaching the metastore when it can be reached (``bucket cleanup`` and ``bucket repair`` go on without it)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

import click

from shale.config import ShaleConfig, load_config, secret_values
from shale.errors import ShaleError
from shale.logs import redact, setup_logging

if TYPE_CHECKING:
    from shale.metastore import IndexReads, MetastoreClient, MetastoreService

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
    """Print a ShaleError as one clear message and exit with status 1 instead of a traceback; a Ctrl-C that a command
    does not handle itself (``shale.signals``) is one line and exit 130, not a traceback or click's "Aborted!"."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ShaleError as exc:
            raise click.ClickException(redact(str(exc))) from exc
        except KeyboardInterrupt:
            click.echo(f"shale {click.get_current_context().info_name}: interrupted", err=True)
            raise SystemExit(130) from None

    return wrapper  # type: ignore[return-value]


@overload
def reachable_metastore(config: ShaleConfig, *, write: Literal[False]
                        ) -> tuple[IndexReads | None, str]: ...


@overload
def reachable_metastore(config: ShaleConfig, *, write: Literal[True]
                        ) -> tuple[MetastoreService | MetastoreClient | None, str]: ...


def reachable_metastore(config: ShaleConfig, *, write: bool
                        ) -> tuple[IndexReads | None, str]:
    """The metastore, if it can be reached now; else None and why. An embedded metastore is reachable when its
    state file exists: a reader gets the read-only view (``open_index_view``), a writer the embedded service (which
    would otherwise create an empty index that protects nothing)."""
    from shale.errors import RetryableError
    from shale.metastore import open_index_view, open_metastore, remote_client, state_path

    m = config.metastore
    if m.mode == "embedded":
        path = state_path(config)
        if not path.exists():
            return None, f"no embedded metastore state at {path}"
        return open_metastore(config) if write else open_index_view(config), ""
    client = remote_client(m, deadline=min(m.client_deadline, 15.0))  # with the token and CA, as every command
    try:
        client.status()
    except RetryableError as exc:
        client.close()
        return None, str(exc)
    return client, ""
