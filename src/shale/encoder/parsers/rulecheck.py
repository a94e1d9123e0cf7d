"""Checking the typed parser rules against the Schema Registry before any record is read (``shale config check``,
and the partition group's ingest at start).

A typed rule (``avro``, ``protobuf``, ``json_schema``) names fields of a schema the configuration does not hold: its
``time_field`` and ``label_fields``. A misspelled one passes the configuration's own validation and quarantines every
record. So for each topic of ``ingest.topics`` a typed rule reads under ``subject_name_strategy = "topic"``, every
version of the subject ``<topic>-value`` is read and typed by the rule's own parser (as a chunk of that version
would be; a Protobuf file's records may be of any of its top-level messages, and one that fits is enough), and the
rule is checked against it: the time field exists and is a timestamp or an integer of epoch
milliseconds, each label field exists and is a string (or an enum, stored as one). A problem in the subject's newest
version is an error (the records written now would be quarantined); in an older version, a note (its records,
if any are left in Kafka, would be). Each finding names the topic, the subject, the version and the schema id.
For a ``protobuf`` rule (with or without fields to check), a top-level field that two consecutive versions declare
under one number and two names is a note too: a rename, whose records fill two columns (each its writer's name's);
for an ``avro`` rule, a top-level field a version declares with an alias naming a field of the version before (a
rename with ``aliases``), likewise.

Not checked: topics only a ``topic_pattern`` matches (they are not known without Kafka), the ``record`` and
``topic_record`` strategies (subjects are named by record type, not by topic), a subject not registered yet (a
note), and a Protobuf file's nested messages. ``RegistryUnavailableError`` (the registry does not
answer usefully) propagates: the caller says so, as it would for a record.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable
from dataclasses import dataclass

import pyarrow as pa

from shale.config import IngestConfig
from shale.encoder.parsers import load_parser
from shale.encoder.parsers.base import ParseError
from shale.encoder.parsers.registryparser import RegistryParser
from shale.errors import ConfigError
from shale.schemas import RegisteredSchema, SchemaError, UnknownSchemaError, avro, frame, protobuf

MAX_MESSAGES = 64
"""A Protobuf file's first top-level messages the check tries (their index fits in one byte)."""


@dataclass(frozen=True)
class Finding:
    error: bool
    """True: the rule does not fit the subject's newest version (its records would be quarantined)."""
    message: str


def check_typed_rules(ingest: IngestConfig, topics: Iterable[str]) -> list[Finding]:
    """What the registry's schemas say of the typed rules that read ``topics`` (see the module)."""
    findings: list[Finding] = []
    for topic in topics:
        rule = next((r for r in ingest.parsers if re.fullmatch(r.topic_pattern, topic)), None)
        parser = load_parser(rule.parser, dict(rule.options)) if rule is not None else None
        if not isinstance(parser, RegistryParser):
            continue
        fields_named = bool(parser.time_path or parser.label_names)
        if not fields_named and parser.schema_type not in ("PROTOBUF", "AVRO"):
            continue
        parser.bind(ingest)
        if parser.by_record:
            continue
        subject = f"{topic}-value"
        try:
            versions = parser.registry.versions(subject)
        except UnknownSchemaError:
            findings.append(Finding(False, f"topic {topic!r}: subject {subject!r} is not in the schema registry yet "
                                    "(nothing produced, or the producers use another subject name strategy); the "
                                    f"{parser.name} rule is not checked against it"))
            continue
        registered = {version: parser.registry.version(subject, version) for version in versions}
        for version in versions if fields_named else []:
            for problem in rule_problems(parser, registered[version]):
                findings.append(Finding(version == versions[-1], f"topic {topic!r}, subject {subject!r} version "
                                        f"{version} (schema id {registered[version].id}): {problem}"))
        if parser.schema_type == "PROTOBUF":
            findings.extend(Finding(False, f"topic {topic!r}, subject {subject!r}: {rename}")
                            for rename in protobuf_renames(parser, registered))
        if parser.schema_type == "AVRO":
            findings.extend(Finding(False, f"topic {topic!r}, subject {subject!r}: {rename}")
                            for rename in avro_renames(registered))
    return findings


def protobuf_renames(parser: RegistryParser, versions: dict[int, RegisteredSchema]) -> list[str]:
    """Each top-level field of a message that two consecutive versions of a subject (version -> schema) declare
    under one number and two names: a rename, whose records are stored in two columns (each record in its writer's
    name's). Versions that do not load are left out (``rule_problems`` and their records say why)."""
    fields: list[tuple[int, int, dict[tuple[str, int], str]]] = []
    for version, registered in sorted(versions.items()):
        parser.registry.remember(registered)
        try:
            file = protobuf.load(parser.registry, registered).file
        except (SchemaError, UnknownSchemaError):
            continue
        fields.append((version, registered.id, {(m.full_name, f.number): f.name
                                                for m in file.message_types_by_name.values() for f in m.fields}))
    notes = []
    for (old, old_id, before), (new, new_id, after) in itertools.pairwise(fields):
        for (message, number), name in sorted(after.items()):
            was = before.get((message, number))
            if was is not None and was != name:
                notes.append(f"message {message} field number {number} is {was!r} in version {old} (schema id "
                             f"{old_id}) and {name!r} from version {new} (schema id {new_id}): a rename; each record "
                             f"is stored in the column of its writer's field name, so records written with version "
                             f"{old} fill {was!r} and those written with version {new} fill {name!r} (`shale schemas "
                             "--fields` lists the fields, the columns, of each schema id)")
    return notes


def avro_renames(versions: dict[int, RegisteredSchema]) -> list[str]:
    """Each top-level field of a record that a version of a subject (version -> schema) declares with an alias
    naming a field of the version before, which it does not declare itself: a rename with ``aliases``, whose
    records are stored in two columns (each record in its writer's name's)."""
    fields: list[tuple[int, int, str, dict[str, tuple[str, ...]]]] = []
    for version, registered in sorted(versions.items()):
        if registered.schema_type != "AVRO":
            continue
        try:
            record = avro.tree(avro.parse(registered.text))
        except SchemaError:
            continue
        declared = record.get("fields") if isinstance(record, dict) else None
        fields.append((version, registered.id, avro.full_name(registered.text), {
            str(f["name"]): tuple(map(str, f.get("aliases") or [])) for f in declared or []
            if isinstance(f, dict) and "name" in f}))
    notes = []
    for (old, old_id, _, before), (new, new_id, record, after) in itertools.pairwise(fields):
        for name, aliases in after.items():
            for was in (a for a in aliases if a in before and a not in after):
                notes.append(f"record {record} field {was!r} of version {old} (schema id {old_id}) is {name!r} "
                             f"(aliases {was!r}) from version {new} (schema id {new_id}): a rename; each record is "
                             f"stored in the column of its writer's field name, so records written with version "
                             f"{old} fill {was!r} and those written with version {new} fill {name!r} (`shale schemas "
                             "--fields` lists the fields, the columns, of each schema id)")
    return notes


def raise_for_errors(findings: list[Finding]) -> None:
    """``ConfigError`` listing the findings that are errors, if any."""
    errors = [f.message for f in findings if f.error]
    if errors:
        raise ConfigError("the typed parser rules do not fit the schema registry's schemas (every record written "
                          "with them would be quarantined); fix the [[ingest.parsers]] options:\n  "
                          + "\n  ".join(errors))


def rule_problems(parser: RegistryParser, registered: RegisteredSchema) -> list[str]:
    """Why ``parser``'s time field and label fields do not fit records written with ``registered``. A Protobuf
    file may hold several messages and its records may be of any of them: the rule fits when one of its top-level
    messages fits."""
    parser.registry.remember(registered)
    if parser.schema_type != "PROTOBUF":
        return _message_problems(parser, frame(registered.id, b"\x00"))
    try:
        names = list(protobuf.load(parser.registry, registered).file.message_types_by_name)
    except (SchemaError, UnknownSchemaError) as exc:
        return [f"the {parser.name} parser cannot load it ({exc}); every record written with it is quarantined"]
    # The message-index array [i], zigzag varints: its length 1, then i (one byte each below 64).
    found = [(name, _message_problems(parser, frame(registered.id, bytes([2, 2 * i]))))
             for i, name in enumerate(names[:MAX_MESSAGES])]
    if any(not problems for _, problems in found):
        return []
    return [f"message {name}: {problem}" for name, problems in found for problem in problems]


def _message_problems(parser: RegistryParser, header: bytes) -> list[str]:
    """Why the rule does not fit records framed with ``header`` (a schema id and, for Protobuf, a message)."""
    parser.prepare([header])
    columns = parser.columns()
    if not columns:
        try:
            parser.parse(header, 0)
            reason = "no columns"
        except ParseError as exc:
            reason = str(exc)
        return [f"the {parser.name} parser cannot type it ({reason}); every record written with it is quarantined"]
    fields = {name.removeprefix(parser.prefix): kind for name, kind in columns.items()}
    known = f"(its fields: {', '.join(sorted(fields))})"
    problems = []
    if parser.time_path:
        path = ".".join(parser.time_path)
        kind = _type_at(fields, parser.time_path)
        if kind is None:
            problems.append(f"time_field {path!r} is not a field of it {known}")
        elif not (pa.types.is_timestamp(kind) or pa.types.is_integer(kind)):
            problems.append(f"time_field {path!r} is {kind}, not a timestamp or an integer of epoch milliseconds")
    for column in parser.label_names:
        name = column.removeprefix(parser.prefix)
        kind = fields.get(name)
        if kind is None:
            problems.append(f"label field {name!r} is not a field of it {known}")
        elif not _stringlike(kind):
            problems.append(f"label field {name!r} is {kind}, not a string or an enum")
    return problems


def _type_at(fields: dict[str, pa.DataType], path: list[str]) -> pa.DataType | None:
    found: pa.DataType | None = fields.get(path[0])
    for part in path[1:]:
        if found is None or not pa.types.is_struct(found) or found.get_field_index(part) < 0:
            return None
        found = found.field(part).type
    return found


def _stringlike(kind: pa.DataType) -> bool:
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return bool(pa.types.is_string(kind) or pa.types.is_large_string(kind))
