"""``avro``: Avro records in the Confluent wire format, their writer schemas read from a Schema Registry; every
top-level field of the record becomes a TYPED column (``shale.schemas.avro`` maps the types).

Per chunk, ``prepare`` reads the schema ids of its records, fetches the schemas it has not cached, and takes the
newest of them (the highest id) of the chunk's record type as the chunk's reader schema (the type most of its
records carry, by full name, aliases followed; records of other types are quarantined, unless the option
``subject_name_strategy`` is record or topic_record: then ``record_types`` names each record's type and the chunk is
prepared and parsed once per type): records written with an older compatible version
are resolved into it (a field added with a default gets its default), so one chunk's rows land in one block under
one schema, however the producers interleave versions. A record written with a version that cannot be resolved
into the newest (an incompatible change) is quarantined with the reason, as are records without the magic byte
and records whose id the registry says does not exist. A registry that does not answer raises
``RegistryUnavailableError`` out of ``prepare``: the ingest task pauses the partition there (``shale.ingest.task``),
no record is quarantined for it.

With the option ``reader_schema_id`` (a named reader schema: ``shale reprocess --schema-id``), every record is
resolved into that schema instead of the chunk's newest, whatever version wrote it; a record whose writer schema
cannot be resolved into it is quarantined with the reason.
"""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from shale.encoder.parsers.base import BatchParse, ParseError
from shale.encoder.parsers.registryparser import ONE_TYPE, RegistryOptions, RegistryParser
from shale.schemas import FramingError, avro, id_counts, payload, schema_id


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
        self._decoders: dict[tuple[int, int], avro.Decoder] = {}
        self._reader_id = 0
        self._problems: dict[int, str] = {}
        self._names: dict[int, str] = {}

    def prepare(self, headers: list[bytes | None]) -> None:
        """Fix the chunk's reader schema and columns from the schema ids its records carry (see the module)."""
        self._problems = {}
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
        try:
            newest = avro.Decoder(reader_text)
        except avro.SchemaError as exc:
            self._problems.update({sid: f"schema id {sid}: {exc}" for sid, _ in usable})
            return
        if not pa.types.is_struct(newest.arrow):
            self._problems.update({sid: f"schema id {sid} is not a record schema" for sid, _ in usable})
            return
        problem = self.set_columns(newest.arrow)
        if problem is not None:
            self._problems.update({sid: problem for sid, _ in usable})
            return
        self.fingerprint = avro.fingerprint(reader_text)
        for sid, text in usable:
            key = (sid, reader_id)
            if key not in self._decoders:
                try:
                    self._decoders[key] = newest if sid == reader_id else avro.Decoder(text, reader_text)
                except avro.SchemaError as exc:
                    self._problems[sid] = f"schema id {sid}: {exc}"
        self.schema_ids = sorted(sid for sid, _ in usable if sid not in self._problems)

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
        decoder = self._decoders.get((sid, self._reader_id))
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
        taken from its column, without ``parse``'s per-record work. Left to ``parse``: a record that does not frame,
        decode or fit its column as ``parse`` would store it (its reason is ``parse``'s). Only with a top-level
        time field of a timestamp or an integer type (None otherwise: every record through ``parse``)."""
        from shale.encoder.parsing import field_problems  # the encoder's per-value rules, the same as ``parse``'s

        columns = self.columns()
        time_column = self.prefix + self.time_path[0] if len(self.time_path) == 1 else None
        time_type = columns.get(time_column or "")
        if time_column is None or time_type is None or not (pa.types.is_timestamp(time_type)
                                                             or pa.types.is_integer(time_type)):
            return None
        rows: list[int] = []
        data: list[dict[str, Any]] = []
        for row, value in enumerate(values.to_pylist()):
            sid = _id_or_none(value)
            decoder = self._decoders.get((sid, self._reader_id)) if sid is not None else None
            if decoder is None or sid in self._problems:
                continue
            try:
                datum = decoder.decode(payload(value))
            except Exception:  # noqa: S112 - ``parse`` says why (fastavro raises many kinds)
                continue
            if isinstance(datum, dict):
                rows.append(row)
                data.append(datum)
        fields = {name: list(map(dict.get, data, itertools.repeat(name[len(self.prefix):]))) for name in columns}
        bad = field_problems(fields, self.labels(), columns)
        try:
            arrays = {name: pa.array(v, columns[name]) for name, v in fields.items()}
            times = arrays[time_column]
            if pa.types.is_timestamp(time_type):
                times = times.cast(pa.timestamp("us", time_type.tz)).cast(pa.int64())
            else:
                times = pc.multiply_checked(times.cast(pa.int64()), 1000)  # epoch milliseconds
        except (pa.ArrowException, ValueError, TypeError, OverflowError, UnicodeEncodeError):
            return None  # a value its column cannot hold: every record through ``parse``, which says which
        keep = np.ones(len(rows), np.bool_)
        keep[list(bad)] = False
        keep &= pc.is_valid(times).to_numpy(zero_copy_only=False)
        mask = pa.array(keep)
        return BatchParse(pa.array(rows, pa.int64()).filter(mask), times.filter(mask),
                          {name: array.filter(mask) for name, array in arrays.items()})


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
