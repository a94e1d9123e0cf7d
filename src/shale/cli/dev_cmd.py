"""``shale dev up | down | status``: the local Kafka broker, MinIO server and Spark standalone cluster."""

from __future__ import annotations

import shlex
from pathlib import Path

import click

from shale.cli.common import shale_errors

DEFAULT_DIR = ".shale/dev"


@click.group()
def dev() -> None:
    """Start, inspect and stop the local Kafka broker, MinIO server and Spark standalone cluster."""


_dir_option = click.option("--dir", "directory", default=DEFAULT_DIR, show_default=True,
                           type=click.Path(file_okay=False, path_type=Path), help="State and data folder.")


@dev.command()
@_dir_option
@click.option("--spark-workers", type=click.IntRange(0, 8), default=0, show_default=True,
              help="Also start a Spark standalone master and this many workers (1 core, 1 GiB each).")
@shale_errors
def up(directory: Path, spark_workers: int) -> None:
    """Start Kafka (KRaft) and MinIO (and Spark) on free loopback ports; print how to reach them."""
    from shale.dev import DevStack

    spark = f" and a Spark master with {spark_workers} workers" if spark_workers else ""
    click.echo(f"starting Kafka, MinIO{spark} (the first run fetches them, which takes a few minutes)...")
    state = DevStack(directory).up(spark_workers)
    click.echo(f"kafka bootstrap servers: {state.kafka_bootstrap}")
    click.echo(f"s3 endpoint:             {state.minio_endpoint} (bucket {state.bucket!r})")
    if state.spark_master:
        click.echo(f"spark master:            {state.spark_master} (status {state.spark_ui})")
    click.echo("point Shale at them with:")
    for key, value in state.env().items():
        click.echo(f"  export {key}={shlex.quote(value)}")


@dev.command()
@_dir_option
def status(directory: Path) -> None:
    """Report each service: running and reachable, or not."""
    from shale.dev import DevStack

    stack = DevStack(directory)
    state = stack.load()
    running = stack.status(state)
    where = {name: address for name, (_, address) in state.services().items()} if state is not None else {}
    for name, ok in running.items():
        click.echo(f"{name:<6} {'running' if ok else 'stopped'} {where.get(name, '')}".rstrip())
    if not all(running.values()):
        raise SystemExit(3)


@dev.command()
@_dir_option
def down(directory: Path) -> None:
    """Stop every process `up` started."""
    from shale.dev import DevStack

    stopped = DevStack(directory).down()
    click.echo(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")
