"""``shale shards set``: change an ingest group's shard count while its drivers run (docs/DESIGN.md 10.7)."""

from __future__ import annotations

import logging

import click

from shale.cli.common import get_config, shale_errors

log = logging.getLogger(__name__)


@click.group()
def shards() -> None:
    """The shards of an ingest group: which driver reads which topic-partitions."""


@shards.command("set")
@click.option("--group", type=click.Choice(["backup", "partition"]), required=True)
@click.option("--count", type=click.IntRange(1, 1024), required=True, help="The new number of shards.")
@click.option("--generation", type=int, help="Default: ingest.generation.")
@click.pass_context
@shale_errors
def set_count(ctx: click.Context, group: str, count: int, generation: int | None) -> None:
    """Change the group's shard count online (needs admin). Every driver's lease of the old map stops holding its
    shard at once: each drops the batch it has not committed and acquires a shard of the new map; a partition that
    moved resumes at its committed offset. Run at least COUNT drivers of the group (any number of them may be
    standbys); set ingest.shards to COUNT too, for drivers that start a group from nothing. A group whose drivers
    run with ingest.shards = auto sets its own count (one shard per live driver): their heartbeats drop shards
    nobody holds."""
    from shale.metastore import SetIngestShards, open_metastore

    config = get_config(ctx)
    gen = config.ingest.generation if generation is None else generation
    result = open_metastore(config).submit(SetIngestShards(group=group, generation=gen, shards=count))
    data = result.raise_for_rejection().data
    if not data["changed"]:
        click.echo(f"{group} generation {gen} already has {count} shard(s) (map version {data['version']})")
        return
    log.warning("ingest shard count changed", extra={"group": group, "generation": gen, "shards": count,
                                                      "previous": data["previous"], "version": data["version"]})
    click.echo(f"{group} generation {gen}: {data['previous'] or 1} -> {count} shard(s) (map version "
               f"{data['version']}); drivers acquire shards of the new map now")
