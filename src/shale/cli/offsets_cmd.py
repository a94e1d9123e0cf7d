"""``shale offsets show | acknowledge-loss``: committed offsets per topic incarnation, and the one way to accept
offsets Kafka deleted before Shale read them."""

from __future__ import annotations

import json
import logging

import click

from shale.cli.common import get_config, shale_errors

log = logging.getLogger(__name__)


@click.group()
def offsets() -> None:
    """Committed offsets, topic incarnations and acknowledged losses."""


@offsets.command("show")
@click.option("--group", type=click.Choice(["backup", "partition"]))
@click.option("--generation", type=int)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@shale_errors
def show(ctx: click.Context, group: str | None, generation: int | None, as_json: bool) -> None:
    """Each partition's committed end in its current incarnation, past incarnations and acknowledged losses."""
    from shale.metastore import open_index_view

    metastore = open_index_view(get_config(ctx))
    current = metastore.offsets(group, generation)
    incarnations, losses = metastore.offset_history(group, generation)
    if as_json:
        click.echo(json.dumps({"offsets": [o.model_dump() for o in current],
                               "incarnations": [i.model_dump() for i in incarnations],
                               "losses": [x.model_dump() for x in losses]}, indent=2))
        return
    for o in current:
        click.echo(f"{o.group} g{o.generation} {o.topic}[{o.partition}] incarnation {o.incarnation or '-'}: "
                   f"committed up to {o.committed_end} ({o.skipped} offsets without a record), writer "
                   f"{o.writer or '-'}")
    for i in incarnations:
        click.echo(f"  past incarnation {i.group} g{i.generation} {i.topic}[{i.partition}] {i.incarnation}: ended at "
                   f"offset {i.committed_end}")
    for x in losses:
        click.echo(f"  lost {x.group} g{x.generation} {x.topic}[{x.partition}] [{x.start},{x.end}): {x.reason}")


@offsets.command("acknowledge-loss")
@click.option("--group", type=click.Choice(["backup", "partition"]), required=True)
@click.option("--topic", required=True)
@click.option("--partition", type=int, required=True)
@click.option("--to", "to", type=int, required=True, help="Kafka's earliest offset now: the end of the lost range.")
@click.option("--generation", type=int, help="Default: ingest.generation.")
@click.option("--reason", default="", help="Kept with the loss (who, why).")
@click.pass_context
@shale_errors
def acknowledge_loss(ctx: click.Context, group: str, topic: str, partition: int, to: int, generation: int | None,
                     reason: str) -> None:
    """Accept that Kafka deleted offsets [committed end, TO) of one partition before they were read: ingestion of
    the partition continues at TO, and the loss is recorded."""
    from shale.kafka import describe_topics, offset_bounds
    from shale.metastore import AcknowledgeOffsetLoss, DeadLetterQueue, open_metastore
    from shale.objstore import open_bucket

    config = get_config(ctx)
    gen = config.ingest.generation if generation is None else generation
    metastore = open_metastore(config)
    state = describe_topics(config.kafka, [topic]).get(topic)
    if state is None or partition not in state.partitions:
        raise click.ClickException(f"{topic}[{partition}] does not exist in Kafka")
    earliest, _ = offset_bounds(config.kafka, [(topic, partition)])[(topic, partition)]
    if to > earliest:
        raise click.ClickException(f"offsets [{earliest},{to}) of {topic}[{partition}] are still in Kafka: only "
                                   f"offsets below Kafka's earliest offset ({earliest}) can be lost")
    row = next((o for o in metastore.offsets(group, gen) if (o.topic, o.partition) == (topic, partition)), None)
    if row is None or row.incarnation not in ("", state.incarnation):
        raise click.ClickException(f"{group} generation {gen} has no committed offsets for {topic}[{partition}] in "
                                   "its current incarnation: nothing was lost, ingestion starts at Kafka's earliest")
    holders = DeadLetterQueue(open_bucket(config.bucket)).holding(group, gen, topic, partition, row.committed_end, to)
    if holders:
        raise click.ClickException(
            f"offsets [{row.committed_end},{to}) of {topic}[{partition}] are held by dead letter commits whose blocks "
            f"are their only copy (Kafka deleted them): {', '.join(holders)}. Acknowledging the loss would make "
            "those blocks garbage. A queued one applies once the metastore replays it: wait, then look again. A "
            "rejected one says why on its last line and is kept with its blocks (docs/DESIGN.md 9.4); to give "
            "its records up anyway, delete it and run this command again")
    result = metastore.submit(AcknowledgeOffsetLoss(
        group=group, generation=gen, topic=topic, partition=partition, incarnation=state.incarnation,
        start=row.committed_end, end=to, reason=reason or "acknowledged with shale offsets acknowledge-loss"))
    result.raise_for_rejection()
    log.warning("offset loss acknowledged", extra={"group": group, "generation": gen, "topic": topic,
                                                   "partition": partition, "lost_from": row.committed_end,
                                                   "lost_to": to, "reason": reason})
    click.echo(f"{group} generation {gen} {topic}[{partition}]: offsets [{row.committed_end},{to}) acknowledged as "
               f"lost; ingestion continues at {to}")
