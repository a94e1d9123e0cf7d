"""``shale tombstones``: blocks removed from the index whose objects are still in the bucket, and why."""

from __future__ import annotations

import datetime as dt
import json

import click

from shale.cli.common import get_config, shale_errors


@click.command()
@click.option("--tenant", help="Only this tenant's tombstones.")
@click.option("--block", "block_id", help="Only this block's tombstone (what `shale trace` could not find).")
@click.option("--limit", type=int, default=1000, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.pass_context
@shale_errors
def tombstones(ctx: click.Context, tenant: str | None, block_id: str | None, limit: int, as_json: bool) -> None:
    """List tombstones: blocks compacted away, replaced or deleted, with when and why. A tombstone lasts until the
    block's objects are deleted (block.delete_delay after it was written), then the block is gone for good."""
    from shale.metastore import open_index_view

    config = get_config(ctx)
    rows = [t for t in open_index_view(config).tombstones(limit=limit if not (tenant or block_id) else 10_000)
            if (tenant is None or t.tenant == tenant) and (block_id is None or t.block_id == block_id)][:limit]
    if as_json:
        for t in rows:
            click.echo(json.dumps(t.model_dump(mode="json")))
    else:
        header = ("BLOCK", "TENANT", "REMOVED (UTC)", "FILES", "REASON")
        lines = [header] + [(t.block_id, t.tenant, _ts(t.created_at), str(len(t.files)), t.reason) for t in rows]
        widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
        for line in lines:
            click.echo("  ".join([*(c.ljust(w) for c, w in zip(line, widths, strict=False)), line[-1]]))
    if block_id and not rows:
        raise click.ClickException(f"no tombstone of block {block_id}: it is live (shale trace), or its objects were "
                                   f"deleted after block.delete_delay ({config.block.delete_delay:g}s)")


def _ts(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
