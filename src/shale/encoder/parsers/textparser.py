"""``text``: one log line per record, a regular expression with named groups, and a timestamp pattern.

The group ``ts`` holds the timestamp, parsed with ``time_format`` (strftime; a pattern without a year takes it
from the Kafka record's time, see ``infer_year``). Other named groups become string columns; those listed in
``labels`` are labels too. Presets cover the log formats of the Loghub samples (Apache, HDFS, OpenSSH, Spark,
ZooKeeper, Linux syslog); a preset's options can be overridden one by one.
"""

from __future__ import annotations

import codecs
import datetime as dt
import re
import zoneinfo
from typing import Any, Literal

import pyarrow as pa
from pydantic import Field, field_validator, model_validator

from shale.config import ParserOptions, Pattern, StrftimeFormat, TimeZone
from shale.encoder.parsers.base import ParseError, Parser, infer_year, to_us

PRESETS: dict[str, dict[str, Any]] = {
    "apache": {"pattern": r"\[(?P<ts>\w{3} \w{3} +\d{1,2} \d{2}:\d{2}:\d{2} \d{4})\] \[(?P<level>\w+)\] "
                          r"(?P<message>.*)",
               "time_format": "%a %b %d %H:%M:%S %Y", "labels": ["level"]},
    "hdfs": {"pattern": r"(?P<ts>\d{6} \d{6}) (?P<pid>\d+) (?P<level>[A-Z]+) (?P<component>[^:\s]+): (?P<message>.*)",
             "time_format": "%y%m%d %H%M%S", "labels": ["level", "component"]},
    "openssh": {"pattern": r"(?P<ts>\w{3} +\d{1,2} \d{2}:\d{2}:\d{2}) (?P<host>\S+) (?P<process>[^\[\s:]+)"
                           r"\[(?P<pid>\d+)\]: (?P<message>.*)",
                "time_format": "%b %d %H:%M:%S", "labels": ["host", "process"]},
    "spark": {"pattern": r"(?P<ts>\d{2}/\d{2}/\d{2} \d{2}:\d{2}:\d{2}) (?P<level>[A-Z]+) (?P<component>[^:\s]+): "
                         r"(?P<message>.*)",
              "time_format": "%y/%m/%d %H:%M:%S", "labels": ["level", "component"]},
    "zookeeper": {"pattern": r"(?P<ts>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2},\d{3}) - (?P<level>[A-Z]+) +"
                             r"\[(?P<thread>.+?):(?P<component>[\w$]+)@\d+\] - (?P<message>.*)",
                  "time_format": "%Y-%m-%d %H:%M:%S,%f", "labels": ["level", "component"]},
    "linux": {"pattern": r"(?P<ts>\w{3} +\d{1,2} \d{2}:\d{2}:\d{2}) (?P<host>\S+) (?P<process>[^\[:]+?)"
                         r"(\[(?P<pid>\d+)\])?: (?P<message>.*)",
              "time_format": "%b %d %H:%M:%S", "labels": ["host", "process"]},
}


class TextOptions(ParserOptions):
    """Options of ``text``: a preset, or a pattern and a time format (a preset's options can be overridden)."""

    preset: Literal["apache", "hdfs", "openssh", "spark", "zookeeper", "linux"] | None = Field(
        default=None, description="a built-in pattern, time format and labels for a common log format")
    pattern: Pattern | None = Field(default=None, description="regex matched against the whole line; the named "
                                    "group ts holds the time, the other named groups become string columns")
    time_format: StrftimeFormat | None = Field(default=None, description="strftime pattern of the ts group "
                                               "(without a year: the Kafka record's year)")
    labels: list[str] | None = Field(default=None, description="group names that are also labels (low-cardinality)")
    timezone: TimeZone = Field(default="UTC", description="IANA zone of the timestamps")
    encoding: str = Field(default="utf-8", description="the lines' text encoding")

    @field_validator("encoding")
    @classmethod
    def _encoding(cls, value: str) -> str:
        try:
            codecs.lookup(value)
        except LookupError:
            raise ValueError(f"{value!r} is not a text encoding, e.g. 'utf-8' or 'latin-1'") from None
        return value

    @model_validator(mode="after")
    def _complete(self) -> TextOptions:
        preset = PRESETS.get(self.preset or "", {})
        pattern = self.pattern or preset.get("pattern")
        if pattern is None or (self.time_format or preset.get("time_format")) is None:
            raise ValueError("set a preset, or both pattern and time_format")
        if "ts" not in re.compile(pattern).groupindex:
            raise ValueError("the pattern needs a named group 'ts' for the timestamp")
        return self


class TextLineParser(Parser):
    """One log line per record; its options are ``TextOptions``."""

    name = "text"
    options_model = TextOptions
    time_unit = "us"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        settings = self.settings
        assert isinstance(settings, TextOptions)
        preset = PRESETS.get(settings.preset or "", {})
        self.regex = re.compile(settings.pattern or preset["pattern"])
        self.time_format = settings.time_format or str(preset["time_format"])
        self.has_year = "%Y" in self.time_format or "%y" in self.time_format
        labels = settings.labels if settings.labels is not None else preset.get("labels", [])
        self.label_names = [str(n) for n in labels]
        self.group_names = [g for g in self.regex.groupindex if g != "ts"]
        self.encoding = settings.encoding
        self.tz: dt.tzinfo = dt.UTC if settings.timezone == "UTC" else zoneinfo.ZoneInfo(settings.timezone)

    def columns(self) -> dict[str, pa.DataType]:
        return {name: pa.string() for name in self.group_names}

    def labels(self) -> list[str]:
        return self.label_names

    def parse(self, value: bytes | None, kafka_time_ms: int) -> tuple[int, dict[str, Any]]:
        if value is None:
            raise ParseError("the record has no value")
        try:
            line = value.decode(self.encoding).rstrip("\r\n")
        except UnicodeDecodeError as exc:
            raise ParseError(f"not {self.encoding} text: {exc}") from None
        match = self.regex.fullmatch(line)
        if match is None:
            raise ParseError(f"line does not match the pattern: {line[:200]!r}")
        stamp = " ".join(match.group("ts").split())
        try:
            parsed = dt.datetime.strptime(stamp, self.time_format).replace(tzinfo=self.tz)
        except ValueError as exc:
            raise ParseError(f"timestamp {stamp!r} does not match {self.time_format!r}: {exc}") from None
        if not self.has_year:
            parsed = infer_year(parsed, kafka_time_ms)
        return to_us(parsed), {name: match.group(name) for name in self.group_names}
