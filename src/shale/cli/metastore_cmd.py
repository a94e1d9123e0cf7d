"""``shale metastore serve | status | rebuild | snapshot | restore | token create``."""

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
    from shale.metastore import MetastoreNode, read_only_index, state_path
    from shale.web import mount

    config = get_config(ctx)
    node = MetastoreNode(config)
    # Runs even when iceberg.enabled is false: it then trims the change feed so that it never grows.
    publisher = IcebergPublisher(config, node.state.reader, node.service.submit, node.bucket)
    node.tasks.append(("iceberg-publisher", lambda stop: publisher.loop(stop, node.is_leader)))
    mount_sync(node.app, publisher, node.is_leader)
    # The page reads the node's state through a read-only view; the node's role comes from its log.
    mount(node.app, read_only_index(state_path(config)), node.service.status, node.bucket, config,
          lambda: node.maintenance.partial_blocks, publisher.status, lambda: node.maintenance.overlaps)
    node.serve()


@metastore.command()
@click.pass_context
@shale_errors
def status(ctx: click.Context) -> None:
    """Print the metastore's status: role, leader, term, applied index, blocks."""
    from shale.metastore import open_index_view

    click.echo(json.dumps(open_index_view(get_config(ctx)).status(), indent=2))


@metastore.command()
@click.option("--from-bucket", "from_bucket", is_flag=True, required=True, help="Rebuild from the bucket's blocks.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="New state file to write (install it with `shale metastore restore`).")
@click.pass_context
@shale_errors
def rebuild(ctx: click.Context, from_bucket: bool, out: Path) -> None:
    """Rebuild the index, tombstones and committed offsets from the bucket alone."""
    from shale.metastore import rebuild_from_bucket
    from shale.objstore import open_bucket

    report = rebuild_from_bucket(open_bucket(get_config(ctx).bucket), out)
    click.echo(f"rebuilt {out}: {report.tenants} tenants, {report.blocks} blocks, {report.tombstones} tombstones, "
               f"{report.offsets} committed offsets")
    for block_id in report.recovered:
        click.echo(f"recovered {block_id}: its meta.json was lost; rebuilt from its objects' footers")
    for block_id, why in report.excluded:
        click.echo(f"left out {block_id}: {why}")


@metastore.command()
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True)
@click.pass_context
@shale_errors
def snapshot(ctx: click.Context, out: Path) -> None:
    """Write a consistent copy of the state (from a running node, with an admin token, or the local embedded
    state)."""
    from shale.metastore import open_index_view

    open_index_view(get_config(ctx)).snapshot(out)  # the embedded state, or a node's (with an admin token)
    click.echo(f"snapshot written to {out}")


@metastore.command()
@click.option("--from", "source", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True)
@click.pass_context
@shale_errors
def restore(ctx: click.Context, source: Path) -> None:
    """Install a snapshot or rebuilt state into this node's data dir. The node must be stopped; in a Raft
    cluster, restore one node and let the others catch up from it, or restore every node from one file."""
    from shale.metastore import restore_file, state_path

    config = get_config(ctx)
    target = state_path(config)
    target.parent.mkdir(parents=True, exist_ok=True)
    raft_dir = Path(config.metastore.data_dir) / "raft"
    if raft_dir.exists():
        shutil.rmtree(raft_dir)  # the old journal describes the old state
    restore_file(source, target)
    click.echo(f"restored {target} from {source}")


@metastore.group()
def token() -> None:
    """Issue API tokens (DESIGN 9.6: roles and scopes)."""


@token.command("create")
@click.option("--name", required=True, help="Names the caller in logs and in 403 answers, e.g. grafana.")
@click.option("--role", type=click.Choice(["admin", "ingest", "compactor", "reader"]), required=True)
@click.option("--group", "groups", multiple=True, help="ingest: a group it may commit (repeatable; * for any).")
@click.option("--tenant", "tenants", multiple=True, help="reader: a tenant it may read (repeatable; * for all).")
@click.option("--tokens-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The file to add the token to (default: metastore.tokens_file).")
@click.pass_context
@shale_errors
def create(ctx: click.Context, name: str, role: str, groups: tuple[str, ...], tenants: tuple[str, ...],
           tokens_file: Path | None) -> None:
    """Add a token to the tokens file (only its SHA-256 digest is stored) and print the token, once. Running
    metastores pick the change up within seconds; delete the entry to revoke it."""
    from pydantic import ValidationError

    from shale.errors import ConfigError
    from shale.metastore.api import auth

    path = tokens_file or Path(get_config(ctx).metastore.tokens_file or "")
    if not str(path) or str(path) == ".":
        raise ConfigError("give --tokens-file or set metastore.tokens_file")
    existing = auth.load_tokens(path) if path.exists() else []
    if any(e.name == name for e in existing):
        raise ConfigError(f"{path} already has a token named {name!r}; delete its entry first to replace it")
    secret = auth.new_token()
    try:
        entry = auth.TokenEntry(name=name, role=role, groups=list(groups), tenants=list(tenants),  # type: ignore[arg-type]
                                sha256=auth.digest(secret))
    except ValidationError as exc:
        raise ConfigError(f"token {name!r}: {exc.errors()[0]['msg'].removeprefix('Value error, ')}") from None
    text = "".join(auth.format_entry(e) + "\n" for e in [*existing, entry])
    auth.write_private(path, "# Shale metastore API tokens: SHA-256 digests only (DESIGN 9.6).\n\n" + text)
    click.echo(secret)
    click.echo(f"added token {name!r} ({role}) to {path}; the token above is shown only this once", err=True)
