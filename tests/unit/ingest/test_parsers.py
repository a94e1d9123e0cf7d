"""Parsers: every line of every Loghub sample parses with its preset; bad input is a clear quarantine reason."""

from __future__ import annotations

import datetime as dt
import json

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shale.demo import LOGHUB_FORMATS, loghub_lines
from shale.encoder.parsers import ParseError, available_parsers, infer_year, load_parser
from shale.errors import ConfigError

KAFKA_MS = int(dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC).timestamp() * 1000)


def test_builtins_are_registered_as_entry_points() -> None:
    assert {"json", "text", "msgpack"} <= set(available_parsers())


@pytest.mark.parametrize(("sample", "preset"), sorted(LOGHUB_FORMATS.items()))
def test_every_loghub_line_parses(sample: str, preset: str) -> None:
    parser = load_parser("text", {"preset": preset})
    lines = loghub_lines(sample)
    assert len(lines) == 2000
    times = []
    for line in lines:
        event_us, columns = parser.parse(line, KAFKA_MS)
        event_ms = event_us // 1000
        times.append(event_ms)
        assert columns["message"] is not None
        for label in parser.labels():
            assert columns[label], f"{sample}: label {label} empty in {line!r}"
    assert min(times) > int(dt.datetime(2004, 1, 1, tzinfo=dt.UTC).timestamp() * 1000)
    assert max(times) <= KAFKA_MS + 86_400_000  # never more than a day after the record was written


def test_formats_without_a_year_take_it_from_the_kafka_time() -> None:
    parser = load_parser("text", {"preset": "openssh"})
    line = b"Dec 10 06:55:46 LabSZ sshd[24200]: Invalid user webmaster from 173.234.31.186"
    event_us, columns = parser.parse(line, KAFKA_MS)
    event_ms = event_us // 1000
    assert dt.datetime.fromtimestamp(event_ms / 1000, dt.UTC) == dt.datetime(2025, 12, 10, 6, 55, 46, tzinfo=dt.UTC)
    assert columns == {"host": "LabSZ", "process": "sshd", "pid": "24200",
                       "message": "Invalid user webmaster from 173.234.31.186"}
    june = infer_year(dt.datetime(1900, 6, 14, 15, 16, 1, tzinfo=dt.UTC), KAFKA_MS)
    assert june.year == 2026


def test_text_rejects_lines_that_do_not_match() -> None:
    parser = load_parser("text", {"preset": "hdfs"})
    with pytest.raises(ParseError, match="does not match the pattern"):
        parser.parse(b"something else entirely", KAFKA_MS)
    with pytest.raises(ParseError, match="not utf-8"):
        parser.parse(b"\xff\xfe", KAFKA_MS)
    with pytest.raises(ParseError, match="no value"):
        parser.parse(None, KAFKA_MS)


def test_custom_text_pattern_with_timezone() -> None:
    parser = load_parser("text", {"pattern": r"(?P<ts>\S+ \S+) (?P<level>\w+) (?P<message>.*)",
                                  "time_format": "%Y-%m-%d %H:%M:%S", "labels": ["level"],
                                  "timezone": "Europe/Paris"})
    event_us, columns = parser.parse(b"2026-07-01 12:00:00 WARN disk", KAFKA_MS)
    event_ms = event_us // 1000
    assert event_ms == int(dt.datetime(2026, 7, 1, 10, 0, tzinfo=dt.UTC).timestamp() * 1000)
    assert columns == {"level": "WARN", "message": "disk"}


@pytest.mark.parametrize(("options", "message"), [
    ({"preset": "nope"}, "options.preset = 'nope': Input should be 'apache'"),
    ({"pattern": "(", "time_format": "%Y"}, "not a valid regular expression"),
    ({"pattern": "(?P<x>.*)", "time_format": "%Y"}, "named group 'ts'"),
    ({"pattern": "(?P<ts>.*)"}, "set a preset, or both"),
    ({"preset": "hdfs", "colour": "red"}, "options.colour: unknown option; options: preset"),
])
def test_bad_text_options_are_config_errors(options: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_parser("text", options)


def test_json_parser_fields_labels_and_formats() -> None:
    parser = load_parser("json", {"time_field": "meta.ts", "time_format": "iso8601",
                                  "label_fields": ["level"], "fields": ["msg", "meta.count"]})
    value = json.dumps({"meta": {"ts": "2026-11-22T10:00:00Z", "count": 3}, "level": "ERROR", "msg": "boom"})
    event_us, columns = parser.parse(value.encode(), KAFKA_MS)
    event_ms = event_us // 1000
    assert event_ms == int(dt.datetime(2026, 11, 22, 10, tzinfo=dt.UTC).timestamp() * 1000)
    assert columns == {"level": "ERROR", "msg": "boom", "meta_count": "3"}
    assert parser.labels() == ["level"]
    epoch = load_parser("json", {"time_field": "t", "time_format": "epoch_ms"})
    assert epoch.parse(b'{"t": 1795000000123}', KAFKA_MS)[0] == 1795000000123000  # microseconds


@pytest.mark.parametrize(("value", "reason"), [
    (b"{not json", "invalid JSON"),
    (b"[1, 2]", "expected an object"),
    (b'{"other": 1}', "no time field 'ts'"),
    (b'{"ts": "yesterday"}', "does not match"),
])
def test_json_rejections(value: bytes, reason: str) -> None:
    parser = load_parser("json", {"time_field": "ts"})
    with pytest.raises(ParseError, match=reason):
        parser.parse(value, KAFKA_MS)


def test_json_keeps_the_microseconds_of_iso_and_epoch_times() -> None:
    iso = load_parser("json", {"time_field": "ts"})
    assert iso.parse(b'{"ts": "2026-11-25T07:36:05.383971Z"}', KAFKA_MS)[0] == int(
        dt.datetime(2026, 11, 25, 7, 36, 5, tzinfo=dt.UTC).timestamp()) * 1_000_000 + 383_971
    micros = load_parser("json", {"time_field": "ts", "time_format": "epoch_us"})
    assert micros.parse(b'{"ts": 1795000000383971}', KAFKA_MS)[0] == 1795000000383971
    text = load_parser("text", {"pattern": r"(?P<ts>\S+) (?P<m>.*)", "time_format": "%Y-%m-%dT%H:%M:%S.%f"})
    assert text.parse(b"2026-11-25T07:36:05.383971 hello", KAFKA_MS)[0] % 1_000_000 == 383_971


def test_msgpack_parser() -> None:
    parser = load_parser("msgpack", {"time_field": "ts", "time_format": "epoch_s", "label_fields": ["level"]})
    event_us, columns = parser.parse(msgpack.packb({"ts": 1795000000, "level": "INFO"}), KAFKA_MS)
    assert (event_us, columns) == (1795000000000000, {"level": "INFO"})
    with pytest.raises(ParseError, match="invalid msgpack"):
        parser.parse(b"\xc1", KAFKA_MS)


def test_unknown_parser_and_missing_options() -> None:
    with pytest.raises(ConfigError, match="no parser named 'xml'"):
        load_parser("xml")
    with pytest.raises(ConfigError, match="time_field is required"):
        load_parser("json", {})


@pytest.mark.parametrize("value", [
    b'{"ts": 5, "level": 123456789012345678901234567890, "x": {"n": 98765432109876543210987}}',  # beyond 64 bits
    b'\xef\xbb\xbf{"ts": 5, "level": "bom", "x": 1}',  # a byte-order mark
    '{"ts": 5, "level": "utf-16", "x": 1.5}'.encode("utf-16"),
    b'{"ts": 5, "level": NaN, "x": [1, 2.0, "\\ud800"]}',  # NaN and a lone surrogate
    b'{"ts": 5, "level": "a", "level": "last", "x": null}',  # a repeated key: the last one counts
    b'{"ts": 5.9, "level": "fast path", "x": "\\u00e9"}',
])
def test_json_reads_every_record_as_the_standard_library_does(value: bytes) -> None:
    parser = load_parser("json", {"time_field": "ts", "time_format": "epoch_s", "label_fields": ["level"],
                                  "fields": ["x"]})
    document = json.loads(value)
    expected = {name: None if document.get(name) is None else
                document[name] if isinstance(document[name], str) else json.dumps(document[name])
                for name in ("level", "x")}
    ts = document["ts"]
    assert parser.parse(value, 0) == (ts * 1_000_000 if isinstance(ts, int) else round(float(ts) * 1_000_000),
                                      expected)


_json_leaves = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.text(max_size=5),
                         st.floats(allow_nan=False, allow_infinity=False))
_json_values = st.recursive(_json_leaves, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.sampled_from(["a", "b", "level"]), inner, max_size=3), max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["level", "a", "b", "x"]), _json_values, max_size=4),
       st.sampled_from([["level", "x"], ["level", "a.b"], ["a.level"], []]))
def test_json_columns_are_the_documents_values_whatever_their_paths(document: dict[str, object],
                                                                     fields: list[str]) -> None:
    # Top-level paths are looked up directly and dot paths walked: either way a column holds the document's
    # value at its path, a string as it is and anything else as its JSON text (the standard library's reading).
    value = json.dumps({"ts": 7, **document}).encode()
    parser = load_parser("json", {"time_field": "ts", "time_format": "epoch_ms", "fields": fields})

    def at(path: str) -> object:
        found: object = json.loads(value)
        for part in path.split("."):
            if not isinstance(found, dict) or part not in found:
                return None
            found = found[part]
        return found

    expected = {path.replace(".", "_"): None if at(path) is None else at(path) if isinstance(at(path), str) else
                json.dumps(at(path)) for path in fields}
    assert parser.parse(value, 0) == (7000, expected)
