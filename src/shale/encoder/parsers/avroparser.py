"""``avro``: Avro records in the Confluent wire format, their writer schemas read from a Schema Registry; every
top-level field of the record becomes a TYPED column (``shale.schemas.avro`` maps the types).

Per chunk, ``prepare`` reads the schema ids of its records, fetches the schemas it has not cached, and takes the
newest of them (the highest id) of the chunk's record type as the chunk's reader schema (the type most of its
records carry, by full name, aliases followed; records of other types are quarantined, unless the option
``subject_name_strategy`` is record or topic_record: then ``record_types`` names each record's type and the chunk is
prepared and parsed once per type). The chunk's columns are every top-level field name its
versions of that type declare, each typed by the newest version declaring it; each record is read with its WRITER's
field names (``shale.schemas.avro_versions``), so a field renamed with ``aliases``, removed or added lands in the
column of its writer's name whatever else the chunk holds (a column its writer does not declare is null), and one
chunk's rows land in one block, however the producers interleave versions. A record whose value its column's type
cannot hold (an incompatible change, a long a double does not hold) is quarantined with the reason, as are records
without the magic byte and records whose id the registry says does not exist. A registry that does not answer raises
``RegistryUnavailableError`` out of ``prepare``: the ingest task pauses the partition there (``shale.ingest.task``),
no record is quarantined for it.

With the option ``reader_schema_id`` (a named reader schema: ``shale reprocess --schema-id``), every record is
resolved into that schema instead of the chunk's newest, whatever version wrote it; a record whose writer schema
cannot be resolved into it is quarantined with the reason.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from typing import Any, ClassVar

import pyarrow as pa
from pydantic import Field

from shale.encoder.parsers.base import BatchParse, ParseError
from shale.encoder.parsers.registryparser import ONE_TYPE, RegistryOptions, RegistryParser
from shale.schemas import FramingError, avro, id_counts, payload, schema_id

log = logging.getLogger(__name__)


class AvroOptions(RegistryOptions):
    """Options of ``avro``."""

    time_field: str = Field(default="", description="dot path of the event time: a timestamp-millis/micros (or "
                            "local-) field, or a long of epoch milliseconds ('' = the Kafka record's timestamp)")


class AvroParser(RegistryParser):
    """Confluent-framed Avro; its options are ``AvroOptions``; the registry is ``ingest.schema_registry``."""

    name = "avro"
    options_model = AvroOptions
    schema_type: ClassVar[str] = "AVRO"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._decoders: dict[tuple[int, str], avro.Decoder] = {}
        self._chunk: dict[int, avro.Decoder] = {}
        self._versions: dict[tuple[int, ...], tuple[pa.StructType, dict[int, Any]] | str] = {}
        self._reader_id = 0
        self._problems: dict[int, str] = {}
        self._names: dict[int, str] = {}

    def prepare(self, headers: list[bytes | None]) -> None:
        """Fix the chunk's reader schema and columns from the schema ids its records carry (see the module)."""
        self._problems, self._chunk = {}, {}
        self.clear()
        self._reader_id = 0
        counts = id_counts(headers)
        usable = [(r.id, r.text) for r in self.fetch(set(counts), self._problems)]
        if not usable:
            return
        named = self.named_reader()  # a named reader schema replaces the chunk's newest
        if isinstance(named, str):
            self._problems.update({sid: named for sid, _ in usable})
            return
        reader_id, reader_text = (named.id, named.text) if named is not None else usable[-1]
        self._names = _types([*usable, (reader_id, reader_text)])
        if named is None:
            reader_id, reader_text = _main_type(usable, self._names, counts)
        self._reader_id = reader_id
        readers = self._readers(usable, reader_id, reader_text, named is None)
        if isinstance(readers, str):
            self._problems.update({sid: readers for sid, _ in usable if sid not in self._problems})
            return
        columns, reader_for = readers
        problem = self.set_columns(columns)
        if problem is not None:
            self._problems.update({sid: problem for sid, _ in usable})
            return
        self.fingerprint = avro.fingerprint(reader_text)
        for sid, text in usable:
            if sid in self._problems:
                continue
            reader = reader_for.get(sid, None if sid == reader_id else reader_text)
            key = (sid, reader if isinstance(reader, str) else json.dumps(reader, sort_keys=True))
            if key not in self._decoders:
                try:
                    self._decoders[key] = avro.Decoder(text) if reader is None else avro.Decoder(text, reader)
                except avro.SchemaError as exc:
                    self._problems[sid] = f"schema id {sid}: {exc}"
                    continue
            self._chunk[sid] = self._decoders[key]
        self.schema_ids = sorted(sid for sid, _ in usable if sid not in self._problems)

    def _readers(self, usable: list[tuple[int, str]], reader_id: int, reader_text: str, by_name: bool) \
            -> tuple[pa.StructType, dict[int, Any]] | str:
        """The chunk's columns and what each schema id of its record type is read as (None: as itself; a schema
        dict: resolved into it; ids left out are resolved into ``reader_text``), or why none can be. Without a named
        reader, each version is read with its own field names, typed as their columns (``avro_versions``); a version
        without an Arrow type of its own is left out, its records quarantined with the reason."""
        newest = self._own(reader_id, reader_text)
        if isinstance(newest, str):
            return newest
        if not by_name:
            return newest.arrow, {}
        texts: dict[int, str] = {}
        for sid, text in usable:
            if self._names.get(sid) != self._names.get(reader_id):
                continue
            own = self._own(sid, text)
            if isinstance(own, str):
                self._problems[sid] = own
                continue
            texts[sid] = text
        key = tuple(sorted(texts))
        if key not in self._versions:  # schemas are immutable: the same versions, the same columns
            self._versions[key] = self._by_name({sid: avro.tree(avro.parse(t)) for sid, t in texts.items()})
        return self._versions[key]

    def _by_name(self, trees: dict[int, Any]) -> tuple[pa.StructType, dict[int, Any]] | str:
        """The columns of the versions ``trees`` and the reader of each (None: itself), or why none can be."""
        columns = avro.columns_schema(trees)
        try:
            arrow = avro.arrow_type(columns)
        except avro.SchemaError as exc:
            return f"the columns of schema ids {sorted(trees)} have no Arrow type: {exc}"
        assert isinstance(arrow, pa.StructType)
        self._warn_of_renames(trees)
        readers = {sid: avro.reader_for(columns, t) for sid, t in trees.items()}
        return arrow, {sid: None if avro.same(trees[sid], r) else r for sid, r in readers.items()}

    def _own(self, sid: int, text: str) -> avro.Decoder | str:
        """The decoder of a record schema read as itself (cached per id, as every decoder), or why it cannot be."""
        key = (sid, json.dumps(None))
        if key not in self._decoders:
            try:
                self._decoders[key] = avro.Decoder(text)
            except avro.SchemaError as exc:
                return f"schema id {sid}: {exc}"
        if not pa.types.is_struct(self._decoders[key].arrow):
            return f"schema id {sid} is not a record schema"
        return self._decoders[key]

    def _warn_of_renames(self, trees: dict[int, Any]) -> None:
        renamed = avro.renames(trees)
        if renamed and renamed not in _WARNED:
            _WARNED.add(renamed)
            name = self._names.get(max(trees), "")
            log.warning(f"avro record {name} has fields renamed with aliases between the schema ids of this chunk ("
                        f"{'; '.join(renamed)}): each record's values are stored in the columns of its writer's "
                        "field names, so a renamed field fills one column per name (`shale schemas --fields` "
                        "lists each schema id's fields)", extra={"avro_record": name, "newest_schema_id": max(trees)})

    def types_of(self, headers: list[bytes | None]) -> list[str | None]:
        """Each record's Avro full name (aliases followed, as ``prepare`` names the chunk's type)."""
        names = _types([(r.id, r.text) for r in self.fetch(set(id_counts(headers)), {})])
        return [names.get(sid) or None if sid is not None else None for sid in map(_id_or_none, headers)]

    def parse(self, value: bytes | None, kafka_time_ms: int) -> tuple[int, dict[str, Any]]:
        try:
            sid = schema_id(value)
        except FramingError as exc:
            raise ParseError(str(exc)) from None
        assert value is not None
        if sid in self._problems:
            raise ParseError(self._problems[sid])
        decoder = self._chunk.get(sid)
        if decoder is None:
            raise ParseError(f"schema id {sid} was not prepared for this chunk")
        try:
            datum = decoder.decode(payload(value))
        except Exception as exc:  # fastavro raises many kinds on bytes that are not a datum of the schema
            kind = f"cannot be read as the {self.reader_word} schema id" if sid != self._reader_id else \
                "is not a datum of"
            mine, main = self._names.get(sid, ""), self._names.get(self._reader_id, "")
            if mine != main:
                raise ParseError(f"the record is a {mine} (schema id {sid}), this chunk's records are {main}: one "
                                 f"record type per topic {ONE_TYPE}") from None
            raise ParseError(f"the record written with schema id {sid} {kind} {self._reader_id}: "
                             f"{type(exc).__name__}: {exc}"[:1000]) from None
        if not isinstance(datum, dict):
            raise ParseError(f"schema id {sid} does not describe a record")
        return self.finish(datum, kafka_time_ms)


    def parse_batch(self, values: pa.Array) -> BatchParse | None:
        """The chunk's records decoded in one loop per writer schema, each column made at once and the event time
        taken from its column (``RegistryParser.batch_of``), without ``parse``'s per-record work. Left to
        ``parse``: a record that does not frame, decode or fit its column as ``parse`` would store it (its reason
        is ``parse``'s)."""
        if not self.batch_time():
            return None
        rows: list[int] = []
        data: list[dict[str, Any]] = []
        for row, value in enumerate(values.to_pylist()):
            sid = _id_or_none(value)
            decoder = self._chunk.get(sid) if sid is not None else None
            if decoder is None or sid in self._problems:
                continue
            try:
                datum = decoder.decode(payload(value))
            except Exception:  # noqa: S112 - ``parse`` says why (fastavro raises many kinds)
                continue
            if isinstance(datum, dict):
                rows.append(row)
                data.append(datum)
        return self.batch_of(rows, data)


_WARNED: set[tuple[str, ...]] = set()
"""The renames this process has warned of (a chunk of the same versions is not worth another line)."""


def _id_or_none(value: bytes | None) -> int | None:
    try:
        return schema_id(value)
    except FramingError:
        return None


def _types(schemas: list[tuple[int, str]]) -> dict[int, str]:
    """Each schema's record type: its full name, or the full name of a newer schema that names it among its
    aliases (a renamed record is the same type)."""
    names = {sid: avro.full_name(text) for sid, text in schemas}
    renamed: dict[str, str] = {}
    for sid, text in sorted(schemas):
        for alias in avro.aliases(text):
            renamed.setdefault(alias, names[sid])

    def current(name: str) -> str:
        seen = {name}
        while name in renamed and renamed[name] not in seen:
            name = renamed[name]
            seen.add(name)
        return name

    return {sid: current(name) for sid, name in names.items()}


def _main_type(usable: list[tuple[int, str]], names: dict[int, str], counts: Counter[int]) -> tuple[int, str]:
    """The chunk's reader: the newest schema of the record type most of its records carry (ties: the type of the
    newest schema). A topic of one type (every topic-strategy subject) reads its newest schema."""
    totals: Counter[str] = Counter()
    for sid, _ in usable:
        totals[names[sid]] += counts[sid]
    main = max(totals, key=lambda n: (totals[n], max(sid for sid, _ in usable if names[sid] == n)))
    return max((sid, text) for sid, text in usable if names[sid] == main)
