"""``shale config check | show | explain | cost``."""

from __future__ import annotations

import json

import click

from shale.cli.common import get_config, shale_errors
from shale.config import ShaleConfig, masked


@click.group()
def config() -> None:
    """Check and show the configuration."""


@config.command()
@click.option("--defaults", is_flag=True, help="Print every key with its default value and description.")
@click.pass_context
@shale_errors
def check(ctx: click.Context, defaults: bool) -> None:
    """Validate the configuration (file, environment, --set); exit 1 naming every bad key. The typed parser rules
    (avro, protobuf, json_schema) of ingest.topics are checked against the Schema Registry too: their time field
    and label fields must exist in each subject's newest version with a fitting type."""
    if defaults:
        _print_defaults()
        return
    from shale.encoder import check_typed_rules, raise_for_errors
    from shale.errors import ConfigError
    from shale.schemas import RegistryUnavailableError

    config = get_config(ctx)
    try:
        findings = check_typed_rules(config.ingest, config.ingest.topics)
    except RegistryUnavailableError as exc:
        raise ConfigError(f"the typed parser rules could not be checked against the schema registry: {exc}") from None
    for finding in findings:
        if not finding.error:
            click.echo(f"note: {finding.message}")
    raise_for_errors(findings)
    click.echo("configuration is valid")


@config.command()
@click.argument("key", required=False, default="")
@click.option("--markdown", is_flag=True, help="Print the whole reference as Markdown (docs/CONFIG.md).")
def explain(key: str, markdown: bool) -> None:
    """Every field under KEY (a section such as ingest, a rule list such as ingest.parsers, or one key) with its
    type, default and meaning; ingest.parsers lists each installed parser's options."""
    from shale.config import explain_key, render_markdown, render_text

    if markdown:
        click.echo(render_markdown(), nl=False)
        return
    try:
        click.echo(render_text(explain_key(key)))
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None


@config.command()
@click.pass_context
@shale_errors
def show(ctx: click.Context) -> None:
    """Print the effective configuration as JSON (secrets masked)."""
    click.echo(json.dumps(masked(get_config(ctx)), indent=2))


@config.command()
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), required=True, help="records a second")
@click.option("--record-bytes", type=click.IntRange(min=1), default=1024, show_default=True,
              help="a record's size as Kafka holds it (key, value and headers)")
@click.option("--partitions", type=click.IntRange(min=1), required=True, help="partitions of every topic together")
@click.option("--topics", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--tenants", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--cores", type=click.IntRange(min=1), default=None,
              help="Spark cores of each ingest group's application [default: this machine's]")
@click.option("--quarantine", is_flag=True, help="some records of every partition-group chunk do not parse")
@click.option("--batch-seconds", "batch_seconds", multiple=True, metavar="GROUP=SECONDS",
              help="a group that is behind: its measured batch time (shale_ingest_batch_seconds), used where it "
                   "is longer than the trigger; repeatable")
@click.option("--json", "as_json", is_flag=True, help="print the lines as JSON")
@click.pass_context
@shale_errors
def cost(ctx: click.Context, rate: float, record_bytes: int, partitions: int, topics: int, tenants: int,
         cores: int | None, quarantine: bool, batch_seconds: tuple[str, ...], as_json: bool) -> None:
    """Forecast the objects and bucket requests an hour of this configuration under a steady stream, by kind of
    object (docs/OPERATING.md, "What the bucket costs"). Readers' requests and the metastore's bucket scan are not
    included."""
    import os

    from shale.cost import Load, forecast, total

    measured: dict[str, float] = {}
    for item in batch_seconds:
        group, _, value = item.partition("=")
        try:
            measured[group] = float(value)
        except ValueError:
            raise click.BadParameter(f"{item!r}: write GROUP=SECONDS, e.g. partition=9.5",
                                     param_hint="--batch-seconds") from None
        if group not in ("partition", "backup"):
            raise click.BadParameter(f"{group!r} is not an ingest group (partition, backup)",
                                     param_hint="--batch-seconds")
    try:
        load = Load(rate, record_bytes, partitions, cores or os.cpu_count() or 1, topics, tenants, quarantine)
        lines = forecast(get_config(ctx), load, measured)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    lines.append(total(lines))
    if as_json:
        click.echo(json.dumps([line.as_dict() for line in lines], indent=2))
        return
    width = max(len(line.kind) for line in lines)
    # The requests by the operation names of shale_objstore_requests_total.
    click.echo(f"{'an hour':<{width}}  {'objects':>9} {'put':>9} {'get':>9} {'list':>7} {'delete':>9}")
    for line in lines:
        click.echo(f"{line.kind:<{width}}  {line.objects:>9,.0f} {line.put:>9,.0f} {line.get:>9,.0f} "
                   f"{line.list:>7,.0f} {line.delete:>9,.0f}")


_RULE_LISTS = ("ingest.parsers", "ingest.tenants", "metastore.members")


def _print_defaults(model: type | None = None, prefix: str = "") -> None:
    model = model or ShaleConfig
    for name, field in model.model_fields.items():  # type: ignore[attr-defined]
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, ShaleConfig.__mro__[1]):
            click.echo(f"[{prefix}{name}]")
            _print_defaults(annotation, f"{prefix}{name}.")
            continue
        default = masked(field.get_default(call_default_factory=True))
        note = f"  # {field.description}" if field.description else ""
        click.echo(f"{name} = {json.dumps(default, default=str)}{note}")
        if default == [] and f"{prefix}{name}" in _RULE_LISTS:  # the shape of a rule, which the empty list hides
            from shale.config import explain_key

            click.echo(f"# each [[{prefix}{name}]] rule (`shale config explain {prefix}{name}`):")
            for entry in explain_key(f"{prefix}{name}")[1:]:
                click.echo(f"#   {entry.key.removeprefix(prefix + name + '.')}: {entry.type}"
                           + (f", default {entry.default}" if entry.default else "") + f"; {entry.meaning}")
