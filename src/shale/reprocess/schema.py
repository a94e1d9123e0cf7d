"""Version rewinding (seed 002): a reprocess run that names the reader schema every record is read as.

The user names a registry schema by id (``--schema-id``) or by subject and version (``--schema-subject``,
``--schema-version``, a number or ``latest``). The driver resolves it through the registry's Confluent-compatible
API once, checks it fits the parser (a registry parser of the same format, a schema the parser can store), and
hands it typed to the executors with the schemas it references (``KnownSchemas`` in the round's spec): each
executor remembers them in its process's cache, so no task asks the registry for them. The parser option
``reader_schema_id`` then makes every record be read as that schema (see the typed parsers' modules for what that
means per format); records that cannot be are quarantined with the reason, never dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shale.config import SchemaRegistryConfig
from shale.encoder import ParseError, RegistryParser, load_parser
from shale.errors import ConfigError
from shale.schemas import KnownSchemas, RegistryClient, UnknownSchemaError, frame, with_references


@dataclass(frozen=True)
class ReaderSchema:
    """The reader schema a user named: an id, or a subject and version (a number or ``latest``)."""

    schema_id: int = 0
    subject: str = ""
    version: str = ""

    def describe(self) -> str:
        return f"schema id {self.schema_id}" if self.schema_id else f"subject {self.subject!r} version {self.version}"


def resolve_reader(registry: SchemaRegistryConfig, parser: str, options: dict[str, Any],
                   named: ReaderSchema) -> tuple[dict[str, Any], KnownSchemas]:
    """The parser options with ``reader_schema_id`` set, and the schemas the executors remember; ``ConfigError``
    when the name is ambiguous, does not exist, or does not fit the parser (``RegistryUnavailableError`` when the
    registry does not answer)."""
    if bool(named.schema_id) == bool(named.subject or named.version):
        raise ConfigError("name the reader schema either by --schema-id, or by --schema-subject and "
                          "--schema-version, not both")
    if not named.schema_id and not (named.subject and named.version):
        raise ConfigError("--schema-subject and --schema-version go together")
    if "reader_schema_id" in options:
        raise ConfigError("the reader schema is named twice: by --schema-id/--schema-subject and by the parser "
                          "option reader_schema_id; keep one")
    probe = load_parser(parser, options)
    if not isinstance(probe, RegistryParser):
        raise ConfigError(f"parser {parser} reads no registry schemas, so it takes no named reader schema: use avro, "
                          "protobuf or json_schema (a parser version is named by the parser and its options)")
    client = RegistryClient(registry)
    try:
        schema = (client.schema(named.schema_id) if named.schema_id
                  else client.version(named.subject, named.version))
    except UnknownSchemaError as exc:
        raise ConfigError(f"the named reader schema: {exc}") from None
    if schema.schema_type != probe.schema_type:
        raise ConfigError(f"the named reader schema ({named.describe()}, id {schema.id}) is a {schema.schema_type} "
                          f"schema; parser {parser} reads {probe.schema_type}")
    known = with_references(client, schema)
    pinned = {**options, "reader_schema_id": schema.id}
    _check(parser, pinned, registry, schema.id)
    return pinned, known


def _check(parser: str, options: dict[str, Any], registry: SchemaRegistryConfig, sid: int) -> None:
    """Fail now, in the driver, when the parser cannot store records under the named schema (not a record, no
    Arrow type, a field named like a built-in column; a Protobuf file that does not load): a record written with
    the named schema itself would be quarantined for it."""
    probe = load_parser(parser, options)
    assert isinstance(probe, RegistryParser)
    probe.registry_config = registry
    header = frame(sid, b"\x00")  # a Protobuf record's message-index array [0]: the file's first message
    probe.prepare([header])
    if probe.columns():
        return
    try:
        probe.parse(header, 0)
    except ParseError as exc:
        if probe.schema_type == "PROTOBUF" and not exc.reason.startswith("the named reader schema"):
            return  # about the file's first message, which need not be the topic's
        raise ConfigError(f"the named reader schema id {sid} cannot be used by parser {parser}: {exc.reason}") \
            from None
