"""``json_schema``: JSON values in the Confluent wire format (magic byte, schema id, JSON text), their JSON Schemas read
from a Schema Registry; every property of the object schema becomes a TYPED column (``shale.schemas.jsonschema``
maps the types).

Per chunk, ``prepare`` fetches the schemas of the chunk's ids it has not cached and takes the newest (highest id) as
the chunk's columns, among the schemas of the chunk's record type (the ``title`` most of its records' schemas carry;
records of other titles are quarantined, unless the option ``subject_name_strategy`` is record or topic_record: then
``record_types`` names each record's title and the chunk is prepared and parsed once per title). Each record is
validated against the schema it was written with (its own id): a value that does not validate is quarantined with
the validator's reason, as are records without the magic byte and with an id the registry says does not exist. A
valid record of an older version is converted into the newest version's columns by property name: a property it
lacks is null, one the newest lacks is dropped, and one whose type changed so that its value no longer fits the
column is quarantined by the block writer with the reason.

With the option ``reader_schema_id`` (a named reader schema: ``shale reprocess --schema-id``), the named schema
gives the columns and every record is validated and converted by it instead of by its own writer schema (which must
still exist in the registry); a record the named schema refuses is quarantined with the validator's reason.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, ClassVar

import pyarrow as pa

from shale.encoder.parsers.base import ParseError
from shale.encoder.parsers.registryparser import ONE_TYPE, RegistryOptions, RegistryParser
from shale.schemas import FramingError, SchemaError, id_counts, jsonschema, payload, schema_id


class JsonSchemaOptions(RegistryOptions):
    """Options of ``json_schema``."""


class JsonSchemaParser(RegistryParser):
    """Confluent-framed JSON; its options are ``JsonSchemaOptions``; the registry is ``ingest.schema_registry``."""

    name = "json_schema"
    options_model = JsonSchemaOptions
    schema_type: ClassVar[str] = "JSON"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._decoders: dict[int, jsonschema.Decoder | str] = {}
        self._problems: dict[int, str] = {}
        self._named: jsonschema.Decoder | None = None
        self._reader: jsonschema.Decoder | None = None

    def _decoder(self, sid: int, text: str) -> jsonschema.Decoder | str:
        found = self._decoders.get(sid)
        if found is None:
            try:
                found = jsonschema.Decoder(text)
            except SchemaError as exc:
                found = f"schema id {sid}: {exc}"
            if not isinstance(found, str) and not pa.types.is_struct(found.arrow):
                found = f"schema id {sid} does not describe an object with properties"
            self._decoders[sid] = found
        return found

    def prepare(self, headers: list[bytes | None]) -> None:
        self._problems, self._named, self._reader = {}, None, None
        self.clear()
        usable = []
        counts = id_counts(headers)
        for registered in self.fetch(set(counts), self._problems):
            decoder = self._decoder(registered.id, registered.text)
            if isinstance(decoder, str):
                self._problems[registered.id] = decoder
            else:
                usable.append((registered.id, decoder))
        if not usable:
            return
        named = self.named_reader()  # a named reader schema replaces the chunk's newest and each record's own
        if named is None:
            usable = self._main_type(usable, counts)
        reader = named if isinstance(named, str) else usable[-1][1] if named is None else \
            self._decoder(named.id, named.text)
        if isinstance(reader, str):
            self._problems.update({sid: reader for sid, _ in usable})
            return
        self._named = reader if named is not None else None
        self._reader = reader
        newest = reader
        problem = self.set_columns(newest.arrow)
        if problem is not None:
            self._problems.update({sid: problem for sid, _ in usable})
            return
        self.fingerprint = jsonschema.fingerprint(newest.schema)
        self.schema_ids = [sid for sid, _ in usable]

    def types_of(self, headers: list[bytes | None]) -> list[str | None]:
        """Each record's schema ``title`` (None: a schema without one, or one that cannot be read)."""
        titles: dict[int, str | None] = {}
        for registered in self.fetch(set(id_counts(headers)), {}):
            decoder = self._decoder(registered.id, registered.text)
            titles[registered.id] = None if isinstance(decoder, str) else _title(decoder) or None
        out: list[str | None] = []
        for value in headers:
            try:
                out.append(titles.get(schema_id(value)))
            except FramingError:
                out.append(None)
        return out

    def _main_type(self, usable: list[tuple[int, jsonschema.Decoder]],
                   counts: Counter[int]) -> list[tuple[int, jsonschema.Decoder]]:
        """The schemas of the record type (the schema's ``title``, what the record name strategies name a JSON
        schema by) most of the chunk's records carry (ties: the type of the newest schema); the records of other
        types are quarantined rather than filled into this type's columns by property name."""
        titles = {sid: _title(d) for sid, d in usable}
        totals: Counter[str] = Counter()
        for sid, _ in usable:
            totals[titles[sid]] += counts[sid]
        main = max(totals, key=lambda t: (totals[t], max(sid for sid, _ in usable if titles[sid] == t)))
        for sid, title in titles.items():
            if title != main:
                self._problems[sid] = (f"the record is a {title or 'schema without a title'} (schema id {sid}), "
                                       f"this chunk's records are {main or 'of a schema without a title'}: one "
                                       f"record type per topic {ONE_TYPE}")
        return [(sid, d) for sid, d in usable if titles[sid] == main]

    def parse(self, value: bytes | None, kafka_time_ms: int) -> tuple[int, dict[str, Any]]:
        try:
            sid = schema_id(value)
        except FramingError as exc:
            raise ParseError(str(exc)) from None
        assert value is not None
        if sid in self._problems:
            raise ParseError(self._problems[sid])
        decoder = self._decoders.get(sid)
        if decoder is None or isinstance(decoder, str) or sid not in self.schema_ids:
            raise ParseError(f"schema id {sid} was not prepared for this chunk")
        which = f"its schema id {sid}"
        if self._named is not None:
            decoder, which = self._named, f"the named reader schema id {self.reader_schema_id}"
        try:
            valid = decoder.read(payload(value))  # validated by the schema it was written with (or the named one)
        except jsonschema.InvalidValueError as exc:
            raise ParseError(f"the record does not fit {which}: {exc}"[:1000]) from None
        reader = self._reader or decoder
        try:  # the JSON value, as its writer meant it, into the columns of the chunk's reader schema
            datum = reader.convert(valid)
        except jsonschema.InvalidValueError as exc:
            raise ParseError(f"the record written with schema id {sid} cannot be held by the columns of the "
                             f"{self.reader_word} schema: {exc}"[:1000]) from None
        if not isinstance(datum, dict):
            raise ParseError(f"the record written with schema id {sid} is not a JSON object")
        return self.finish(datum, kafka_time_ms)


def _title(decoder: jsonschema.Decoder) -> str:
    """The schema's ``title``: the name the record name strategies give a JSON schema ('' when it has none)."""
    return str(decoder.schema.get("title") or "") if isinstance(decoder.schema, dict) else ""
