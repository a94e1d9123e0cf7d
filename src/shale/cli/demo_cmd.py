"""``shale demo`` (``make demo``): the main pipeline on embedded defaults, with its own Kafka broker and a bucket on the
local filesystem."""

from __future__ import annotations

import tempfile
from pathlib import Path

import click

from shale.cli import common
from shale.cli.common import shale_errors


@click.command()
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where services keep their data (default: a temporary folder, removed afterwards).")
@shale_errors
def demo(workdir: Path | None) -> None:
    """Produce real logs to Kafka, persist them with both ingest groups, show the ledger, a verify summary and
    sample records, then query, compact on Spark, verify again, write the bucket indexes and query through one."""
    from shale.demo import run_demo
    from shale.logs import setup_logging

    setup_logging("WARNING")
    with tempfile.TemporaryDirectory(prefix="shale-demo-") as tmp:
        root = workdir or Path(tmp)
        result = run_demo(root, click.echo, _shale)
    if not result.ok:
        raise click.ClickException("verify found missing or duplicated records, or the query through the bucket "
                                   "index returned other records than before compaction (see above)")
    click.echo("demo OK: every record is stored exactly once in each group")
    _ = common


def _shale(args: list[str]) -> None:
    """Run one ``shale`` command line in this process (the demo shows ``shale query`` this way)."""
    from shale.cli import cli

    cli.main(args, prog_name="shale", standalone_mode=False)
