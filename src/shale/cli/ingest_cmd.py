"""``shale ingest``, ``shale verify`` and ``shale ledger``."""

from __future__ import annotations

import click

from shale.cli.common import get_config, shale_errors

INGEST_WHOLLY_QUARANTINED = 4


@click.command(epilog="Exit status with --available-now: 0 when every topic stored records (some may be in "
               "quarantine); 4 when a topic's every record of this run went to quarantine (check its "
               "[[ingest.parsers]] rule; the records are kept, read them with shale query --quarantine); 1 on an "
               "error.")
@click.option("--group", type=click.Choice(["backup", "partition"]), required=True)
@click.option("--topics", help="Comma-separated topics (overrides ingest.topics).")
@click.option("--topic-pattern", help="Regex of topics, new ones picked up while running (overrides config).")
@click.option("--generation", type=int, help="Output generation (overrides ingest.generation).")
@click.option("--available-now", is_flag=True, help="Persist what Kafka holds now, then exit.")
@click.option("--shard", type=click.IntRange(0, 1023), help="Hold this shard of the group (default: the first free "
              "one; a standby of every shard).")
@click.pass_context
@shale_errors
def ingest(ctx: click.Context, group: str, topics: str | None, topic_pattern: str | None, generation: int | None,
           available_now: bool, shard: int | None) -> None:
    """Persist Kafka topics into blocks, exactly once (one streaming query per group). Each batch logs, per topic,
    the records stored and quarantined with the top reasons; --available-now ends with a table of them."""
    from prometheus_client import start_http_server

    from shale.ingest import IngestJob
    from shale.signals import Stopper

    config = get_config(ctx)
    changes: dict[str, object] = {}
    if topics is not None:
        changes.update(topics=[t.strip() for t in topics.split(",") if t.strip()], topic_pattern="")
    if topic_pattern is not None:
        changes.update(topic_pattern=topic_pattern, topics=[])
    if generation is not None:
        changes["generation"] = generation
    if changes:
        config = config.model_copy(update={"ingest": config.ingest.model_validate(
            {**config.ingest.model_dump(), **changes})})
    if config.ingest.metrics_port:
        start_http_server(config.ingest.metrics_port, addr="127.0.0.1")
    job = IngestJob(config, group, shard=shard)
    stopper = Stopper(f"ingest {group}").install()
    job.run(available_now, stop=stopper.event)
    if stopper.signum:
        click.echo(f"ingest {group}: stopped after its last committed batch", err=True)
        ctx.exit(stopper.exit_code)
    if available_now:
        click.echo(job.summary.table())
        wholly = job.summary.wholly_quarantined()
        if wholly:
            click.echo(f"every record of {', '.join(wholly)} went to quarantine in this run (exit "
                       f"{INGEST_WHOLLY_QUARANTINED}): check the [[ingest.parsers]] rule with shale config check",
                       err=True)
            ctx.exit(INGEST_WHOLLY_QUARANTINED)


VERIFY_EXIT = {"OK": 0, "PROBLEMS": 1, "NOT YET": 3, "QUARANTINED": 4, "LOST": 5}
VERIFY_UNCHECKED = 6  # Kafka, the metastore or the bucket did not answer: nothing was judged


@click.command(epilog="Exit status: 0 OK: every record Kafka holds is stored exactly once, as data. "
               "1 PROBLEMS: records missing or stored twice. 2 an unknown topic or a bad option. "
               "3 NOT YET: nothing is wrong, but records Kafka holds are not ingested yet. "
               "4 QUARANTINED: everything stored once, some records in quarantine (shale query --quarantine). "
               "5 LOST: Kafka's retention deleted offsets before the group read them; they will never be stored "
               "(each partition's line names the range and the shale offsets acknowledge-loss command that accepts "
               "it). 6: Kafka, the metastore or the bucket did not answer, so nothing was judged (the message says "
               "which; try again).")
@click.option("--group", type=click.Choice(["backup", "partition"]), required=True)
@click.option("--topic", required=True)
@click.option("--generation", type=int, help="Generation to check (default: ingest.generation).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@shale_errors
def verify(ctx: click.Context, group: str, topic: str, generation: int | None, as_json: bool) -> None:
    """Reconcile Kafka's offsets with the index and the blocks: every record Kafka holds must be stored exactly
    once. The verdict (and the exit status, below) says whether records are missing, not ingested yet, or
    quarantined."""
    import json

    from shale.errors import ConfigError, RetryableError
    from shale.logs import redact
    from shale.metastore import open_index_view, state_path
    from shale.objstore import open_bucket
    from shale.verify import NothingStored, StoredBlocks, verify_topic

    config = get_config(ctx)
    gen = config.ingest.generation if generation is None else generation
    never = config.metastore.mode == "embedded" and not state_path(config).exists()
    try:
        stored: StoredBlocks = NothingStored() if never else open_index_view(config)
        report = verify_topic(stored, open_bucket(config.bucket), config.kafka, group, gen, topic)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    except RetryableError as exc:  # not a verdict on the records: its own exit status, never "missing"
        click.echo(f"could not verify {group} topic {topic}: {redact(str(exc))}", err=True)
        raise SystemExit(VERIFY_UNCHECKED) from None
    if as_json:
        click.echo(json.dumps(report.as_dict()))
    else:
        for p in report.partitions:
            click.echo(f"  partition {p.partition} (incarnation {p.incarnation}): kafka [{p.kafka_earliest},"
                       f"{p.kafka_end}) committed {p.committed_end} stored {p.stored} missing {p.missing} "
                       f"duplicated {p.duplicated} quarantined {p.quarantined} not in Kafka {p.not_in_kafka} "
                       f"offsets without a record {p.skipped} lost {p.lost} not yet ingested {p.not_yet_ingested}"
                       + (f" erased {p.erased} (erasure {', '.join(p.erasures)})" if p.erased else "")
                       + (f" e.g. {p.missing_sample}" if p.missing_sample else ""))
            if p.lost:
                click.echo(f"    lost [{p.committed_end},{p.kafka_earliest}): Kafka's retention deleted these "
                           f"{p.lost} offsets before this group read them, so they will never be stored; ingest "
                           f"waits on this partition until the loss is accepted with: {p.action}")
        click.echo(f"{group} generation {gen} topic {topic}: {report.stored} stored, {report.missing} missing, "
                   f"{report.duplicated} duplicated, {report.quarantined} quarantined, {report.lost} lost, "
                   f"{report.not_yet_ingested} not yet ingested, {report.not_in_kafka} not in Kafka"
                   f"{f', {report.erased} erased' if report.erased else ''}"
                   f"{' (compacted topic)' if report.compacted else ''}: {report.status}")
    if report.status != "OK":
        raise SystemExit(VERIFY_EXIT[report.status])


@click.command()
@click.option("--group", type=click.Choice(["backup", "partition"]), default="partition", show_default=True)
@click.option("--topic", required=True)
@click.option("--dt", "day", help="One day (YYYY-MM-DD).")
@click.option("--generation", type=int)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@shale_errors
def ledger(ctx: click.Context, group: str, topic: str, day: str | None, generation: int | None,
           as_json: bool) -> None:
    """The completeness ledger: committed watermarks per partition and, per day, its blocks and completeness."""
    import datetime as dt
    import json

    from shale.metastore import open_index_view
    from shale.verify import build_ledger

    config = get_config(ctx)
    gen = config.ingest.generation if generation is None else generation
    book = build_ledger(open_index_view(config), group, gen, topic, day)
    if as_json:
        click.echo(json.dumps(book.as_dict()))
        return
    click.echo(f"{group} generation {gen} topic {topic}")
    for w in book.partitions:
        when = dt.datetime.fromtimestamp(w.max_event_time / 1000, dt.UTC).isoformat(timespec="seconds")
        click.echo(f"  partition {w.partition}: committed up to offset {w.committed_end}, event time {when}"
                   + (f", {w.erased} offsets erased (erasure {', '.join(w.erasures)})" if w.erased else ""))
    for d in book.days:
        click.echo(f"  dt={d.dt}: {len(d.blocks)} blocks, {d.rows} rows, {'complete' if d.complete else 'open'}")
