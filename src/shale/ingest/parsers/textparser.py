"""``text``: one log line per record, a regular expression with named groups, and a timestamp pattern.

The group ``ts`` holds the timestamp, parsed with ``time_format`` (strftime; a pattern without a year takes it
from the Kafka record's time, see ``infer_year``). Other named groups become string columns; those listed in
``labels`` are labels too. Presets cover the log formats of the Loghub samples (Apache, HDFS, OpenSSH, Spark,
ZooKeeper, Linux syslog); a preset's options can be overridden one by one.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any, ClassVar

import pyarrow as pa

from shale.errors import ConfigError
from shale.ingest.parsers.base import ParseError, Parser, infer_year, to_ms

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


class TextLineParser(Parser):
    """Options: ``preset`` (apache, hdfs, openssh, spark, zookeeper, linux) and/or ``pattern`` (regex with a
    ``ts`` group, matched against the whole line), ``time_format`` (strftime), ``labels`` (group names),
    ``timezone`` (default UTC), ``encoding`` (default utf-8)."""

    name = "text"
    options_schema: ClassVar[dict[str, type | tuple[type, ...]]] = {
        "preset": str, "pattern": str, "time_format": str, "labels": list, "timezone": str, "encoding": str}

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        preset = options.get("preset")
        if preset is not None and preset not in PRESETS:
            raise ConfigError(f"parser text: preset {preset!r} is unknown; presets: {', '.join(sorted(PRESETS))}")
        merged = {**PRESETS.get(preset or "", {}), **{k: v for k, v in options.items() if k != "preset"}}
        if "pattern" not in merged or "time_format" not in merged:
            raise ConfigError("parser text: set a preset, or both pattern and time_format")
        try:
            self.regex = re.compile(str(merged["pattern"]))
        except re.error as exc:
            raise ConfigError(f"parser text: pattern is not a valid regular expression: {exc}") from None
        if "ts" not in self.regex.groupindex:
            raise ConfigError("parser text: the pattern needs a named group 'ts' for the timestamp")
        self.time_format = str(merged["time_format"])
        self.has_year = "%Y" in self.time_format or "%y" in self.time_format
        self.label_names = [str(n) for n in merged.get("labels", [])]
        self.group_names = [g for g in self.regex.groupindex if g != "ts"]
        self.encoding = str(merged.get("encoding", "utf-8"))
        zone = str(merged.get("timezone", "UTC"))
        try:
            self.tz: dt.tzinfo = dt.UTC if zone == "UTC" else __import__("zoneinfo").ZoneInfo(zone)
        except Exception as exc:
            raise ConfigError(f"parser text: timezone {zone!r} is unknown: {exc}") from None

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
        return to_ms(parsed), {name: match.group(name) for name in self.group_names}
