"""``shale restore``: replay a topic's backup blocks into a Kafka topic, exactly once (resumable: run the same
command again to continue)."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from typing import TYPE_CHECKING

import click

from shale.cli.common import get_config, shale_errors

if TYPE_CHECKING:
    from shale.config import KafkaConfig, ShaleConfig
    from shale.restore import RestoreRange, RestoreReport


def _time(text: str | None) -> int | None:
    from shale.query import parse_time

    return parse_time(text) if text else None


def _range(until: str | None, offsets: str | None) -> RestoreRange:
    from shale.restore import RestoreRange

    return RestoreRange(until_ms=_time(until), offsets=_offsets(offsets) if offsets else None)


def _target(config: ShaleConfig, target_config: str | None, target_bootstrap: str | None) -> KafkaConfig:
    from shale.config import load_config

    target = load_config(target_config).kafka if target_config else config.kafka
    if target_bootstrap:
        target = target.model_copy(update={"bootstrap_servers": target_bootstrap})
    return target


def _local_user() -> str:
    import getpass
    import socket

    try:
        return f"{getpass.getuser()}@{socket.gethostname()}"[:200]
    except (KeyError, OSError):  # no name for this uid (a container)
        return f"uid {os.getuid()}@{socket.gethostname()}"[:200]


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


@click.group(invoke_without_command=True)
@click.option("--tenant", default=None, help="The tenant whose backup blocks hold the topic (required).")
@click.option("--topic", default=None, help="The source topic (its backup-group blocks; required).")
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
@click.option("--source-partitions", type=click.IntRange(min=1), default=None,
              help="The source topic's partition count, when it is gone (default: the live source topic's, else "
                   "the partitions the backup group committed; a topic backed up before 2026-12-04 lacks its last "
                   "partitions that never held a record).")
@click.option("--job", default="", help="Name of the restore job (default: derived from what it restores).")
@click.option("--commit-every", type=click.IntRange(min=1), default=20_000, show_default=True,
              help="Records per Kafka transaction.")
@click.option("--max-records-per-second", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Throttle: records per second for the whole restore (default: no limit).")
@click.option("--max-bytes-per-second", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Throttle: bytes (key, value, headers) per second for the whole restore (default: no limit).")
@click.option("--oversized", type=click.Choice(["stop", "dead-letter"]), default="stop", show_default=True,
              help="A record larger than the target's max.message.bytes: stop its partition there, or write it to "
                   "the bucket (<tenant>/restore-dead-letters/<job>/) and go on.")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=0,
              help="Serve the restore's Prometheus metrics on 127.0.0.1:PORT while it runs (0: none).")
@click.option("--dry-run", is_flag=True, help="Print the plan; send nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan and the report as JSON.")
@click.option("--into-existing", is_flag=True, help="Restore into a target topic that already holds records.")
@click.option("--allow-log-append-time", is_flag=True, help="Restore into a LogAppendTime topic (loses timestamps).")
@click.pass_context
@shale_errors
def restore(ctx: click.Context, tenant: str | None, topic: str | None, target_topic: str | None,
            target_bootstrap: str | None, target_config: str | None, until: str | None, offsets: str | None,
            incarnation: str | None, incarnation_at: str | None, partitions: int | None,
            source_partitions: int | None, job: str, commit_every: int,
            max_records_per_second: float | None, max_bytes_per_second: float | None, oversized: str,
            metrics_port: int, dry_run: bool, as_json: bool, into_existing: bool,
            allow_log_append_time: bool) -> None:
    """Replay a topic's backup blocks into Kafka, exactly once. Exit 0 when every partition is restored, 1 when a
    partition stopped (a gap, a corrupt block, a refused record: the report names it).
    `shale restore offsets` carries a consumer group's position over."""
    from shale.metastore import open_index_view, open_metastore
    from shale.restore import RestoreJob, RestoreLimits, RestoreRequest

    if ctx.invoked_subcommand is not None:
        return
    if not tenant or not topic:
        raise click.UsageError("--tenant and --topic are required")
    config = get_config(ctx)
    target = _target(config, target_config, target_bootstrap)
    request = RestoreRequest(
        tenant=tenant, topic=topic, target_topic=target_topic or topic, range=_range(until, offsets),
        incarnation=incarnation, incarnation_at_ms=_time(incarnation_at),
        partitions=partitions, source_partitions=source_partitions, job=job, commit_every=commit_every,
        allow_log_append_time=allow_log_append_time,
        limits=RestoreLimits(max_records_per_second, max_bytes_per_second), dead_letter=oversized == "dead-letter")
    spark = None
    if not dry_run:
        from shale.spark import spark_session

        spark = spark_session("shale-restore", config.spark, kafka=False, bucket=config.bucket)
    if metrics_port:
        from prometheus_client import start_http_server

        start_http_server(metrics_port, addr="127.0.0.1")
    # A dry run only reads; a restore is recorded in the metastore (who: the local user embedded, the API token's
    # name remote, set by the server).
    journal = None if dry_run else open_metastore(config)
    report = RestoreJob(journal or open_index_view(config), config.bucket, target, request, spark,
                        on_progress=lambda name, line: click.echo(line.text(name), err=True),
                        journal=journal, by=_local_user()).run(dry_run, into_existing)
    click.echo(json.dumps(asdict(report), indent=2) if as_json else report_text(report))
    if report.why_not and not report.executed:
        click.echo(f"nothing sent: {report.why_not}", err=True)
        return
    if not report.ok:
        sys.exit(1)


@restore.command("offsets")
@click.option("--tenant", required=True)
@click.option("--topic", required=True, help="The restore's source topic.")
@click.option("--target-topic", default=None, help="The restore's target topic (default: the source's name).")
@click.option("--target-bootstrap", default=None)
@click.option("--target-config", type=click.Path(exists=True, dir_okay=False), default=None)
@click.option("--until", default=None, help="The restore's --until.")
@click.option("--offsets", "restored", default=None, metavar="P:START-END,...", help="The restore's --offsets.")
@click.option("--incarnation", default=None)
@click.option("--job", default="", help="The restore's --job, if it was named.")
@click.option("--group", required=True, help="The consumer group to carry over.")
@click.option("--source-offsets", default=None, metavar="P:OFFSET,...",
              help="The group's committed source offsets (default: read from the source cluster, the "
                   "configuration's [kafka]).")
@click.option("--dry-run", is_flag=True, help="Print the translation; set nothing.")
@click.pass_context
@shale_errors
def offsets_cmd(ctx: click.Context, tenant: str, topic: str, target_topic: str | None, target_bootstrap: str | None,
                target_config: str | None, until: str | None, restored: str | None, incarnation: str | None,
                job: str, group: str, source_offsets: str | None, dry_run: bool) -> None:
    """Translate a consumer group's committed source offsets into the restored topic's offsets and set them there,
    so the group resumes at the first record it had not seen (the group must have no active member)."""
    from shale.kafka import client_options
    from shale.metastore import open_index_view
    from shale.objstore import open_bucket
    from shale.restore import (
        RestoreJob,
        RestoreRequest,
        committed_offsets,
        dead_lettered,
        erased_source_offsets,
        job_name,
        read_anchors,
        read_progress,
        set_offsets,
        translate,
    )

    config = get_config(ctx)
    target = _target(config, target_config, target_bootstrap)
    request = RestoreRequest(tenant=tenant, topic=topic, target_topic=target_topic or topic,
                             range=_range(until, restored), incarnation=incarnation, job=job)
    index = open_index_view(config)
    plan = RestoreJob(index, config.bucket, target, request).plan()
    if source_offsets:
        source = {int(p): int(o) for p, _, o in (item.partition(":") for item in source_offsets.split(",") if item)}
    else:
        source = committed_offsets(client_options(config.kafka), group, topic)
    if not source:
        raise click.ClickException(f"group {group} has no committed offsets of {topic}; give --source-offsets")
    name = job_name(request, plan.incarnation, target.bootstrap_servers)
    skipped = dead_lettered(open_bucket(config.bucket), tenant, name)
    progress = {p: next_offset for p, (next_offset, _) in read_progress(client_options(target), name).items()}
    translated = translate(plan, config.bucket, client_options(target), request.target_topic, source, skipped,
                           read_anchors(client_options(target), name), progress,
                           erased_source_offsets(index, plan))
    click.echo(json.dumps({"group": group, "topic": request.target_topic,
                           "partitions": [{"partition": p, "source": source[p], "target": o}
                                          for p, o in translated.items()]}, indent=2))
    if not dry_run:
        set_offsets(client_options(target), group, request.target_topic, translated)


_COUNTED = {
    "kafka": "the source topic's own count", "operator": "--source-partitions",
    "metastore": "the partitions the backup group committed: the source topic is not on the target's cluster; a "
                 "topic backed up before 2026-12-04 lacks a last partition that never held a record, give "
                 "--source-partitions if it had one",
}


def report_text(report: RestoreReport) -> str:
    """The plan and what was done, for people (``--json`` gives every field)."""
    plan = report.plan
    target = plan.get("target", {})
    until = plan.get("until_ms")
    lines = [f"restore job {report.job}: tenant {plan['tenant']} topic {plan['topic']} (incarnation "
             f"{plan['incarnation'] or '-'}) -> {target.get('topic')} "
             f"({'exists' if target.get('exists') else 'to be created'}, {target.get('partitions')} partitions)",
             f"planned: {plan['records']} records, {plan['bytes']} bytes from {plan['blocks']} blocks"
             + (f", up to {until} ms" if until else ""),
             f"source partitions: {plan.get('source_partitions')} "
             f"({_COUNTED.get(str(plan.get('source_partitions_from')), '')})",
             "PARTITION  OFFSETS          RECORDS  GAPS"]
    outcomes = {o.partition: o for o in report.partitions}
    for part in plan["partitions"]:
        gaps = ", ".join(f"[{g['start']},{g['end']}) {g['reason']}" for g in part["gaps"]) or "-"
        line = f"{part['partition']:>9}  [{part['start']},{part['end']})".ljust(27) + f"{part['records']:>8}  {gaps}"
        done = outcomes.get(part["partition"])
        if done is not None:
            line += f"  -> restored {done.restored}" + (f", stopped: {done.error}" if done.error else "")
        lines.append(line)
    lines += [f"warning: {w}" for w in report.warnings]
    return "\n".join(lines)
