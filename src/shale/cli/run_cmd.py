"""``shale run``: the whole single-machine deployment, supervised."""

from __future__ import annotations

import logging
from pathlib import Path

import click

from shale.cli.common import get_config, shale_errors

log = logging.getLogger(__name__)


@click.command()
@click.option("--log-dir", type=click.Path(file_okay=False, path_type=Path), default=Path(".shale/logs"),
              show_default=True, help="Each process's log.")
@click.pass_context
@shale_errors
def run(ctx: click.Context, log_dir: Path) -> None:
    """Start the metastore (with the status page), both ingest groups and a compaction worker (or what
    run.services lists); stop them all cleanly on SIGTERM or Ctrl-C."""
    from shale.config import ShaleConfig, is_secret_location, parse_override
    from shale.launcher import run_deployment

    config = get_config(ctx)
    root = ctx.find_root().obj
    base = (["--config", root["config_path"]] if root["config_path"] else [])
    secret_env: dict[str, str] = {}
    for override in root["overrides"]:
        path, _ = parse_override(override)
        if is_secret_location(ShaleConfig, path):
            # Visible in this command line already, but not passed on to the children's.
            log.warning("a secret was given with --set, where `ps` shows it: give it through the environment "
                        "or the config file instead", extra={"key": ".".join(path)})
            secret_env["SHALE_" + "__".join(p.upper() for p in path)] = override.partition("=")[2].strip()
            continue
        base += ["--set", override]
    base += ["--log-format", root["log_format"] or config.logging.format]
    run_deployment(config, base, log_dir, secret_env)
