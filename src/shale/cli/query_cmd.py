"""``shale query``: read stored records by tenant, time range and labels."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import click

from shale.cli.common import get_config, shale_errors
from shale.query import FORMATS

RAW_COLUMNS = ("value", "headers", "timestamp_type")
"""Not shown in the table when a parser's columns are (its parsed fields say more than the raw value)."""

if TYPE_CHECKING:
    import pyarrow as pa

    from shale.config import ParserRule
    from shale.objstore import BucketReader
    from shale.query import BlockSource, Query


@click.command()
@click.argument("selector", default="{}")
@click.option("--tenant", required=True)
@click.option("--from", "start", default="-1h", show_default=True, help="now, -15m, 2026-11-22, ISO time, epoch ms")
@click.option("--to", "end", default="now", show_default=True)
@click.option("--group", type=click.Choice(["partition", "backup"]), default="partition", show_default=True)
@click.option("--quarantine", is_flag=True, help="Read the records parsers rejected, with the reasons.")
@click.option("--columns", help="Comma-separated columns (default: all).")
@click.option("--limit", type=int, help="At most this many rows (table format: 50 unless set; it says how many "
              "rows matched in all).")
@click.option("--order", type=click.Choice(["offset", "time"]), default="offset", show_default=True,
              help="offset: as stored, per partition in offset order (streamed); time: by event time (the result is "
                   "held in memory to sort it).")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table",
              show_default=True)
@click.option("--output", type=click.Path(dir_okay=False), help="Write here instead of standard output.")
@click.option("--source", type=click.Choice(["metastore", "bucket-index"]), default="metastore", show_default=True,
              help="Find blocks through the metastore, or through the tenant's bucket index (one GET).")
@click.option("--stats", is_flag=True, help="Print what the query read (blocks, objects, bytes, seconds).")
@click.option("--latest", is_flag=True, help="The latest row per key of change tables (upsert or debezium topics, "
              "docs/design/change-tables.md), from their whole history: --from and --to are not used.")
@click.option("--as-of", "as_of", help="With --latest: the rows as they stood at this time (a Kafka record time).")
@click.pass_context
@shale_errors
def query(ctx: click.Context, selector: str, tenant: str, start: str, end: str, group: str, quarantine: bool,
          columns: str | None, limit: int | None, order: str, fmt: str, output: str | None, source: str,
          stats: bool, latest: bool, as_of: str | None) -> None:
    """Read records: shale query --tenant acme --from -1h '{topic="app", level="ERROR"}'. Times are printed as
    ISO 8601 in UTC with microseconds (2026-11-25T07:36:05.383971Z) in every format."""
    from shale.block import BASE_COLUMNS
    from shale.objstore import open_bucket
    from shale.query import (
        Query,
        UnknownColumnsError,
        by_time,
        column_outside_window,
        open_source,
        outside_window,
        parse_time,
        run_query,
        unmatched,
        write_csv,
        write_json,
        write_parquet,
    )

    config = get_config(ctx)
    started = time.perf_counter()
    shown = limit if limit is not None or fmt != "table" else 50
    try:
        q = Query(tenant, parse_time(start), parse_time(end), selector, group=group,
                  kind="quarantine" if quarantine else "records",
                  columns=[c.strip() for c in columns.split(",")] if columns else None,
                  # the table counts every matching row, and sorting needs them all: the limit applies below
                  limit=None if fmt == "table" or order == "time" else shown,
                  default_generation=config.ingest.generation)
        bucket = open_bucket(config.bucket)
        blocks = open_source(config, source, bucket)
        known = getattr(blocks, "tenants", None)
        if callable(known) and tenant not in (names := known()):
            listed = ", ".join(sorted(names)) or "none"
            raise click.ClickException(f"tenant {tenant!r} has no blocks; tenants: {listed}")
        if as_of is not None and not latest:
            raise click.ClickException("--as-of is the time of a latest view: add --latest")
        try:
            reader = _latest(q, blocks, bucket, config.ingest.parsers, as_of) if latest else run_query(q, blocks,
                                                                                                      bucket)
        except UnknownColumnsError as exc:
            raise click.ClickException(column_outside_window(blocks, q, exc.unknown) or str(exc)) from exc
        if q.stats.blocks == 0 and (miss := unmatched(blocks, q)):
            raise click.ClickException(miss)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    batches = iter(reader)
    if order == "time":
        batches = by_time(reader.schema, batches, None if fmt == "table" else shown)
    if fmt == "parquet":
        if not output:
            raise click.ClickException("--format parquet needs --output FILE")
        write_parquet(reader.schema, batches, output)
    elif fmt == "csv":
        with open(output, "wb") if output else contextlib.nullcontext(sys.stdout.buffer) as out:
            write_csv(reader.schema, batches, out)
    elif fmt == "json":
        with open(output, "w") if output else contextlib.nullcontext(sys.stdout) as out:
            write_json(batches, out)
    else:
        parsed = [n for n in reader.schema.names if n not in BASE_COLUMNS]
        raw = [n for n in RAW_COLUMNS if n in reader.schema.names] if parsed and not columns else []
        if raw:
            click.echo(f"{', '.join(raw)} not shown (--columns or --format json shows them)", err=True)
        _table([n for n in reader.schema.names if n not in raw], batches, shown, output)
    if latest:
        if q.stats.rows == 0:  # a latest view reads every time: no window to look outside of
            click.echo("no key of the selected change tables has a latest row", err=True)
    elif (hint := outside_window(blocks, q)) is not None:
        click.echo(hint, err=True)
    elif q.stats.rows == 0:
        click.echo("no row matched the selector in the window", err=True)
    if stats:
        s = q.stats
        click.echo(f"{s.rows} rows from {s.objects} objects of {s.blocks} blocks, {s.bytes_read} bytes in "
                   f"{s.requests} requests, {time.perf_counter() - started:.3f}s"
                   + (f", {s.duplicates_dropped} duplicates dropped" if s.duplicates_dropped else ""), err=True)


def _latest(q: Query, blocks: BlockSource, bucket: BucketReader, parsers: list[ParserRule],
            as_of: str | None) -> pa.RecordBatchReader:
    """The latest rows as a stream; keys withheld (their latest record cannot be read) are said on stderr."""
    import pyarrow as pa

    from shale.query import parse_time, read_latest

    view, view_stats = read_latest(q, blocks, bucket, parsers, None if as_of is None else parse_time(as_of))
    if view_stats.withheld:
        click.echo(f"{view_stats.withheld} keys left out: their latest record cannot be read (the first: "
                   f"{view_stats.withheld_reason}); `shale query --quarantine` shows such records", err=True)
    return pa.RecordBatchReader.from_batches(view.schema, view.to_batches())


def _table(names: list[str], batches: Iterator[pa.RecordBatch], limit: int | None, output: str | None) -> None:
    """Rows for people: the first ``limit`` rows, then how many matched in all (every row is counted)."""
    from rich.console import Console
    from rich.table import Table

    from shale.query import text_value

    table = Table(*names)
    total = 0
    for batch in (b.select(names) for b in batches):
        room = batch.num_rows if limit is None else max(0, min(batch.num_rows, limit - total))
        for row in batch.slice(0, room).to_pylist():
            table.add_row(*(str(text_value(v))[:120] for v in row.values()))
        total += batch.num_rows
    rows = min(total, limit) if limit is not None else total
    note = f"showing {rows} of {total} rows" + (" (--limit N shows more)" if rows < total else "")
    if output:
        with open(output, "w") as out:
            Console(file=out, width=200).print(table)
            out.write(note + "\n")
    else:
        Console(width=200).print(table)
        click.echo(note)
