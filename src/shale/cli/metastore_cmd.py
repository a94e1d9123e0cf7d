"""``shale metastore serve | status | rebuild | snapshot | restore``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import click

from shale.cli.common import get_config, shale_errors


@click.group()
def metastore() -> None:
    """Run and administer the metastore (the replicated metadata index)."""


@metastore.command()
@click.pass_context
@shale_errors
def serve(ctx: click.Context) -> None:
    """Serve one metastore node (single node, or a Raft member when metastore.raft_address is set)."""
    from shale.iceberg import IcebergPublisher, mount_sync
    from shale.metastore.server import MetastoreNode
    from shale.web import mount

    config = get_config(ctx)
    node = MetastoreNode(config)
    # Runs even when iceberg.enabled is false: it then trims the change feed so that it never grows.
    publisher = IcebergPublisher(config, node.state.reader, node.service.submit, node.bucket)
    node.tasks.append(("iceberg-publisher", lambda stop: publisher.loop(stop, node.is_leader)))
    mount_sync(node.app, publisher, node.is_leader)
    mount(node.app, node.service, node.bucket, config, lambda: node.maintenance.partial_blocks, publisher.status)
    node.serve()


@metastore.command()
@click.pass_context
@shale_errors
def status(ctx: click.Context) -> None:
    """Print the metastore's status: role, leader, term, applied index, blocks."""
    from shale.metastore import open_metastore

    click.echo(json.dumps(open_metastore(get_config(ctx)).status(), indent=2))


@metastore.command()
@click.option("--from-bucket", "from_bucket", is_flag=True, required=True, help="Rebuild from the bucket's blocks.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="New state file to write (install it with `shale metastore restore`).")
@click.pass_context
@shale_errors
def rebuild(ctx: click.Context, from_bucket: bool, out: Path) -> None:
    """Rebuild the index, tombstones and committed offsets from the bucket alone."""
    from shale.metastore.rebuild import rebuild_from_bucket
    from shale.objstore import open_bucket

    report = rebuild_from_bucket(open_bucket(get_config(ctx).bucket), out)
    click.echo(f"rebuilt {out}: {report.tenants} tenants, {report.blocks} blocks, {report.tombstones} tombstones, "
               f"{report.offsets} committed offsets")
    for block_id, why in report.excluded:
        click.echo(f"left out {block_id}: {why}")


@metastore.command()
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True)
@click.pass_context
@shale_errors
def snapshot(ctx: click.Context, out: Path) -> None:
    """Write a consistent copy of the state (from the running leader, or the local embedded state)."""
    import httpx

    from shale.metastore.fsm import StateMachine
    from shale.metastore.server import state_path

    config = get_config(ctx)
    if config.metastore.mode == "embedded":
        StateMachine(state_path(config)).backup_to(out)
    else:
        with httpx.stream("GET", config.metastore.addresses[0].rstrip("/") + "/v1/snapshot", timeout=300) as r:
            r.raise_for_status()
            with open(out, "wb") as f:
                for chunk in r.iter_bytes():
                    f.write(chunk)
    click.echo(f"snapshot written to {out}")


@metastore.command()
@click.option("--from", "source", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True)
@click.pass_context
@shale_errors
def restore(ctx: click.Context, source: Path) -> None:
    """Install a snapshot or rebuilt state into this node's data dir. The node must be stopped; in a Raft
    cluster, restore one node and let the others catch up from it, or restore every node from one file."""
    from shale.metastore.fsm import restore_file
    from shale.metastore.server import state_path

    config = get_config(ctx)
    target = state_path(config)
    target.parent.mkdir(parents=True, exist_ok=True)
    raft_dir = Path(config.metastore.data_dir) / "raft"
    if raft_dir.exists():
        shutil.rmtree(raft_dir)  # the old journal describes the old state
    restore_file(source, target)
    click.echo(f"restored {target} from {source}")
