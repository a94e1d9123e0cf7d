"""``json``: a JSON object per record, its event time at a field path."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import zoneinfo
from typing import Any, ClassVar

import orjson
import pyarrow as pa
from pydantic import Field, field_validator, model_validator

from shale.config import ParserOptions, TimeFormat, TimeZone
from shale.encoder.parsers.base import BatchParse, ParseError, Parser, infer_year, to_us
from shale.encoder.parsers.jsonbatch import JsonBatch
from shale.encoder.parsers.jsontypes import TYPE_HELP, arrow_type, check_type, converter, iso_timestamp

EPOCH_FORMATS = {"epoch_ms": 1000, "epoch_s": 1_000_000, "epoch_us": 1}  # microseconds per unit
INEXACT = frozenset({float, dict, list})
"""The types of values orjson may have read inexactly (a number) or that hold numbers (``parse``)."""
NUMBERS = json.JSONDecoder(parse_float=decimal.Decimal)
"""Reads every JSON fraction as the ``decimal.Decimal`` of its text (``decode_numbers``)."""
_NUMBER_SHAPES = bytes(48 if chr(i) in "0123456789." else 101 if chr(i) in "eE" else 43 if chr(i) in "+-" else 32
                       for i in range(256))
"""A byte table keeping only the shape of number literals: a digit or a point is 0, an exponent mark e, a sign +."""


def may_hold_long_number(value: bytes) -> bool:
    """Whether the document may hold a number literal of more than 15 significant digits (16 digits or points in a
    row) or one outside the normal range of doubles (an exponent of 3 digits). If not, every fraction orjson read is
    the nearest double of a literal of at most 15 digits, which a ``double`` column stores as it is
    (``jsontypes.DOUBLE_DIGITS``), and the document is not read again; a false alarm (a long digit string) costs
    only that reading. Two C-level passes over the bytes (a regex took 9 us a record)."""
    shape = value.translate(_NUMBER_SHAPES)
    return b"0000000000000000" in shape or b"e000" in shape or b"e+000" in shape
TEXT = frozenset({str, type(None)})
"""The types of values a string column takes as they are."""


def dig(document: Any, path: list[str]) -> Any:
    for part in path:
        if not isinstance(document, dict) or part not in document:
            return None
        document = document[part]
    return document


def parse_time(raw: Any, time_format: str, kafka_time_ms: int, tz: dt.tzinfo) -> int:
    """Event time in microseconds from a field value: epoch numbers, ISO 8601, or a strftime pattern (a year may be
    missing)."""
    if time_format in EPOCH_FORMATS:
        if isinstance(raw, bool) or not isinstance(raw, int | float | str):
            raise ParseError(f"time {raw!r} is not a number")
        if isinstance(raw, int):
            return raw * EPOCH_FORMATS[time_format]
        try:
            return round(float(raw) * EPOCH_FORMATS[time_format])
        except (ValueError, OverflowError):
            raise ParseError(f"time {raw!r} is not a number") from None
    if not isinstance(raw, str):
        raise ParseError(f"time {raw!r} is not a string")
    try:
        if time_format == "iso8601":
            parsed = dt.datetime.fromisoformat(raw.replace("Z", "+00:00"))
        else:
            parsed = dt.datetime.strptime(raw, time_format)
            if "%Y" not in time_format and "%y" not in time_format:
                parsed = infer_year(parsed.replace(tzinfo=tz), kafka_time_ms)
    except ValueError as exc:
        raise ParseError(f"time {raw!r} does not match {time_format!r}: {exc}") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=tz)
    return to_us(parsed)


class JsonOptions(ParserOptions):
    """Options of ``json`` and ``msgpack``."""

    time_field: str = Field(min_length=1, description="dot path of the event time, e.g. ts or meta.time")
    time_format: TimeFormat = Field(default="iso8601", description="iso8601, epoch_ms, epoch_s, epoch_us, or a "
                                    "strftime pattern (without a year: the Kafka record's year)")
    timezone: TimeZone = Field(default="UTC", description="IANA zone of times written without one")
    label_fields: list[str] = Field(default_factory=list, description="dot paths whose values become labels "
                                    "(few, low-cardinality: level, host)")
    fields: list[str] = Field(default_factory=list, description="dot paths kept as columns (strings, unless types "
                              "says otherwise)")
    types: dict[str, str] = Field(default_factory=dict, description="a column type per path of fields: " + TYPE_HELP
                                  + "; a value its type does not hold exactly quarantines the record, never "
                                  "converted (shale.encoder.parsers.jsontypes)")

    @field_validator("types")
    @classmethod
    def _types(cls, value: dict[str, str]) -> dict[str, str]:
        return {path: check_type(name) for path, name in value.items()}

    @model_validator(mode="after")
    def _typed_fields(self) -> JsonOptions:
        if unknown := sorted(set(self.types) - set(self.fields)):
            raise ValueError(f"types names {unknown}, which fields does not list (labels are always strings)")
        return self


class JsonTimestampParser(Parser):
    """A JSON object per record; its options are ``JsonOptions``."""

    name = "json"
    options_model = JsonOptions
    time_unit = "us"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        settings = self.settings
        assert isinstance(settings, JsonOptions)
        self.time_path = settings.time_field.split(".")
        self.time_format = settings.time_format
        self.tz: dt.tzinfo = dt.UTC if settings.timezone == "UTC" else zoneinfo.ZoneInfo(settings.timezone)
        self.label_paths = {p.replace(".", "_"): p.split(".") for p in settings.label_fields}
        self.field_paths = {p.replace(".", "_"): p.split(".") for p in settings.fields}
        self.column_paths = {**self.label_paths, **self.field_paths}
        # Top-level fields, the common case, are looked up directly (``dig`` for dot paths).
        self.time_key = self.time_path[0] if len(self.time_path) == 1 else None
        flat = all(len(path) == 1 for path in self.column_paths.values())
        self.column_keys = {name: path[0] for name, path in self.column_paths.items()} if flat else None
        declared = {p.replace(".", "_"): name for p, name in settings.types.items() if name != "string"}
        self.types = {column: arrow_type(name) for column, name in declared.items()}
        read_time = iso_timestamp(self.tz)
        self.converters = {column: converter(name, read_time) for column, name in declared.items()}
        # Columns whose numbers are read from their JSON text, never through orjson's float: decimals, and doubles
        # (a literal the nearest double does not hold as written is refused, ``jsontypes.literal_double``).
        self.from_text = [column for column, name in declared.items()
                          if name.startswith("decimal") or (name == "double" and self.approximate)]
        self.decimals = [column for column, name in declared.items() if name.startswith("decimal")]
        # The batch path reads JSON text: not for a subclass that decodes another format (msgpack).
        self.batch = (JsonBatch.plan(self.time_path, self.time_format, settings.timezone == "UTC", self.column_paths,
                                     {p.replace(".", "_"): name for p, name in settings.types.items()})
                      if type(self).decode is JsonTimestampParser.decode else None)

    typed: ClassVar[bool] = True  # its columns have the types ``columns`` says: strings unless declared

    def columns(self) -> dict[str, pa.DataType]:
        return {name: self.types.get(name, pa.string()) for name in self.column_paths}

    def labels(self) -> list[str]:
        return list(self.label_paths)

    def parse_batch(self, values: pa.Array) -> BatchParse | None:
        """The values read by Arrow's JSON reader where it reads what ``parse`` would (``jsonbatch``)."""
        return None if self.batch is None else self.batch.read(values)

    approximate: ClassVar[bool] = True
    """Whether ``decode`` may read a number inexactly (orjson: an integer beyond 64 bits becomes a float)."""

    def decode(self, value: bytes) -> Any:
        """The document, read by orjson (several times faster); what orjson refuses is read by ``json``, whose
        rules are the contract (it also takes UTF-16, a byte-order mark, NaN and lone surrogates)."""
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return self.decode_exact(value)

    def decode_exact(self, value: bytes) -> Any:
        """The document as Python's ``json`` reads it (the parser's contract)."""
        try:
            return json.loads(value)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ParseError(f"invalid JSON: {exc}") from None
        except RecursionError:
            raise ParseError("the JSON value is nested too deeply to read") from None

    def parse(self, value: bytes | None, kafka_time_ms: int) -> tuple[int, dict[str, Any]]:
        if value is None:
            raise ParseError("the record has no value")
        document = self.decode(value)
        if not isinstance(document, dict):
            raise ParseError(f"expected an object, got {type(document).__name__}")
        raw_time = document.get(self.time_key) if self.time_key is not None else dig(document, self.time_path)
        if raw_time is None:
            raise ParseError(f"no time field {'.'.join(self.time_path)!r}")
        event_time = parse_time(raw_time, self.time_format, kafka_time_ms, self.tz)
        keys = self.column_keys
        found = ({name: document.get(key) for name, key in keys.items()} if keys is not None else
                 {name: dig(document, path) for name, path in self.column_paths.items()})
        if not INEXACT.isdisjoint(map(type, found.values())):
            found = self.exact_values(value, found)
        convert = self.converters
        if not convert and TEXT.issuperset(map(type, found.values())):
            return event_time, found  # every value a string or missing: the columns take them as they are
        return event_time, {name: None if v is None else convert[name](name, v) if name in convert else
                            (v if isinstance(v, str) else as_text(name, v)) for name, v in found.items()}

    def exact_values(self, value: bytes, found: dict[str, Any]) -> dict[str, Any]:
        """``found`` with every number read exactly (the slow path: a column holds a float, a list or a map)."""
        from_text = self.from_text
        if any(type(found[c]) is float for c in self.decimals) or (
                any(type(found[c]) is float for c in from_text) and may_hold_long_number(value)):
            # A decimal or a double is read from its text, never through a float (integers stay exact too).
            numbers = self.decode_numbers(value)
            found.update({c: dig(numbers, self.column_paths[c]) for c in from_text})
        if self.approximate and any(type(v) in INEXACT for c, v in found.items() if c not in from_text):
            # orjson reads an integer beyond 64 bits as a float: a column that may hold a number is written from
            # the exact document, so it keeps every digit (the time field is read through a float either way).
            exact = self.decode_exact(value)
            found.update({c: dig(exact, path) for c, path in self.column_paths.items() if c not in from_text})
        return found

    def decode_numbers(self, value: bytes) -> Any:
        """The document with every fraction as a ``decimal.Decimal`` of its exact text."""
        try:  # as json.loads reads bytes, with a decoder made once (json.loads makes one a call)
            return NUMBERS.decode(value.decode(json.detect_encoding(value), "surrogatepass"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            raise ParseError(f"invalid JSON: {exc}") from None


def _refuse(value: Any) -> Any:
    raise ParseError(f"it holds {type(value).__name__} data, which has no JSON text")


def as_text(column: str, value: Any) -> str:
    """A non-string field value as the JSON text of a string column; what has none (binary or extension data
    from msgpack, a value nested too deeply) is a reason to quarantine the record, naming the column."""
    try:
        return json.dumps(value, default=_refuse)
    except ParseError as exc:
        raise ParseError(f"column {column!r}: {exc.reason}") from None
    except RecursionError:
        raise ParseError(f"column {column!r}: the value is nested too deeply") from None
    except (TypeError, ValueError) as exc:  # a map with keys JSON cannot have, for example
        raise ParseError(f"column {column!r}: {exc}") from None
