"""``shale restore``: replay a topic's backup blocks into a Kafka topic, exactly once (resumable: run the same
command again to continue)."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

import click

from shale.cli.common import get_config, shale_errors


def _offsets(text: str) -> dict[int, tuple[int, int]]:
    """``0:100-5000,1:0-42`` -> {0: (100, 5000), 1: (0, 42)}: per source partition, offsets [start, end)."""
    out: dict[int, tuple[int, int]] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            partition, _, span = part.partition(":")
            start, _, end = span.partition("-")
            out[int(partition)] = (int(start), int(end))
        except ValueError as exc:
            raise click.BadParameter(f"{part!r} is not PARTITION:START-END (source offsets, END excluded)") from exc
        if out[int(partition)][1] < out[int(partition)][0]:
            raise click.BadParameter(f"{part!r}: END is before START")
    return out


@click.command()
@click.option("--tenant", required=True)
@click.option("--topic", required=True, help="The source topic (its backup-group blocks).")
@click.option("--target-topic", default=None, help="The topic to restore into (default: the source topic's name).")
@click.option("--target-bootstrap", default=None,
              help="Another cluster's bootstrap servers (the configuration's Kafka security settings).")
@click.option("--target-config", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A Shale configuration file whose [kafka] section reaches the target cluster.")
@click.option("--until", default=None, help="Restore the records stamped before this time (each partition stops "
                                            "at its first record at or after it): ISO, 2026-11-20T14:02Z, epoch ms.")
@click.option("--offsets", default=None, metavar="P:START-END,...",
              help="Per source partition, the offsets [START, END) to restore (other partitions are not restored).")
@click.option("--incarnation", default=None, help="The source topic's incarnation (topic id; default: the newest).")
@click.option("--incarnation-at", default=None, help="The incarnation that was live at this time.")
@click.option("--partitions", type=int, default=None, help="Partitions of a target topic the restore creates.")
@click.option("--job", default="", help="Name of the restore job (default: derived from what it restores).")
@click.option("--commit-every", type=click.IntRange(min=1), default=5000, show_default=True,
              help="Records per Kafka transaction.")
@click.option("--dry-run", is_flag=True, help="Print the plan; send nothing.")
@click.option("--into-existing", is_flag=True, help="Restore into a target topic that already holds records.")
@click.option("--allow-log-append-time", is_flag=True, help="Restore into a LogAppendTime topic (loses timestamps).")
@click.pass_context
@shale_errors
def restore(ctx: click.Context, tenant: str, topic: str, target_topic: str | None, target_bootstrap: str | None,
            target_config: str | None, until: str | None, offsets: str | None, incarnation: str | None,
            incarnation_at: str | None, partitions: int | None, job: str, commit_every: int, dry_run: bool,
            into_existing: bool, allow_log_append_time: bool) -> None:
    """Replay a topic's backup blocks into Kafka, exactly once. Exit 0 when every partition is restored, 1 when a
    partition stopped (a gap, a corrupt block, a refused record: the report names it)."""
    from shale.config import load_config
    from shale.metastore import open_index_view
    from shale.query.times import parse_time
    from shale.restore import RestoreJob, RestoreRange, RestoreRequest

    config = get_config(ctx)
    target = load_config(target_config).kafka if target_config else config.kafka
    if target_bootstrap:
        target = target.model_copy(update={"bootstrap_servers": target_bootstrap})
    request = RestoreRequest(
        tenant=tenant, topic=topic, target_topic=target_topic or topic,
        range=RestoreRange(until_ms=parse_time(until) if until else None,
                           offsets=_offsets(offsets) if offsets else None),
        incarnation=incarnation, incarnation_at_ms=parse_time(incarnation_at) if incarnation_at else None,
        partitions=partitions, job=job, commit_every=commit_every, allow_log_append_time=allow_log_append_time)
    spark = None
    if not dry_run:
        from shale.spark import spark_session

        spark = spark_session("shale-restore", config.spark, kafka=False, bucket=config.bucket)
    report = RestoreJob(open_index_view(config), config.bucket, target, request, spark).run(dry_run, into_existing)
    click.echo(json.dumps(asdict(report), indent=2))
    if report.why_not and not report.executed:
        click.echo(f"nothing sent: {report.why_not}", err=True)
        return
    if not report.ok:
        sys.exit(1)
