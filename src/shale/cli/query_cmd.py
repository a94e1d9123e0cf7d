"""``shale query``: read stored records by tenant, time range and labels."""

from __future__ import annotations

import sys
from itertools import islice

import click

from shale.cli.common import get_config, shale_errors
from shale.query.output import FORMATS


@click.command()
@click.argument("selector", default="{}")
@click.option("--tenant", required=True)
@click.option("--from", "start", default="-1h", show_default=True, help="now, -15m, 2026-11-22, ISO time, epoch ms")
@click.option("--to", "end", default="now", show_default=True)
@click.option("--group", type=click.Choice(["partition", "backup"]), default="partition", show_default=True)
@click.option("--quarantine", is_flag=True, help="Read the records parsers rejected, with the reasons.")
@click.option("--columns", help="Comma-separated columns (default: all).")
@click.option("--limit", type=int, help="At most this many rows (table format: 50 unless set).")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table",
              show_default=True)
@click.option("--output", type=click.Path(dir_okay=False), help="Write here instead of standard output.")
@click.option("--source", type=click.Choice(["metastore", "bucket-index"]), default="metastore", show_default=True,
              help="Find blocks through the metastore, or through the tenant's bucket index (one GET).")
@click.option("--stats", is_flag=True, help="Print what the query read (blocks, objects, bytes, seconds).")
@click.pass_context
@shale_errors
def query(ctx: click.Context, selector: str, tenant: str, start: str, end: str, group: str, quarantine: bool,
          columns: str | None, limit: int | None, fmt: str, output: str | None, source: str, stats: bool) -> None:
    """Read records: shale query --tenant acme --from -1h '{topic="app", level="ERROR"}'."""
    from shale.objstore import open_bucket
    from shale.query import Query, run_query
    from shale.query.output import write_csv, write_json, write_parquet
    from shale.query.sources import open_source
    from shale.query.times import parse_time

    config = get_config(ctx)
    try:
        q = Query(tenant, parse_time(start), parse_time(end), selector, group=group,
                  kind="quarantine" if quarantine else "records",
                  columns=[c.strip() for c in columns.split(",")] if columns else None,
                  limit=limit if limit is not None or fmt != "table" else 50,
                  default_generation=config.ingest.generation)
        bucket = open_bucket(config.bucket)
        reader = run_query(q, open_source(config, source, bucket), bucket)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    batches = iter(reader)
    if fmt == "parquet":
        if not output:
            raise click.ClickException("--format parquet needs --output FILE")
        write_parquet(reader.schema, batches, output)
    elif fmt == "csv":
        with open(output, "wb") if output else sys.stdout.buffer as out:
            write_csv(reader.schema, batches, out)
    elif fmt == "json":
        with open(output, "w") if output else sys.stdout as out:
            write_json(batches, out)
    else:
        from rich.console import Console
        from rich.table import Table

        from shale.query.output import _text

        table = Table(*reader.schema.names)
        for row in islice((r for b in batches for r in b.to_pylist()), q.limit):
            table.add_row(*(str(_text(v))[:120] for v in row.values()))
        if output:
            with open(output, "w") as out:
                Console(file=out, width=200).print(table)
        else:
            Console(width=200).print(table)
    if stats:
        s = q.stats
        click.echo(f"{s.rows} rows from {s.objects} objects of {s.blocks} blocks, {s.bytes_read} bytes in "
                   f"{s.requests} requests, {s.seconds:.3f}s" + (f", {s.duplicates_dropped} duplicates dropped"
                                                                  if s.duplicates_dropped else ""), err=True)
