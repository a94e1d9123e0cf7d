"""``shale schemas``: the writer schemas (Schema Registry ids) a tenant's live blocks were written with, each with its
own fingerprint and (``--fields``) its fields, read from the registry."""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import TYPE_CHECKING, Any

import click

from shale.cli.common import get_config, shale_errors

if TYPE_CHECKING:
    from shale.config import ShaleConfig
    from shale.index import SchemaVersionRow


@click.command()
@click.option("--tenant", required=True)
@click.option("--topic", default=None, help="Only this topic.")
@click.option("--fields", "with_fields", is_flag=True, help="Add each schema id's top-level fields: the columns its "
              "records fill (a field renamed between versions fills one column per name).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.pass_context
@shale_errors
def schemas(ctx: click.Context, tenant: str, topic: str | None, with_fields: bool, as_json: bool) -> None:
    """List the schema versions of a tenant's topics, as the metastore indexes them: per topic, the record type
    (topics stored per record type: subject_name_strategy record or topic_record; '-' otherwise), Schema Registry id,
    the version's own fingerprint (read from the schema registry: '-' without one, '?' when it does not say), the
    fingerprint the rows are stored under (the reader schema of their chunks: the newest the chunk held), group and
    generation, the live blocks and their data-time range (typed parsers: avro, protobuf, json_schema). `shale
    reprocess --schema-id` reads a range again as one of them."""
    from shale.metastore import open_index_view

    config = get_config(ctx)
    rows = open_index_view(config).schema_versions(tenant, topic)
    own = _Versions(config, rows)
    if as_json:
        for r in rows:
            fingerprint, fields = own.of(r)
            extra: dict[str, Any] = {"version_fingerprint": fingerprint}
            if with_fields:
                extra["fields"] = fields
            click.echo(json.dumps({**r.model_dump(mode="json"), **extra}))
        own.report()
        return
    header = ("TOPIC", "RECORD", "SCHEMA ID", "FINGERPRINT", "STORED AS", "GROUP", "GEN", "BLOCKS", "FROM (UTC)",
              "TO (UTC)") + (("FIELDS",) if with_fields else ())
    lines = [header]
    for r in rows:
        fingerprint, fields = own.of(r)
        lines.append((r.topic, r.record or "-", str(r.schema_id), fingerprint, r.fingerprint or "-", r.group,
                      str(r.generation), str(r.blocks), _ts(r.min_time), _ts(r.max_time))
                     + ((",".join(fields) if fields is not None else "?",) if with_fields else ()))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        click.echo("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
    if not rows:
        click.echo(f"no blocks of tenant {tenant!r} were written by a typed parser", err=True)
    own.report()


Typed = tuple[str | None, str, list[str]]
"""A message (Protobuf: its full name; None for the other formats), its fingerprint and its top-level fields."""


class _Versions:
    """Each schema id's own fingerprint and top-level fields, as the topic's typed parser types a chunk of that
    version alone (its fingerprint is then the version's own, whatever else the chunks its records were stored in
    held), read from the registry (each id once). A Protobuf file may declare several messages: the topic's is its
    record type, else the one whose fingerprint some version's rows are stored under, else the file's only one."""

    def __init__(self, config: ShaleConfig, rows: list[SchemaVersionRow]) -> None:
        self.config = config
        self.rows = rows
        self.problem = ""
        self.unconfigured = False
        self._typed: dict[tuple[str, int], list[Typed]] = {}

    def of(self, row: SchemaVersionRow) -> tuple[str, list[str] | None]:
        typed = self._types(row.topic, row.schema_id)
        if not typed:
            return ("-" if self.unconfigured else "?"), None
        names = {row.record} if row.record else self._stored_names(row)
        chosen = [t for t in typed if t[0] is None or t[0] in names] if names else typed
        if len(chosen) != 1:
            return "?", None
        return chosen[0][1], chosen[0][2]

    def _stored_names(self, row: SchemaVersionRow) -> set[str | None]:
        """The messages some version of ``row``'s topic has its rows stored under (its fingerprint is theirs)."""
        return {t[0] for other in self.rows if other.topic == row.topic and other.record == row.record
                for t in self._types(other.topic, other.schema_id) if t[1] == other.fingerprint}

    def report(self) -> None:
        if self.problem:
            click.echo(f"note: the versions' own fingerprints and fields are not all known: {self.problem}", err=True)

    def _types(self, topic: str, schema_id: int) -> list[Typed]:
        if (topic, schema_id) not in self._typed:
            self._typed[(topic, schema_id)] = self._read(topic, schema_id)
        return self._typed[(topic, schema_id)]

    def _read(self, topic: str, schema_id: int) -> list[Typed]:
        from shale.encoder import RegistryParser, load_parser
        from shale.errors import RetryableError
        from shale.schemas import frame

        ingest = self.config.ingest
        if not ingest.schema_registry.url:
            self.unconfigured = True  # '-' says so; no note
            return []
        rule = next((r for r in ingest.parsers if re.fullmatch(r.topic_pattern, topic)), None)
        options = {k: v for k, v in (rule.options if rule is not None else {}).items() if k != "reader_schema_id"}
        parser = load_parser(rule.parser, options) if rule is not None else None
        if not isinstance(parser, RegistryParser):
            self.problem = f"topic {topic!r} has no typed parser rule in ingest.parsers"
            return []
        parser.bind(ingest)
        protobuf = parser.schema_type == "PROTOBUF"
        # Protobuf: the message-index array [i] (zigzag varints) of each of the file's first 64 messages.
        headers = [frame(schema_id, bytes([2, 2 * i])) for i in range(64)] if protobuf else [frame(schema_id, b"")]
        typed: list[Typed] = []
        try:
            for header in headers:
                name = parser.types_of([header])[0] if protobuf else None
                if protobuf and name is None:
                    break  # past the file's last message (or a file that does not load)
                parser.prepare([header])
                ids, fingerprint = parser.schema_info()
                if ids:  # else a schema (or message) the parser cannot type: its records are quarantined
                    typed.append((name, fingerprint, [c.removeprefix(parser.prefix) for c in parser.columns()]))
        except RetryableError as exc:
            self.problem = str(exc)
        return typed


def _ts(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
