"""``BlockMeta``: the versioned, validated record in every block's meta.json (and in its Parquet footers).

A block holds one or more *datasets* (seed 004): independent sets of rows of one kind and one Kafka topic, each
in its own Parquet object. A dataset carries *label sets*, the distinct label combinations of its rows, so that
the index can prune by label without reading data.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_serializer,
    field_validator,
    model_validator,
)

from shale.block.ids import check_block_id, ulid_time_ms
from shale.block.names import check_label_name, check_record_name, check_tenant, check_topic
from shale.block.packed import (
    PACK_FROM,
    pack_ints,
    pack_ranges,
    pack_row_groups,
    unpack_ints,
    unpack_ranges,
    unpack_row_groups,
)
from shale.errors import CorruptObjectError

META_VERSION = 1
INCARNATION_PATTERN = r"^[A-Za-z0-9_-]{0,32}$"
"""A Kafka topic id as Kafka prints it (22 characters of URL-safe base64), or '' where it was not recorded."""
GROUPS = ("backup", "partition")
ERASURE_ID = re.compile(r"[0-9a-f]{16}")
"""An erasure request's id (``shale erase``): 16 hex digits of SHA-256 of what it erases."""
DatasetKind = Literal["records", "quarantine"]


LISTED = {"packed": False}
"""Serialization context for JSON meant for people (``model_dump(mode="json", context=LISTED)``): lists only."""


def packed_or_list(value: Sequence[Any], pack: Callable[[Any], str], handler: SerializerFunctionWrapHandler,
                   info: SerializationInfo) -> object:
    """A list field's JSON: packed (``shale.block.packed``) from ``PACK_FROM`` items on, else the list itself (and
    the list too for values past 64-bit integers, which the packed form does not hold, or in context ``LISTED``)."""
    if len(value) >= PACK_FROM and (info.context or {}).get("packed", True):
        try:
            return pack(value)
        except OverflowError:
            pass
    return handler(value)


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KafkaRange(_Record):
    """Offsets ``[start, end)`` of one topic-partition that the block accounts for."""

    topic: str
    partition: int = Field(ge=0)
    start: int = Field(ge=0)
    end: int = Field(ge=0)
    incarnation: str = Field(default="", pattern=INCARNATION_PATTERN,
                             description="the Kafka topic id of the topic's incarnation ('' = not recorded)")

    @model_validator(mode="after")
    def _ordered(self) -> KafkaRange:
        check_topic(self.topic)
        if self.end < self.start:
            raise ValueError(f"kafka range end {self.end} is before start {self.start}")
        return self


class Dataset(_Record):
    name: str = Field(description="unique in the block: '<kind>/<topic>', or '<kind>/<topic>/<record>' for a record "
                      "type of a topic of several (subject name strategies)")
    kind: DatasetKind
    topic: str
    record: str | None = Field(default=None, description="the record type of the rows (Avro full name, Protobuf "
                               "message, JSON Schema title) when the parser groups a topic's records by type "
                               "(subject_name_strategy record or topic_record); absent: one type per topic")
    file: str = Field(description="the data object holding the rows, listed in files")
    rows: int = Field(ge=0)
    bytes: int = Field(ge=0, description="uncompressed in-memory size of the rows (Arrow)")
    min_time: int
    max_time: int
    labels: list[dict[str, str]] = Field(default_factory=list, description="distinct label sets of the rows")
    row_groups: list[tuple[int, int, int]] = Field(
        default_factory=list, description="table of contents: (rows, min_time, max_time) per Parquet row group"
    )
    row_group_partitions: list[int] | None = Field(
        default=None, description="the Kafka partition of each row group, when each holds one partition's records "
        "of the dataset's topic (level-0 blocks of several partitions): a reader of one partition fetches only its "
        "row groups")
    columns: list[str] = Field(default_factory=list,
                               description="columns beyond the kind's base schema (a parser's columns)")
    column_types: str | None = Field(default=None, description="the Arrow types of those columns when a typed "
                                     "parser wrote them: an Arrow IPC schema in base64 (absent: all strings)")
    schema_ids: list[int] | None = Field(default=None, description="Schema Registry ids of the writer schemas "
                                         "of the rows (typed parsers)")
    schema_fingerprint: str | None = Field(default=None, description="fingerprint of the schema the rows are "
                                           "stored under (typed parsers)")

    @field_validator("row_groups", mode="before")
    @classmethod
    def _unpack_row_groups(cls, value: object) -> object:
        return unpack_row_groups(value) if isinstance(value, str) else value

    @field_validator("row_group_partitions", mode="before")
    @classmethod
    def _unpack_partitions(cls, value: object) -> object:
        return unpack_ints(value) if isinstance(value, str) else value

    @field_serializer("row_groups", mode="wrap", when_used="json")
    def _pack_row_groups(self, value: list[tuple[int, int, int]], handler: SerializerFunctionWrapHandler,
                    info: SerializationInfo) -> object:
        return packed_or_list(value, pack_row_groups, handler, info)

    @field_serializer("row_group_partitions", mode="wrap", when_used="json-unless-none")
    def _pack_partitions(self, value: list[int], handler: SerializerFunctionWrapHandler,
                    info: SerializationInfo) -> object:
        return packed_or_list(value, pack_ints, handler, info)

    @field_validator("record")
    @classmethod
    def _record_name(cls, value: str | None) -> str | None:
        return value if value is None else check_record_name(value)

    @field_validator("labels")
    @classmethod
    def _label_names(cls, value: list[dict[str, str]]) -> list[dict[str, str]]:
        for label_set in value:
            for name in label_set:
                check_label_name(name)
        return value


class FileInfo(_Record):
    name: str
    size: int = Field(ge=0)
    crc32: str = Field(pattern=r"^[0-9a-f]{8}$")


class Compaction(_Record):
    """Which level-0 blocks' records this block holds (``sources``) and which blocks it replaced (``parents``)."""

    sources: list[str]
    parents: list[str] = Field(default_factory=list)


class ParserInfo(_Record):
    name: str
    version: str
    options_digest: str = ""
    reader_schema_id: int | None = Field(default=None, description="the Schema Registry id of the named reader "
                                         "schema every record was read as (a typed parser's reader_schema_id: "
                                         "`shale reprocess --schema-id`); absent: each chunk's newest schema")


class BlockMeta(_Record):
    version: Literal[1] = 1
    id: str
    tenant: str
    shard: int = Field(default=0, ge=0)
    level: int = Field(default=0, ge=0)
    group: str
    generation: int = Field(default=1, ge=0)
    min_time: int = Field(description="smallest event time in the block, ms since the epoch")
    max_time: int = Field(description="largest event time in the block, ms since the epoch")
    kafka: list[KafkaRange] = Field(default_factory=list)
    partition_values: dict[str, str] = Field(default_factory=dict, description="dt (and hour) of the block")
    datasets: list[Dataset]
    files: list[FileInfo] = Field(default_factory=list)
    compaction: Compaction
    parser: ParserInfo | None = None
    derived_from: list[str] = Field(default_factory=list, description="backup blocks a reprocessed block came from")
    ignore_delay: bool = Field(default=False, description="trust the block before the sync delay (repairs)")
    erased: list[str] | None = Field(default=None, description="erasures (`shale erase` request ids) whose records "
                                     "this block was written without: its Kafka ranges still account for their "
                                     "offsets, which hold no row here by request")
    layout: int = Field(default=1, ge=1, le=2, description="where its objects are (shale.block.layout): 2 under "
                        "its group's prefix; 1 (absent) under <tenant>/blocks/, as every block was before")

    _time_ms: int = PrivateAttr(0)
    _summary: bool = PrivateAttr(False)

    @field_validator("kafka", mode="before")
    @classmethod
    def _unpack_kafka(cls, value: object) -> object:
        return unpack_ranges(value, KafkaRange) if isinstance(value, str) else value

    @field_serializer("kafka", mode="wrap", when_used="json")
    def _pack_kafka(self, value: list[KafkaRange], handler: SerializerFunctionWrapHandler,
                    info: SerializationInfo) -> object:
        return packed_or_list(value, pack_ranges, handler, info)

    @model_validator(mode="after")
    def _consistent(self) -> BlockMeta:
        # Pydantic runs "after" validators again when a validated instance is passed into another model (every
        # command carrying blocks): a set time means this instance was checked already.
        if self.__pydantic_private__["_time_ms"]:  # type: ignore[index]
            return self
        self._time_ms = ulid_time_ms(self.id)  # checks the id too
        check_tenant(self.tenant)
        if self.group not in GROUPS:
            raise ValueError(f"group {self.group!r} is not one of {GROUPS}")
        if self.max_time < self.min_time:
            raise ValueError(f"max_time {self.max_time} is before min_time {self.min_time}")
        names = [d.name for d in self.datasets]
        if len(set(names)) != len(names):
            raise ValueError(f"dataset names repeat: {names}")
        if self.files:
            listed = {f.name for f in self.files}
            missing = sorted({d.file for d in self.datasets} - listed)
            if missing:
                raise ValueError(f"datasets refer to files not listed in files: {missing}")
        for source in (*self.compaction.sources, *self.compaction.parents, *self.derived_from):
            check_block_id(source)
        for erasure in self.erased or ():
            if not ERASURE_ID.fullmatch(erasure):
                raise ValueError(f"erased names {erasure!r}, not an erasure id")
        return self

    @property
    def time_ms(self) -> int:
        """The block's creation time: the time inside its ULID (decoded once, at validation). Read from the private
        attributes' dict directly: pydantic's attribute lookup for private attributes is about 30x slower."""
        return self.__pydantic_private__["_time_ms"]  # type: ignore[index,no-any-return]

    @property
    def summary(self) -> bool:
        """Whether this is a bucket index entry of version 2 or later (``shale.bucketindex``): the block without
        its Kafka ranges and its datasets' row groups, which a reader that needs them reads from meta.json."""
        return self.__pydantic_private__["_summary"]  # type: ignore[index,no-any-return]

    @property
    def rows(self) -> int:
        return sum(d.rows for d in self.datasets)

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    def file(self, name: str) -> FileInfo:
        for info in self.files:
            if info.name == name:
                return info
        raise KeyError(name)

    def to_json(self) -> bytes:
        # The serializer itself returns bytes: no str round trip (this runs for every block the metastore adds).
        return self.__pydantic_serializer__.to_json(self, exclude_none=True)

    def event_time_of(self, topic: str, partition: int) -> int:
        """The largest time of the partition's stored records in this block (0: none): by the datasets' table of
        contents where row groups are per partition, else the datasets of the topic as a whole."""
        return max((g[2] if d.row_group_partitions else d.max_time
                    for d in self.datasets if d.kind == "records" and d.rows and d.topic == topic
                    for g, p in zip(d.row_groups, d.row_group_partitions or [partition] * len(d.row_groups),
                                    strict=True) if p == partition), default=0)

    def event_times(self) -> dict[tuple[str, int], int]:
        """``event_time_of`` of every (topic, partition) of the block's Kafka ranges, in one pass over its datasets'
        tables of contents (a block of many partitions asked one partition at a time is quadratic)."""
        by_partition: dict[tuple[str, int], int] = {}
        by_topic: dict[str, int] = {}
        for d in self.datasets:
            if d.kind != "records" or not d.rows or not d.row_groups:
                continue
            if d.row_group_partitions:
                for g, p in zip(d.row_groups, d.row_group_partitions, strict=True):
                    if (d.topic, p) not in by_partition or g[2] > by_partition[(d.topic, p)]:
                        by_partition[(d.topic, p)] = g[2]
            elif d.topic not in by_topic or d.max_time > by_topic[d.topic]:
                by_topic[d.topic] = d.max_time
        out: dict[tuple[str, int], int] = {}
        for r in self.kafka:
            times = [t for t in (by_partition.get((r.topic, r.partition)), by_topic.get(r.topic)) if t is not None]
            out[(r.topic, r.partition)] = max(times, default=0)
        return out

    def logical_key(self) -> tuple[object, ...]:
        """What makes two metas the same block, independent of byte-level encoding of its files."""
        return (self.id, self.tenant, self.group, self.generation, tuple(self.kafka),
                tuple((d.name, d.rows) for d in self.datasets), tuple(self.compaction.sources),
                tuple(self.erased or ()))


def parse_meta(data: bytes, *, where: str, block_id: str = "") -> BlockMeta:
    """Parse and validate meta.json; any problem is a ``CorruptObjectError`` naming the block."""
    try:
        raw = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptObjectError(f"{where}: meta.json of block {block_id} is not JSON ({exc})",
                                 key=where, block_id=block_id) from None
    if isinstance(raw, dict) and raw.get("version") not in (None, META_VERSION):
        raise CorruptObjectError(
            f"{where}: meta.json of block {block_id} has version {raw.get('version')!r}; this Shale reads version "
            f"{META_VERSION}. Upgrade Shale to read it.", key=where, block_id=block_id)
    try:
        meta = BlockMeta.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}" for e in exc.errors())
        raise CorruptObjectError(f"{where}: meta.json of block {block_id} is invalid: {problems}",
                                 key=where, block_id=block_id) from None
    if block_id and meta.id != block_id:
        raise CorruptObjectError(f"{where}: meta.json says block {meta.id} but lives in folder {block_id}",
                                 key=where, block_id=block_id)
    return meta
