"""``shale reprocess``, ``shale generation switch``, ``shale trace`` and ``shale locate``."""

from __future__ import annotations

import json
from dataclasses import asdict

import click

from shale.cli.common import get_config, shale_errors


def _options(pairs: tuple[str, ...]) -> dict[str, object]:
    from shale.config import parse_override

    out: dict[str, object] = {}
    for pair in pairs:
        path, value = parse_override(pair)
        out[".".join(path)] = value
    return out


@click.command()
@click.option("--tenant", required=True)
@click.option("--topic", required=True)
@click.option("--from", "start", required=True, help="Kafka record time: now, -2d, 2026-11-22, ISO, epoch ms")
@click.option("--to", "end", default="now", show_default=True)
@click.option("--parser", required=True, help="Parser name (shale.parsers entry point).")
@click.option("--parser-option", "parser_options", multiple=True, metavar="KEY=VALUE",
              help='A parser option, e.g. --parser-option time_field=\\"ts\\" (TOML values).')
@click.option("--schema-id", type=click.IntRange(min=1), default=None,
              help="Read every record as this Schema Registry schema id (avro, protobuf, json_schema parsers).")
@click.option("--schema-subject", default="", help="With --schema-version: the reader schema by subject.")
@click.option("--schema-version", default="", help="With --schema-subject: a version number or 'latest'.")
@click.option("--generation", type=int, required=True, help="The new generation to write.")
@click.option("--from-generation", type=int, default=1, show_default=True, help="Backup generation to read.")
@click.pass_context
@shale_errors
def reprocess(ctx: click.Context, tenant: str, topic: str, start: str, end: str, parser: str,
              parser_options: tuple[str, ...], schema_id: int | None, schema_subject: str, schema_version: str,
              generation: int, from_generation: int) -> None:
    """Re-parse backup blocks into a new partition-group generation (resumable: rerun to continue).

    Version rewinding: a parser version is named by --parser and its --parser-option values (recorded per block
    as the parser's name, version and options digest); a schema version by --schema-id, or --schema-subject with
    --schema-version, read once from the Schema Registry: every record is then read as that schema, and records
    that cannot be are quarantined with the reason. Rerun with the same arguments to resume."""
    from rich.progress import Progress

    from shale.metastore import open_metastore
    from shale.query import parse_time
    from shale.reprocess import ReaderSchema, ReprocessJob
    from shale.spark import spark_session

    config = get_config(ctx)
    spark = spark_session("shale-reprocess", config.spark, kafka=False, bucket=config.bucket)
    job = ReprocessJob(config, open_metastore(config), spark,
                       tenant=tenant, topic=topic, start=parse_time(start), end=parse_time(end), parser=parser,
                       options=_options(parser_options), generation=generation, from_generation=from_generation,
                       reader=(ReaderSchema(schema_id or 0, schema_subject, schema_version)
                               if schema_id or schema_subject or schema_version else None))
    with Progress() as progress:
        task = progress.add_task(f"reprocessing {topic} into generation {generation}", total=None)
        report = job.run(lambda done, total: progress.update(task, advance=done, total=total))
    click.echo(json.dumps(asdict(report)))


@click.group()
def generation() -> None:
    """Switch the partition-group generation readers see."""


@generation.command("switch")
@click.option("--tenant", required=True)
@click.option("--topic", required=True)
@click.option("--generation", "gen", type=int, required=True)
@click.option("--from", "start", required=True, help="Data (event) time where the switch starts.")
@click.option("--to", "end", required=True)
@click.option("--retire", is_flag=True, help="Tombstone the other generations' blocks wholly inside the range.")
@click.pass_context
@shale_errors
def switch(ctx: click.Context, tenant: str, topic: str, gen: int, start: str, end: str, retire: bool) -> None:
    """Make a generation the active one for a tenant's topic over a time range (atomic)."""
    from shale.metastore import SetActiveGeneration, open_metastore
    from shale.query import parse_time

    result = open_metastore(get_config(ctx)).submit(SetActiveGeneration(
        tenant=tenant, topic=topic, generation=gen, start=parse_time(start), end=parse_time(end), retire=retire))
    result.raise_for_rejection()
    click.echo(json.dumps(result.data))


@click.command()
@click.argument("block_id")
@click.pass_context
@shale_errors
def trace(ctx: click.Context, block_id: str) -> None:
    """Where a block's records came from: Kafka ranges and backup blocks."""
    from shale.metastore import open_index_view
    from shale.reprocess import trace_block

    click.echo(json.dumps(trace_block(open_index_view(get_config(ctx)), block_id), indent=2))


@click.command()
@click.option("--topic", required=True)
@click.option("--partition", type=int, required=True)
@click.option("--offset", type=int, required=True)
@click.pass_context
@shale_errors
def locate(ctx: click.Context, topic: str, partition: int, offset: int) -> None:
    """The block in each group and generation that holds a Kafka record."""
    from shale.metastore import open_index_view
    from shale.objstore import open_bucket
    from shale.reprocess import locate as find

    config = get_config(ctx)
    found = find(open_index_view(config), open_bucket(config.bucket), topic, partition, offset)
    if not found:
        raise click.ClickException(f"no live block holds {topic}[{partition}]@{offset}")
    for loc in found:
        click.echo(json.dumps(asdict(loc)))
