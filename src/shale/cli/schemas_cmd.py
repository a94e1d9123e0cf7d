"""``shale schemas``: the writer schemas (Schema Registry ids) a tenant's live blocks were written with."""

from __future__ import annotations

import datetime as dt
import json

import click

from shale.cli.common import get_config, shale_errors


@click.command()
@click.option("--tenant", required=True)
@click.option("--topic", default=None, help="Only this topic.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.pass_context
@shale_errors
def schemas(ctx: click.Context, tenant: str, topic: str | None, as_json: bool) -> None:
    """List the schema versions of a tenant's topics, as the metastore indexes them: per topic, the record type
    (topics stored per record type: subject_name_strategy record or topic_record; '-' otherwise), Schema Registry id,
    group and generation, the fingerprint the rows are stored under, the live blocks and their data-time range
    (typed parsers: avro, protobuf, json_schema). `shale reprocess --schema-id` reads a range again as one of
    them."""
    from shale.metastore import open_index_view

    rows = open_index_view(get_config(ctx)).schema_versions(tenant, topic)
    if as_json:
        for r in rows:
            click.echo(json.dumps(r.model_dump(mode="json")))
        return
    header = ("TOPIC", "RECORD", "SCHEMA ID", "FINGERPRINT", "GROUP", "GEN", "BLOCKS", "FROM (UTC)", "TO (UTC)")
    lines = [header] + [(r.topic, r.record or "-", str(r.schema_id), r.fingerprint or "-", r.group, str(r.generation),
                         str(r.blocks), _ts(r.min_time), _ts(r.max_time)) for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        click.echo("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
    if not rows:
        click.echo(f"no blocks of tenant {tenant!r} were written by a typed parser", err=True)


def _ts(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
