"""The parser plug-in contract of the partition group (seed 002: "plug in custom message parsing logic").

A parser turns one Kafka record value into its event time and a few columns. Columns named in ``labels`` are
also labels: their distinct values are recorded per dataset, so the index can prune by them; keep them few and
low-cardinality (log level, component, host). Anything that cannot be parsed raises ``ParseError`` with a
reason: the record then goes to the quarantine dataset, never dropped.

Parsers are found through the ``shale.parsers`` entry point group; a third-party package registers its own
the same way the built-ins do (see pyproject.toml).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import pyarrow as pa
from pydantic import ValidationError

from shale.block import RESERVED_COLUMNS, check_label_name
from shale.config import IngestConfig, ParserOptions, describe_errors
from shale.errors import ConfigError


class ParseError(Exception):
    """This record cannot be parsed; ``reason`` says why (kept with the quarantined record)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class BatchParse:
    """The records of a chunk a parser read in one native pass (``Parser.parse_batch``): their places in the chunk
    (ascending), event times (in the parser's ``time_unit``) and every column of ``columns``, one value each."""

    rows: pa.Array
    times: pa.Array
    columns: dict[str, pa.Array]


class Parser(ABC):
    name: ClassVar[str]
    version: ClassVar[str] = "1"
    time_unit: ClassVar[Literal["ms", "us"]] = "ms"
    """The unit of the event time ``parse`` returns: milliseconds, or microseconds (the built-in parsers, so that a
    record's microseconds are stored; the event_time column holds microseconds)."""
    typed: ClassVar[bool] = False
    """Whether the columns have the Arrow types ``columns`` declares (``avro``); otherwise every column is a string
    and a value that is not one quarantines its record."""
    header_bytes: ClassVar[int] = 5
    """How many first bytes of each value ``prepare`` sees (the Schema Registry header; Protobuf's message-index
    array follows it)."""
    options_model: ClassVar[type[ParserOptions]] = ParserOptions
    """The parser's options, typed (shale.config.parsers): the configuration is checked against it when it loads."""

    def __init__(self, **options: Any) -> None:
        try:
            self.settings = self.options_model.model_validate(options)
        except ValidationError as exc:
            problems = describe_errors(exc.errors(), "options", self.options_model)
            raise ConfigError(f"parser {self.name}: {'; '.join(problems)}") from None
        self.options = dict(options)  # as written: the digest of existing configurations stays the same

    def digest(self) -> str:
        """A short digest of the options, recorded in block metadata to tell parser configurations apart."""
        text = json.dumps(self.options, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def bind(self, ingest: IngestConfig) -> None:  # noqa: B027 - optional hook, a no-op for most parsers
        """Called once with the ingest configuration, before any record (the registry of a typed parser)."""

    def prepare(self, headers: list[bytes | None]) -> None:  # noqa: B027 - optional hook, see bind
        """Called with the first bytes (up to ``header_bytes``) of each value of a chunk before ``parse`` sees them:
        a parser whose columns depend on the records (writer schemas from a registry) fixes them here. May raise a
        ``RetryableError``: nothing is quarantined; ``RegistryUnavailableError`` pauses the chunk's partition (an ingest
        task), any other fails the task and the batch is retried."""

    @property
    def decodes_keys(self) -> bool:
        """Whether the parser also decodes record keys (``prepare_keys``, ``key_columns``, ``parse_key``)."""
        return False

    def prepare_keys(self, heads: list[bytes | None]) -> None:  # noqa: B027 - optional hook, see bind
        """As ``prepare``, for the first 64 bytes of each record's key (when ``decodes_keys``)."""

    def key_columns(self) -> dict[str, pa.DataType]:
        """The columns ``parse_key`` adds (when ``decodes_keys``)."""
        return {}

    def parse_key(self, key: bytes | None) -> dict[str, Any]:
        """The key's columns; raise ``ParseError`` to quarantine the record."""
        return {}

    @property
    def per_record_type(self) -> bool:
        """Whether ``record_types`` names each record's type (a chunk is then parsed once per type)."""
        return False

    def record_types(self, headers: list[bytes | None]) -> list[str | None] | None:
        """Each record's type (a full name), when the parser stores each record type of a topic as its own dataset
        (a typed parser's ``subject_name_strategy`` record or topic_record), read from the same first bytes
        ``prepare`` sees; None for a record whose type cannot be told (its own group, quarantined with the reason
        when parsed). None (the default): the chunk is parsed as one group. The chunk is then prepared and parsed
        once per type. May raise as ``prepare``."""
        return None

    def schema_info(self) -> tuple[list[int], str]:
        """The registry ids of the writer schemas of the last prepared chunk and the fingerprint of the schema its
        rows are stored under (empty for parsers without schemas)."""
        return [], ""

    def named_schema_id(self) -> int | None:
        """The registry id of the reader schema the parser was told to read every record as (recorded in the block
        metadata's parser), or None."""
        return None

    def parse_batch(self, values: pa.Array) -> BatchParse | None:
        """The chunk's values (binary, as ``parse`` sees them one by one) read at once, in native code: for each
        record it returns, exactly the time and columns ``parse`` gives it; a record it is not sure of (one ``parse``
        would quarantine, or might read otherwise) it leaves out, and ``parse`` decides it. None (the default):
        every record goes to ``parse``. Never called for a parser that ``decodes_keys``."""
        return None

    @abstractmethod
    def columns(self) -> dict[str, pa.DataType]:
        """The columns this parser adds to every row (labels included)."""

    @abstractmethod
    def labels(self) -> list[str]:
        """The columns that are also labels (low cardinality)."""

    @abstractmethod
    def parse(self, value: bytes | None, kafka_time_ms: int) -> tuple[int, dict[str, Any]]:
        """Event time since the epoch (in ``time_unit``) and the column values. Raise ``ParseError`` to
        quarantine."""

    def check(self) -> None:
        """Validate the declared columns once, when the parser is loaded."""
        for column in self.columns():
            check_label_name(column)
            if column in RESERVED_COLUMNS:
                raise ConfigError(f"parser {self.name}: column {column!r} clashes with a built-in column")
            if column.startswith("__"):
                raise ConfigError(f"parser {self.name}: column {column!r}: names starting with '__' are reserved")
        missing = set(self.labels()) - set(self.columns())
        if missing:
            raise ConfigError(f"parser {self.name}: labels {sorted(missing)} are not among its columns")


def infer_year(parsed: dt.datetime, kafka_time_ms: int) -> dt.datetime:
    """Timestamps without a year (syslog: ``Dec 10 06:55:46``) take the year of the Kafka record time, or the
    year before when that would put the event more than a day after the record was written."""
    written = dt.datetime.fromtimestamp(kafka_time_ms / 1000, dt.UTC)
    candidate = parsed.replace(year=written.year)
    if candidate - written > dt.timedelta(days=1):
        candidate = candidate.replace(year=written.year - 1)
    return candidate


def to_ms(value: dt.datetime) -> int:
    return int(value.timestamp() * 1000)


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def to_us(value: dt.datetime) -> int:
    """Microseconds since the epoch, exactly (no float on the way)."""
    return (value - _EPOCH) // dt.timedelta(microseconds=1)
