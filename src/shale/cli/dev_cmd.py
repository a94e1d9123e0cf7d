"""``shale dev up | down | status``: the local Kafka broker, MinIO server and Spark standalone cluster."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import click

from shale.cli.common import shale_errors

DEFAULT_DIR = ".shale/dev"
DIR_ENV = "SHALE_DEV_DIR"  # exported by `shale dev up --env`: where the stack keeps its state


def _last_up_file() -> Path:
    """Where `shale dev up` notes the folder of the stack it started last (per user), for `status` and `down`
    run from another folder."""
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return base / "shale" / "dev-last-up"


def _candidates(directory: Path | None) -> list[Path]:
    """The folders to look for a stack in: the one given; else ./.shale/dev, $SHALE_DEV_DIR and the last one
    `shale dev up` started."""
    if directory is not None:
        return [directory]
    found = [Path(DEFAULT_DIR)]
    if os.environ.get(DIR_ENV):
        found.append(Path(os.environ[DIR_ENV]))
    with contextlib.suppress(OSError):
        found.append(Path(_last_up_file().read_text().strip()))
    unique: list[Path] = []
    for path in found:
        if path.resolve() not in [p.resolve() for p in unique]:
            unique.append(path)
    return unique


@click.group()
def dev() -> None:
    """Start, inspect and stop the local Kafka broker, MinIO server and Spark standalone cluster."""


_dir_option = click.option("--dir", "directory", default=None, type=click.Path(file_okay=False, path_type=Path),
                           help=f"State and data folder (up: {DEFAULT_DIR}; status and down: that, ${DIR_ENV}, or "
                                "the folder of the last `shale dev up`).")


@dev.command()
@_dir_option
@click.option("--spark-workers", type=click.IntRange(0, 8), default=0, show_default=True,
              help="Also start a Spark standalone master and this many workers (1 core, 1 GiB each).")
@click.option("--schema-registry", is_flag=True, help="Also start a Schema Registry (Apicurio Registry 3.0.9, its "
              "Confluent-compatible API) for the avro parser.")
@click.option("--iceberg-catalog", is_flag=True, help="Also start an Iceberg REST catalog (Apache Iceberg 1.11's "
              "RESTCatalogServer, warehouse in the bucket) and point Shale's [iceberg] at it.")
@click.option("--env", "as_env", is_flag=True, help="Start nothing: print the exports of the running stack, for "
              "eval \"$(shale dev up --env)\" (exit 3 if none runs).")
@shale_errors
def up(directory: Path | None, spark_workers: int, schema_registry: bool, iceberg_catalog: bool,
       as_env: bool) -> None:
    """Start Kafka (KRaft) and MinIO (and Spark, and a registry) on free loopback ports, or add what is asked for
    to the stack already running; print what was done and how to reach them."""
    from shale.dev import DevStack

    if as_env:
        found = _running_stack(directory)
        state = DevStack(found).load()
        assert state is not None
        for line in DevStack(found).exports(state, {DIR_ENV: str(found.resolve())}):
            click.echo(line)
        return
    directory = (directory or Path(DEFAULT_DIR)).resolve()
    if DevStack(directory).load() is None:
        click.echo("starting Kafka and MinIO (the first run fetches them, which takes a few minutes)...")
    state, done = DevStack(directory).up(spark_workers, schema_registry, iceberg_catalog)
    try:
        _last_up_file().parent.mkdir(parents=True, exist_ok=True)
        _last_up_file().write_text(f"{directory}\n")
    except OSError:
        pass  # a read-only home: status and down then need --dir or $SHALE_DEV_DIR
    for line in done:
        click.echo(line)
    click.echo(f"kafka bootstrap servers: {state.kafka_bootstrap}")
    click.echo(f"s3 endpoint:             {state.minio_endpoint} (bucket {state.bucket!r})")
    if state.spark_master:
        click.echo(f"spark master:            {state.spark_master} (status {state.spark_ui})")
    if state.registry_url:
        click.echo(f"schema registry:         {state.registry_url}")
    if state.catalog_url:
        click.echo(f"iceberg rest catalog:    {state.catalog_url}")
    click.echo(f"state:                   {directory}")
    click.echo("point Shale at them with:  eval \"$(shale dev up --env)\"  (it starts nothing), or:")
    for line in DevStack(directory).exports(state, {DIR_ENV: str(directory)}):
        click.echo(f"  {line}")  # a secret's line names its file, never the secret


def _running_stack(directory: Path | None) -> Path:
    """The folder of the stack to report on: the first candidate with a stack; exit 3 naming where it looked."""
    from shale.dev import DevStack

    looked = _candidates(directory)
    found = next((path for path in looked if DevStack(path).load() is not None), None)
    if found is None:
        click.echo("no dev stack found; looked in " + ", ".join(str(p.resolve()) for p in looked)
                   + f" (start one with `shale dev up`, or name its folder with --dir or ${DIR_ENV})", err=True)
        raise SystemExit(3)
    return found


@dev.command()
@_dir_option
def status(directory: Path | None) -> None:
    """Report each service: running and reachable, or not (exit 3 unless all run)."""
    from shale.dev import DevStack

    found = _running_stack(directory)
    stack = DevStack(found)
    state = stack.load()
    running = stack.status(state)
    where = {name: address for name, (_, address) in state.services().items()} if state is not None else {}
    click.echo(f"dev stack in {found.resolve()}")
    for name, ok in running.items():
        click.echo(f"{name:<6} {'running' if ok else 'stopped'} {where.get(name, '')}".rstrip())
    if not all(running.values()):
        raise SystemExit(3)


@dev.command()
@_dir_option
def down(directory: Path | None) -> None:
    """Stop every process `up` started."""
    from shale.dev import DevStack

    looked = _candidates(directory)
    found = next((path for path in looked if DevStack(path).load() is not None), looked[0])
    stopped = DevStack(found).down()
    click.echo(f"stopped: {', '.join(stopped)} ({found.resolve()})" if stopped else
               f"nothing was running (looked in {', '.join(str(p.resolve()) for p in looked)})")
