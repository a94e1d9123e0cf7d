"""``shale compact``: run a compaction worker (a Spark application), or administer the compaction service."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from shale.cli.common import get_config, shale_errors

if TYPE_CHECKING:
    from shale.config import CompactionConfig


@click.command()
@click.option("--until-idle", is_flag=True, help="Exit once no job runs and none is handed out.")
@click.option("--jobs", "show_jobs", is_flag=True, help="Print the compaction jobs and queues, then exit.")
@click.option("--set-failure-limit", type=int, help="Set the failures after which a job is excluded, then exit.")
@click.option("--save-reports", type=click.Path(file_okay=False, path_type=Path),
              help="Keep a copy of every success report sent (for audits and fault tests).")
@click.pass_context
@shale_errors
def compact(ctx: click.Context, until_idle: bool, show_jobs: bool, set_failure_limit: int | None,
            save_reports: Path | None) -> None:
    """Poll the metastore for compaction jobs and merge blocks on Spark (seed 003's worker)."""
    from shale.metastore import SetCompactionFailureLimit, open_index_view, open_metastore

    config = get_config(ctx)
    if show_jobs:
        view = open_index_view(config)
        click.echo(json.dumps({"jobs": view.compaction_jobs(), "queue": view.compaction_queue()}, indent=2))
        return
    metastore = open_metastore(config)
    if set_failure_limit is not None:
        result = metastore.submit(SetCompactionFailureLimit(limit=set_failure_limit))
        click.echo(f"compaction failure limit set to {result.data['limit']}")
        return
    from shale.compactor import CompactionWorker
    from shale.signals import Stopper
    from shale.spark import spark_session

    if config.compaction.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(config.compaction.metrics_port, addr="127.0.0.1")
    spark = spark_session("shale-compact", config.spark, kafka=False, bucket=config.bucket)
    worker = CompactionWorker(metastore, config.bucket, spark, slots=config.compaction.slots,
                              poll_interval=config.compaction.poll_interval, save_reports=save_reports,
                              deltas=config.bucket_index.deltas)
    click.echo(f"compaction worker {worker.worker_id} with {worker.slots} slots", err=True)
    stopper = Stopper("compaction worker").install()
    worker.run(stopper.event, until_idle=until_idle)
    click.echo(f"compaction worker {worker.worker_id} finished {len(worker.completed)} jobs", err=True)
    if stopper.signum:
        ctx.exit(stopper.exit_code)
    if until_idle:
        click.echo(idle_reason(metastore.compaction_queue(), config.compaction), err=True)


def idle_reason(queue: dict[str, int], config: CompactionConfig) -> str:
    """Why no further job is handed out, from the blocks waiting per ``<tenant>/L<level>``: pure."""
    if not queue:
        return "no block waits for compaction"
    waiting = ", ".join(f"{name}: {count}" for name, count in sorted(queue.items()))
    levels = sorted({int(name.rsplit("/L", 1)[1]) for name in queue})
    counts = " / ".join(f"level {level} at {config.blocks_per_job[min(level, len(config.blocks_per_job) - 1)]}"
                        for level in levels)
    return (f"{sum(queue.values())} blocks wait for a job ({waiting}); a queue closes a job at its block count "
            f"({counts} blocks of one tenant, shard, group and generation), at {config.job_byte_limit} "
            f"uncompressed bytes, or once its oldest block has waited compaction.max_age ({config.max_age:g} s, "
            "with at least two blocks)")
