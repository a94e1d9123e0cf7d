"""``shale bucket repair``: a planned, dry-run-first repair of overlapping and damaged blocks (DESIGN 7.9)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from shale.cli.common import get_config, reachable_metastore, shale_errors

if TYPE_CHECKING:
    from shale.config import ShaleConfig
    from shale.metastore import IndexReads, MetastoreClient, MetastoreService
    from shale.objstore import Bucket
    from shale.repair import Plan, Scan

NO_METASTORE = (
    "nothing was applied: the metastore cannot be reached ({why}). A repair changes the index and the bucket "
    "together: without the index, nobody knows which of two copies is committed, and the leader's bucket scan "
    "would later collect the repair's new blocks as uncommitted. Start the metastore and run this again; if it is "
    "lost, rebuild it from the bucket first (`shale metastore rebuild --from-bucket`), then repair.")


def _in_group(plan: Plan, groups: dict[str, str], group: str) -> Plan:
    """The plan's steps, unrecoverable blocks and notes about blocks of ``group`` only."""
    return plan.model_copy(update={
        "steps": [s for s in plan.steps if all(groups.get(b) == group for b in s.blocks)],
        "unrecoverable": [u for u in plan.unrecoverable if groups.get(u["block"]) == group],
        "notes": [n for n in plan.notes if groups.get(n.split(":", 1)[0]) in (group, None)]})


def _print(plan: Plan, applied: dict[str, Any] | None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=200)
    title = (f"repair plan for tenant {plan.tenant} "
             f"({'with the metastore' if plan.metastore else 'WITHOUT the metastore'}; "
             f"{'applied' if applied is not None else 'dry run: nothing changed'})")
    table = Table(title=title, title_justify="left")
    for column in ("#", "action", "blocks", "output", "reason"):
        table.add_column(column, overflow="fold")
    for i, step in enumerate(plan.steps, 1):
        table.add_row(str(i), step.action, "\n".join(step.blocks),
                      f"{step.output or '-'}{' (written)' if step.written else ''}", step.reason)
    console.print(table if plan.steps else f"{title}: nothing to repair")
    for lost in plan.unrecoverable:
        console.print(f"unrecoverable: {lost['block']} {', '.join(lost['ranges'])}: {lost['why']} (kept, never "
                      "deleted)")
    for note in plan.notes:
        console.print(f"note: {note}")
    if plan.in_flight:
        console.print(f"{plan.in_flight} blocks a commit may still claim were not judged")
    if applied is not None:
        for failure in applied["failed"]:
            console.print(f"FAILED step {failure['step']}: {failure['error']}")
        for step, problem in applied["quarantined_instead"]:
            console.print(f"quarantined instead of rebuilt: {step}: {problem}")
        console.print(f"{len(applied['done'])} of {len(plan.steps)} steps done; run the dry run again to check that "
                      "nothing is left")
    elif plan.steps:
        console.print("(--json shows each step's evidence; --apply applies the plan)")


@click.command()
@click.option("--tenant", required=True, help="The tenant whose blocks to repair.")
@click.option("--group", type=click.Choice(["backup", "partition"]), help="Only the steps of this group's blocks.")
@click.option("--dry-run/--apply", "dry_run", default=True, help="Print the plan (default), or apply it.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan (and what was applied) as JSON.")
@click.pass_context
@shale_errors
def repair(ctx: click.Context, tenant: str, group: str | None, dry_run: bool, as_json: bool) -> None:
    """Plan the repair of overlapping and damaged blocks, with each step's reason and evidence; --apply does it.

    Blocks whose records another block holds are marked for deletion; partially overlapping blocks are merged
    into one deduplicated block; damaged blocks are rebuilt from the backup group or Kafka, or quarantined;
    records found nowhere else are never deleted."""
    from shale.block import check_tenant
    from shale.objstore import open_bucket
    from shale.repair import current_parsers, kafka_state, plan_repair, scan_tenant

    check_tenant(tenant)
    config = get_config(ctx)
    bucket = open_bucket(config.bucket)
    writer: MetastoreService | MetastoreClient | None = None
    metastore: IndexReads | None
    if dry_run:  # changes nothing: reads through the read-only view
        metastore, why = reachable_metastore(config, write=False)
    else:
        writer, why = reachable_metastore(config, write=True)
        metastore = writer
    scan = scan_tenant(bucket, tenant, sync_delay=config.block.sync_delay, index=metastore,
                       kafka=kafka_state(config.kafka), parsers=current_parsers(config.bucket, config.ingest))
    plan = plan_repair(tenant, scan.facts, metastore=metastore is not None, sources=scan.sources)
    if metastore is None:
        plan.notes.insert(0, f"the metastore cannot be reached ({why}): this plan is the bucket's view alone")
    if group is not None:
        plan = _in_group(plan, {f.id: f.meta.group for f in scan.facts if f.meta is not None}, group)
    applied: dict[str, Any] | None = None
    if not dry_run:
        if writer is None:
            raise click.ClickException(NO_METASTORE.format(why=why))
        applied = _apply(config, plan, scan, bucket, writer)
    if as_json:
        click.echo(json.dumps({**plan.model_dump(mode="json"), "applied": applied}, indent=2))
    else:
        _print(plan, applied)
    if applied is not None and applied["failed"]:
        raise SystemExit(1)


def _apply(config: ShaleConfig, plan: Plan, scan: Scan, bucket: Bucket,
           metastore: MetastoreService | MetastoreClient) -> dict[str, Any]:
    """Apply the plan; merges and rebuilds run as Spark tasks (a session is started only if one is needed)."""
    from shale.repair import Builder, LocalBuilder, SparkBuilder, apply_plan

    builder: Builder = LocalBuilder(config.bucket, config.ingest, config.kafka)  # builds nothing: all written
    if any(s.action in ("merge", "rebuild") and not s.written for s in plan.steps):
        from shale.spark import spark_session

        builder = SparkBuilder(spark_session("shale-repair", config.spark, kafka=False), config.bucket, config.ingest,
                               config.kafka)
    metas = {f.id: f.meta for f in scan.facts if f.meta is not None}
    report = apply_plan(plan, metas, bucket, metastore, builder)
    return {"done": [s.blocks for s in report.done],
            "failed": [{"step": s.blocks, "error": error} for s, error in report.failed],
            "quarantined_instead": [[s.blocks, problem] for s, problem in report.quarantined_instead]}
