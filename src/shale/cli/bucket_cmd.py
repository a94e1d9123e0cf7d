"""``shale bucket ls | inspect | verify | mark-delete | cleanup | index | repair``: the object-storage contract, from
the bucket."""

from __future__ import annotations

import datetime as dt
import functools
import json
import time
from typing import TYPE_CHECKING

import click

from shale.cli.common import get_config, reachable_metastore, shale_errors

if TYPE_CHECKING:
    from shale.block import MetastoreView
    from shale.metastore import IndexReads


def _fetcher(ctx: click.Context):  # type: ignore[no-untyped-def]
    from shale.block import BlockFetcher
    from shale.objstore import open_bucket

    config = get_config(ctx)
    bucket = open_bucket(config.bucket)
    return bucket, BlockFetcher(bucket, config.block.sync_delay)


def _ts(ms: int) -> str:
    """ISO 8601 in UTC, with its zone."""
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@click.group()
def bucket() -> None:
    """Inspect and maintain blocks directly in the bucket (no metastore needed; cleanup asks it when it can)."""


@bucket.command("ls")
@click.option("--tenant", help="List this tenant's blocks (default: list tenants).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.pass_context
@shale_errors
def ls(ctx: click.Context, tenant: str | None, as_json: bool) -> None:
    """List tenants, or one tenant's blocks with their states, group, kind (records, quarantine, or empty: a range
    that held no readable record), topics and data times (UTC). A block younger than block.sync_delay is fresh:
    bucket scans do not trust it yet (its writer may still be writing it); it turns healthy on its own."""
    _, fetcher = _fetcher(ctx)
    if tenant is None:
        for name in fetcher.tenants():
            click.echo(json.dumps({"tenant": name}) if as_json else name)
        return
    result = fetcher.sync(tenant)
    # A block younger than the sync delay whose records a newer block already holds (a compaction's sources, just
    # merged) is said to be, not shown as plainly fresh beside its output.
    from shale.block import by_source, covering

    with_meta = [v for v in result.blocks.values() if v.meta is not None]
    inside = by_source(with_meta)
    merged = {v.id: other.id for v in with_meta if v.state.value == "fresh"
              for other, equal in covering(v, inside) if not equal or other.id > v.id}  # as the fetcher judges
    header = ("BLOCK", "STATE", "LEVEL", "GROUP", "KIND", "TOPIC", "ROWS", "BYTES", "MIN TIME (UTC)",
              "MAX TIME (UTC)")
    rows: list[dict[str, object]] = []
    lines: list[tuple[str, ...]] = [header]
    for view in sorted(result.blocks.values(), key=lambda v: v.id):
        meta = view.meta
        kind = (",".join(sorted({d.kind for d in meta.datasets})) or "empty") if meta else None
        topics = sorted({d.topic for d in meta.datasets} | {k.topic for k in meta.kafka}) if meta else []
        times = (_ts(meta.min_time), _ts(meta.max_time)) if meta else (None, None)
        size = sum(o.size for o in view.objects)
        state = f"{view.state.value} (in {merged[view.id]})" if view.id in merged else view.state.value
        rows.append({"id": view.id, "state": state, "level": meta.level if meta else None,
                     "group": meta.group if meta else None, "kind": kind, "topics": topics,
                     "rows": meta.rows if meta else None, "bytes": size, "min_time": times[0], "max_time": times[1]})
        lines.append((view.id, state, f"L{meta.level}" if meta else "-", meta.group if meta else "-",
                      kind or "-", ",".join(topics) or "-", str(meta.rows) if meta else "-", str(size),
                      times[0] or "-", times[1] or "-"))
    if as_json:
        for row in rows:
            click.echo(json.dumps(row))
        return
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    numeric = {6, 7}
    for line in lines:
        click.echo("  ".join(cell.rjust(widths[i]) if i in numeric else cell.ljust(widths[i])
                             for i, cell in enumerate(line)).rstrip())
    if any(str(r["state"]).startswith("fresh") for r in rows):
        delay = get_config(ctx).block.sync_delay
        click.echo(f"fresh: younger than block.sync_delay ({delay:g}s): bucket scans do not trust these blocks yet "
                   "(a writer may still be writing them); they turn healthy on their own"
                   + ("; 'fresh (in X)': its records are in the newer block X too (a compaction's source)"
                      if merged else ""))


@bucket.command()
@click.argument("tenant")
@click.argument("block_id")
@click.pass_context
@shale_errors
def inspect(ctx: click.Context, tenant: str, block_id: str) -> None:
    """Print a block's state, objects and metadata as JSON."""
    from shale.block import LISTED, check_block_id

    check_block_id(block_id)
    _, fetcher = _fetcher(ctx)
    view = fetcher.sync(tenant).blocks.get(block_id)
    if view is None:
        raise click.ClickException(f"tenant {tenant} has no block {block_id} in the bucket")
    out = {"id": view.id, "state": view.state.value, "age_seconds": round(view.age, 1), "error": view.error,
           "overlapped_by": view.overlapped_by, "mark": view.mark.model_dump() if view.mark else None,
           "objects": [{"key": o.key, "size": o.size, "last_modified": o.last_modified} for o in view.objects],
           "meta": view.meta.model_dump(mode="json", context=LISTED) if view.meta else None}
    click.echo(json.dumps(out, indent=2))


@bucket.command()
@click.option("--tenant", multiple=True, help="Verify these tenants (default: all).")
@click.option("--no-data", is_flag=True, help="Skip reading data objects to check their checksums.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON report per tenant.")
@click.pass_context
@shale_errors
def verify(ctx: click.Context, tenant: tuple[str, ...], no_data: bool, as_json: bool) -> None:
    """Check metadata, checksums, Kafka-offset overlaps, partial blocks and marks. Exits 1 on a problem."""
    from shale.block import verify_tenant

    bucket_, fetcher = _fetcher(ctx)
    ok = True
    for name in tenant or fetcher.tenants():
        report = verify_tenant(bucket_, fetcher.sync(name), check_data=not no_data)
        ok = ok and report.ok
        if as_json:
            click.echo(report.to_json())
            continue
        states = ", ".join(f"{k} {v}" for k, v in sorted(report.states.items()))
        click.echo(f"tenant {name}: {report.blocks} blocks ({states or 'none'}): {'OK' if report.ok else 'PROBLEMS'}")
        for problem in report.problems:
            click.echo(f"  {'ERROR' if problem.severe else 'note '} {problem.kind:<18} {problem.block_id}  "
                       f"{problem.detail}")
    if not ok:
        raise SystemExit(1)


@bucket.command("index")
@click.option("--tenant", multiple=True, help="Tenants to index (default: every tenant in the bucket).")
@click.pass_context
@shale_errors
def index(ctx: click.Context, tenant: tuple[str, ...]) -> None:
    """Write <tenant>/bucket-index.json.gz from a scan of the bucket (no metastore needed; also a repair)."""
    from shale.bucketindex import write_scanned_index

    config = get_config(ctx)
    bucket_, fetcher = _fetcher(ctx)
    for name in tenant or fetcher.tenants():
        result = write_scanned_index(bucket_, name, config.block.sync_delay, deltas=config.bucket_index.deltas)
        click.echo(f"tenant {name}: {len(result.stored.index.blocks)} blocks, "
                   f"{len(result.stored.index.deletion_marks)} deletion marks, watermark "
                   f"{result.stored.index.watermark or '-'}, {result.conflicts} conflicts merged, "
                   f"{result.deleted_deltas} deltas folded")


@bucket.command("mark-delete")
@click.argument("tenant")
@click.argument("block_id")
@click.option("--reason", required=True, help="Why (kept in the mark).")
@click.pass_context
@shale_errors
def mark_delete(ctx: click.Context, tenant: str, block_id: str, reason: str) -> None:
    """Mark a block for deletion; the cleaner removes it after the delete delay."""
    from shale.block import write_deletion_mark

    bucket_, _ = _fetcher(ctx)
    mark = write_deletion_mark(bucket_, tenant, block_id, time.time(), reason)
    click.echo(f"marked {tenant}/{block_id} for deletion at {mark.deletion_time:.0f} ({mark.reason})")


def _indexed_view(metastore: IndexReads, tenant: str) -> MetastoreView:
    from shale.block import MetastoreView

    return MetastoreView(frozenset(m.id for m in metastore.tenant_blocks(tenant)))


@bucket.command()
@click.option("--tenant", multiple=True, help="Clean these tenants (default: all).")
@click.option("--dry-run", is_flag=True, help="Print what would be done, change nothing.")
@click.option("--force", is_flag=True, help="Without the metastore, mark overlapped blocks anyway (risky: the "
                                            "overlapping copy may be the uncommitted one).")
@click.pass_context
@shale_errors
def cleanup(ctx: click.Context, tenant: tuple[str, ...], dry_run: bool, force: bool) -> None:
    """Mark partial blocks, and (with the metastore) blocks whose records are in an indexed block; remove marked
    blocks after the delete delay; remove orphan marks. Blocks the metastore indexes are never touched."""
    from shale.block import Cleaner

    config = get_config(ctx)
    bucket_, fetcher = _fetcher(ctx)
    metastore, why = reachable_metastore(config, write=False)
    if metastore is None:
        click.echo(f"metastore not reachable ({why}): overlap-based marks are refused"
                   f"{', but --force marks them anyway' if force else ' (--force marks them anyway)'}")
    cleaner = Cleaner(bucket_, fetcher, config.block.delete_delay)
    for name in tenant or fetcher.tenants():
        # The view is read by the cleaner after it listed the tenant's blocks.
        view = functools.partial(_indexed_view, metastore, name) if metastore is not None else None
        report = cleaner.run(name, dry_run=dry_run, metastore=view, force=force)
        for action in report.actions:
            click.echo(f"{'would ' if dry_run else ''}{action.kind} {name}/{action.block_id}: {action.reason}")
        for block_id in report.protected:
            click.echo(f"kept {name}/{block_id}: the metastore indexes it")
        for action in report.refused:
            click.echo(f"refused to {action.kind} {name}/{action.block_id}: {action.reason}")
        if not report.actions and not report.refused:
            click.echo(f"tenant {name}: nothing to do")
