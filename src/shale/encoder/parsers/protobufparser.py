"""``protobuf``: Protobuf messages in the Confluent wire format (magic byte, schema id, message-index array, message),
their schemas read from a Schema Registry; every field of the message becomes a TYPED column
(``shale.schemas.protobuf`` maps the types).

Per chunk, ``prepare`` reads each record's schema id and message-index array, fetches the schemas it has not cached
(and the files they import, the registry's references), and picks the chunk's message type: the full name most of
its records carry (with the option ``subject_name_strategy`` record or topic_record, ``record_types`` names each
record's message and the chunk is prepared and parsed once per message type). The columns are every top-level
field name the chunk's versions of that message declare, each typed by the newest (highest id) version declaring
it. Every record is parsed with ITS WRITER's descriptor (its schema id and message-index array name it) and fills
the columns of its writer's field NAMES, so a field renamed between versions lands in the same column whatever
else the chunk holds (a column the writer does not declare is null); each value is converted only where the
column's type holds it exactly (``shale.schemas.protobuf_versions``): an int32 widens into int64, while an int64 of
5,000,000,000 in a column that became int32 quarantines its record with the reason (protobuf's own resolution would
truncate it). Records of another message type, without the magic byte, with a broken message-index array, or with
an id the registry says does not exist are quarantined with the reason too.

With the option ``reader_schema_id`` (a named reader schema: ``shale reprocess --schema-id``), the chunk's message
type is read with the descriptor of that name in the named schema, whose fields are the columns; a named schema that
does not declare the message quarantines the chunk's records of that type with the reason; every record not written
with the named schema itself is converted into it by field NUMBER, as protobuf reads old bytes, by the same rule.
"""

from __future__ import annotations

import collections
import contextlib
import logging
from typing import Any, ClassVar

import pyarrow as pa
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError

from shale.encoder.parsers.base import BatchParse, ParseError
from shale.encoder.parsers.registryparser import ONE_TYPE, RegistryOptions, RegistryParser
from shale.schemas import (
    FramingError,
    RegisteredSchema,
    Resolver,
    SchemaError,
    UnknownSchemaError,
    ValueMismatchError,
    message_indexes,
    protobuf,
    schema_id,
)

log = logging.getLogger(__name__)

Key = tuple[int, tuple[int, ...]]
"""A record's schema id and message-index array."""


class ProtobufOptions(RegistryOptions):
    """Options of ``protobuf``."""


class ProtobufParser(RegistryParser):
    """Confluent-framed Protobuf; its options are ``ProtobufOptions``; the registry is ``ingest.schema_registry``."""

    name = "protobuf"
    options_model = ProtobufOptions
    schema_type: ClassVar[str] = "PROTOBUF"
    header_bytes: ClassVar[int] = 64

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._files: dict[int, protobuf.ProtoFile | str] = {}
        self._decoders: dict[str, protobuf.Decoder] = {}
        self._chunk: dict[Key, protobuf.Decoder | Resolver | str] = {}
        self._resolvers: dict[tuple[Key, str, tuple[tuple[str, str], ...] | None], Resolver] = {}
        self._problems: dict[int, str] = {}
        self._reader_id = 0

    def _file(self, registered: RegisteredSchema) -> protobuf.ProtoFile | str:
        """The schema's file in its descriptor pool, or why it cannot be read (cached per id)."""
        found = self._files.get(registered.id)
        if found is None:
            try:
                found = protobuf.load(self.registry, registered)
            except (SchemaError, UnknownSchemaError) as exc:
                found = f"schema id {registered.id}: {exc}"
            self._files[registered.id] = found
        return found

    def prepare(self, headers: list[bytes | None]) -> None:
        """Fix the chunk's message type and columns from the records' schema ids (see the module)."""
        keys: collections.Counter[Key] = collections.Counter()
        for head, count in collections.Counter(_common_head(h) or h for h in headers).items():
            with contextlib.suppress(FramingError):  # parse quarantines it with the reason
                keys[(schema_id(head), tuple(message_indexes(head or b"")[0]))] += count
        self._problems, self._chunk = {}, {}
        self.clear()
        files = {r.id: self._file(r) for r in self.fetch({sid for sid, _ in keys}, self._problems)}
        messages: dict[Key, Descriptor] = {}
        names: collections.Counter[str] = collections.Counter()
        for key, count in keys.items():
            file = files.get(key[0])
            if file is None:
                continue
            if isinstance(file, str):
                self._chunk[key] = file
                continue
            try:
                messages[key] = file.message(list(key[1]))
            except SchemaError as exc:
                self._chunk[key] = f"schema id {key[0]}: {exc}"
                continue
            names[messages[key].full_name] += count
        if not names:
            return
        name = names.most_common(1)[0][0]
        reader_key = max(k for k, m in messages.items() if m.full_name == name)
        found = self._reader(name, files[reader_key[0]], messages[reader_key], reader_key[0])
        if isinstance(found, str):
            self._chunk.update({k: found if m.full_name == name else _other_type(k, m, name)
                                for k, m in messages.items()})
            return
        reader_file, reader, self._reader_id = found
        try:
            decoder = self._decoder(self._reader_id, reader)
        except SchemaError as exc:
            self._chunk.update({k: f"schema id {k[0]}: {exc}" for k, m in messages.items() if m.full_name == name})
            return
        columns = None if self.reader_schema_id else self._by_name(name, messages, reader_key)
        problem = self.set_columns(decoder.arrow if columns is None else columns[1])
        for key, message in messages.items():
            if problem is not None:
                self._chunk.setdefault(key, problem)
            elif message.full_name != name:
                self._chunk[key] = _other_type(key, message, name)
            elif key[0] == self._reader_id:
                self._chunk[key] = decoder
            elif key not in self._chunk:
                self._chunk[key] = self._resolver(key, message, decoder, None if columns is None else columns[0])
        if problem is None:
            self.fingerprint = reader_file.fingerprint(reader)
            self.schema_ids = sorted({k[0] for k, v in self._chunk.items() if not isinstance(v, str)})

    def types_of(self, headers: list[bytes | None]) -> list[str | None]:
        """Each record's message full name (its schema id and message-index array, as ``prepare`` reads them)."""
        keys: list[Key | None] = []
        for value in headers:
            try:
                keys.append((schema_id(value), tuple(message_indexes(value or b"")[0])))
            except FramingError:
                keys.append(None)
        files = {r.id: self._file(r) for r in self.fetch({k[0] for k in keys if k is not None}, {})}
        names: dict[Key, str | None] = {}
        for key in {k for k in keys if k is not None}:
            file = files.get(key[0])
            names[key] = None
            if isinstance(file, protobuf.ProtoFile):
                with contextlib.suppress(SchemaError):  # parse quarantines it with the reason
                    names[key] = file.message(list(key[1])).full_name
        return [names[k] if k is not None else None for k in keys]

    def _reader(self, name: str, newest_file: protobuf.ProtoFile | str, newest: Descriptor,
                newest_id: int) -> tuple[protobuf.ProtoFile, Descriptor, int] | str:
        """The file, descriptor and id the chunk's ``name`` records are read with: the newest schema declaring it,
        or the named reader schema (option ``reader_schema_id``), which must declare it; or why not."""
        named = self.named_reader()
        if named is None:
            assert isinstance(newest_file, protobuf.ProtoFile)
            return newest_file, newest, newest_id
        if isinstance(named, str):
            return named
        file = self._file(named)
        if isinstance(file, str):
            return f"the named reader schema: {file}"
        declared = file.declared(name)
        if declared is None:
            return f"the named reader schema id {named.id} does not declare the message {name}"
        return file, declared, named.id

    def _decoder(self, sid: int, message: Descriptor) -> protobuf.Decoder:
        key = f"{sid}/{message.full_name}"
        if key not in self._decoders:
            self._decoders[key] = protobuf.Decoder(message)
        return self._decoders[key]

    def _by_name(self, name: str, messages: dict[Key, Descriptor], newest: Key) \
            -> tuple[list[FieldDescriptor], pa.StructType]:
        """The chunk's columns when no reader schema is named: every top-level field name of the chunk's versions of
        ``name``, each typed by the newest (highest id) version that declares it; the newest version's fields first,
        in its order, then the names only older versions declare. A version whose message has no Arrow type is left
        out, its records quarantined with the reason. Warns (once per process) of a field number two versions name
        differently: a rename, whose records then fill two columns."""
        fields: dict[str, FieldDescriptor] = {}
        types: dict[str, pa.DataType] = {}
        versions = sorted((k for k, m in messages.items() if m.full_name == name), reverse=True)
        for key in versions:
            try:
                arrow = self._decoder(key[0], messages[key]).arrow
            except SchemaError as exc:
                self._chunk[key] = f"schema id {key[0]}: {exc}"
                continue
            for field in messages[key].fields:
                if field.name not in fields:
                    fields[field.name], types[field.name] = field, arrow.field(field.name).type
        renamed = _renames({key[0]: messages[key] for key in versions})
        if renamed and renamed not in _WARNED:
            _WARNED.add(renamed)
            log.warning(f"protobuf message {name} has renamed fields between the schema ids of this chunk ("
                        f"{'; '.join(renamed)}): each record's values are stored in the columns of its writer's "
                        "field names, so a renamed field fills one column per name (`shale schemas --fields` "
                        "lists each schema id's fields)",
                        extra={"protobuf_message": name, "newest_schema_id": newest[0]})
        return list(fields.values()), pa.struct([pa.field(n, t) for n, t in types.items()])

    def _resolver(self, key: Key, writer: Descriptor, reader: protobuf.Decoder,
                  columns: list[FieldDescriptor] | None) -> Resolver:
        """How records of ``key`` (another version than the reader's) are read into the chunk's columns: by name
        into ``columns``, or by number into a named reader schema's when ``columns`` is None."""
        shape = None if columns is None else tuple((f.containing_type.file.name, f.name) for f in columns)
        cached = (key, f"{self._reader_id}/{reader.descriptor.full_name}", shape)
        if cached not in self._resolvers:
            self._resolvers[cached] = Resolver(writer, reader, columns)
        return self._resolvers[cached]

    def parse_batch(self, values: pa.Array) -> BatchParse | None:
        """The chunk's records decoded in one loop, each with its writer's descriptor as ``parse`` decodes it, then
        each column made at once (``RegistryParser.batch_of``), without ``parse``'s per-record work. Left to
        ``parse``: a record that does not frame, was not prepared, does not decode or does not fit its column as
        ``parse`` would store it (its reason is ``parse``'s)."""
        if not self.batch_time():
            return None
        rows: list[int] = []
        data: list[dict[str, Any]] = []
        chunk, problems = self._chunk, self._problems
        framed: dict[bytes, tuple[Key, int] | None] = {}
        """The key and body offset of each common head (``_common_head``) seen."""
        for row, value in enumerate(values.to_pylist()):
            head = _common_head(value)
            if head is not None and head in framed:
                found = framed[head]
            else:
                try:
                    sid = schema_id(value)
                    indexes, start = message_indexes(value)
                    found = ((sid, tuple(indexes)), start)
                except FramingError:
                    found = None
                if head is not None:
                    framed[head] = found
            if found is None:
                continue
            key, start = found
            prepared = chunk.get(key)
            if prepared is None or isinstance(prepared, str) or key[0] in problems:
                continue
            try:
                data.append(prepared.decode(memoryview(value)[start:]))
            except (DecodeError, ValueMismatchError):
                continue
            rows.append(row)
        return self.batch_of(rows, data)

    def parse(self, value: bytes | None, kafka_time_ms: int) -> tuple[int, dict[str, Any]]:
        try:
            sid = schema_id(value)
            assert value is not None
            indexes, start = message_indexes(value)
        except FramingError as exc:
            raise ParseError(str(exc)) from None
        if sid in self._problems:
            raise ParseError(self._problems[sid])
        prepared = self._chunk.get((sid, tuple(indexes)))
        if prepared is None:
            raise ParseError(f"schema id {sid} with message indexes {indexes} was not prepared for this chunk (an "
                             f"index array longer than {self.header_bytes - 5} bytes)")
        if isinstance(prepared, str):
            raise ParseError(prepared)
        try:
            decoded = prepared.decode(memoryview(value)[start:])  # with the record's own writer's descriptor
        except DecodeError as exc:
            name = prepared.writer.full_name if isinstance(prepared, Resolver) else prepared.descriptor.full_name
            raise ParseError(f"the record written with schema id {sid} is not a {name}: {exc}"[:1000]) from None
        except ValueMismatchError as exc:
            raise ParseError(f"the record written with schema id {sid} cannot be read as the {self.reader_word} "
                             f"schema id {self._reader_id}: {exc} (its bytes are kept; `shale reprocess --schema-id "
                             f"{sid}` stores such records with their writer's types)") from None
        return self.finish(decoded, kafka_time_ms)


def _common_head(value: bytes | None) -> bytes | None:
    """The frame of ``value`` when it is the common one (magic byte, schema id and the one-byte message-index
    array of the first message: every record of a schema id has the same six bytes, so they are read once per
    chunk), else None."""
    return value[:6] if value is not None and len(value) > 5 and value[5] == 0 else None


def _renames(versions: dict[int, Descriptor]) -> tuple[str, ...]:
    """Each top-level field number that ``versions`` (schema id -> message) name differently, as text: "field 4:
    'temp_c' in schema ids 1, 2; 'temp_dc' in schema id 3"."""
    names: dict[int, dict[str, list[int]]] = collections.defaultdict(lambda: collections.defaultdict(list))
    for sid in sorted(versions):
        for field in versions[sid].fields:
            names[field.number][field.name].append(sid)
    return tuple(f"field {number}: " + "; ".join(
        f"{n!r} in schema id{'s' if len(ids) > 1 else ''} {', '.join(map(str, ids))}" for n, ids in by_name.items())
        for number, by_name in sorted(names.items()) if len(by_name) > 1)


_WARNED: set[tuple[str, ...]] = set()
"""The renames this process has warned of (a chunk of the same versions is not worth another line)."""


def _other_type(key: Key, message: Descriptor, name: str) -> str:
    return (f"the record is a {message.full_name} (schema id {key[0]}), this chunk's records are {name}: one "
            f"message type per topic {ONE_TYPE}")
