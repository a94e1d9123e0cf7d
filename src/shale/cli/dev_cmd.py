"""``shale dev up | down | status``: the local Kafka broker and MinIO server for development."""

from __future__ import annotations

from pathlib import Path

import click

from shale.cli.common import shale_errors

DEFAULT_DIR = ".shale/dev"


@click.group()
def dev() -> None:
    """Start, inspect and stop the local Kafka broker and MinIO server."""


_dir_option = click.option("--dir", "directory", default=DEFAULT_DIR, show_default=True,
                           type=click.Path(file_okay=False, path_type=Path), help="State and data folder.")


@dev.command()
@_dir_option
@shale_errors
def up(directory: Path) -> None:
    """Start Kafka (KRaft) and MinIO on free loopback ports; print how to reach them."""
    from shale.dev import DevStack

    click.echo("starting Kafka and MinIO (the first run fetches them, which takes a few minutes)...")
    state = DevStack(directory).up()
    click.echo(f"kafka bootstrap servers: {state.kafka_bootstrap}")
    click.echo(f"s3 endpoint:             {state.minio_endpoint} (bucket {state.bucket!r})")
    click.echo("point Shale at them with:")
    for key, value in state.env().items():
        click.echo(f"  export {key}={value}")


@dev.command()
@_dir_option
def status(directory: Path) -> None:
    """Report each service: running and reachable, or not."""
    from shale.dev import DevStack

    stack = DevStack(directory)
    state = stack.load()
    for name, ok in stack.status(state).items():
        where = ""
        if state is not None:
            where = state.kafka_bootstrap if name == "kafka" else state.minio_endpoint
        click.echo(f"{name:<6} {'running' if ok else 'stopped'} {where}".rstrip())
    if not all(stack.status(state).values()):
        raise SystemExit(3)


@dev.command()
@_dir_option
def down(directory: Path) -> None:
    """Stop every process `up` started."""
    from shale.dev import DevStack

    stopped = DevStack(directory).down()
    click.echo(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")
