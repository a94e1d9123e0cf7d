"""``shale run``: the whole single-machine deployment, supervised."""

from __future__ import annotations

from pathlib import Path

import click

from shale.cli.common import get_config, shale_errors


@click.command()
@click.option("--log-dir", type=click.Path(file_okay=False, path_type=Path), default=Path(".shale/logs"),
              show_default=True, help="Each process's log.")
@click.pass_context
@shale_errors
def run(ctx: click.Context, log_dir: Path) -> None:
    """Start the metastore (with the status page), both ingest groups and a compaction worker (or what
    run.services lists); stop them all cleanly on SIGTERM or Ctrl-C."""
    from shale.launcher import run_deployment

    config = get_config(ctx)
    root = ctx.find_root().obj
    base = (["--config", root["config_path"]] if root["config_path"] else [])
    for override in root["overrides"]:
        base += ["--set", override]
    base += ["--log-format", root["log_format"] or config.logging.format]
    run_deployment(config, base, log_dir)
