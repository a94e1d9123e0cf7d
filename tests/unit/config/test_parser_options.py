"""Parser and tenant rules are validated when the configuration loads, like every other key (issue 29, case 1):
an unknown parser or a bad option value is refused with the key's path and what is allowed, and `shale config
explain ingest.parsers` prints each option with its type, default and meaning."""

from __future__ import annotations

import datetime as dt
import random
import string
from pathlib import Path

import pytest
from click.testing import CliRunner

from shale.cli import cli
from shale.config import load_config
from shale.config.parsers import NAMED_TIME_FORMATS, check_time_format, installed_parsers, options_model
from shale.encoder.parsers import load_parser
from shale.encoder.parsers.textparser import PRESETS, TextOptions
from shale.errors import ConfigError


def _config(tmp_path: Path, rules: str) -> Path:
    path = tmp_path / "shale.toml"
    path.write_text('[ingest]\ntopics = ["logs"]\n' + rules)
    return path


def test_a_mistyped_time_format_is_refused_with_its_path_and_the_allowed_values(tmp_path: Path) -> None:
    path = _config(tmp_path, '[[ingest.parsers]]\nparser = "json"\n'
                             'options = { time_field = "ts", time_format = "isoo8601" }\n')
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    text = str(info.value)
    assert "ingest.parsers.0.options.time_format = 'isoo8601': 'isoo8601' is not a time format" in text
    assert "iso8601, epoch_ms, epoch_s, epoch_us or a strftime pattern" in text


def test_an_unknown_parser_names_the_installed_ones(tmp_path: Path) -> None:
    path = _config(tmp_path, '[[ingest.parsers]]\nparser = "jsn"\noptions = { time_field = "ts" }\n')
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert ("ingest.parsers.0.parser = 'jsn': unknown parser 'jsn'; installed parsers: avro, json, json_schema, "
            "msgpack, protobuf, text") in str(info.value)


def test_unknown_missing_and_mistyped_options_are_each_named(tmp_path: Path) -> None:
    path = _config(tmp_path, '[[ingest.parsers]]\nparser = "json"\noptions = { time_feld = "ts", fields = "a" }\n'
                             '[[ingest.parsers]]\nparser = "text"\noptions = { preset = "apachee" }\n'
                             '[[ingest.parsers]]\nparser = "text"\noptions = { pattern = "(?P<x>.*)", '
                             'time_format = "%Y %Q", timezone = "Mars/Olympus" }\n')
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    text = str(info.value)
    assert "ingest.parsers.0.options.time_feld: unknown option; options: time_field, time_format" in text
    assert "ingest.parsers.0.options.time_field is required" in text
    assert "ingest.parsers.0.options.fields = 'a': Input should be a valid list" in text
    assert "ingest.parsers.1.options.preset = 'apachee': Input should be 'apache'" in text
    assert "ingest.parsers.2.options.time_format = '%Y %Q': '%Y %Q' uses unknown strftime directives %Q" in text
    assert "ingest.parsers.2.options.timezone = 'Mars/Olympus': 'Mars/Olympus' is not a time zone" in text


def test_tenant_rules_name_only_groups_of_their_pattern(tmp_path: Path) -> None:
    path = _config(tmp_path, '[[ingest.tenants]]\ntopic_pattern = "(?P<team>[a-z]+)\\\\..*"\ntenant = "{tean}"\n'
                             '[[ingest.tenants]]\ntopic_pattern = "x"\ntenant = "Acme.Corp"\n'
                             '[[ingest.tenants]]\ntopic_pattern = "(?P<team>[a-z]+)"\ntenant = "t-{team}"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    text = str(info.value)
    assert "ingest.tenants.0" in text
    assert "{tean} is not a named group of topic_pattern" in text
    assert "its groups: ['team']" in text
    assert "ingest.tenants.1" in text
    assert "a tenant is made of a-z" in text
    assert "ingest.tenants.2" not in text


def test_config_check_refuses_what_ingest_would_quarantine(tmp_path: Path) -> None:
    path = _config(tmp_path, '[[ingest.parsers]]\nparser = "json"\n'
                             'options = { time_field = "ts", time_format = "isoo8601" }\n')
    result = CliRunner().invoke(cli, ["--config", str(path), "config", "check"])
    assert result.exit_code == 1
    assert "configuration is valid" not in result.output
    assert "ingest.parsers.0.options.time_format" in result.output


def test_explain_prints_every_option_with_type_default_and_meaning() -> None:
    result = CliRunner().invoke(cli, ["config", "explain", "ingest.parsers"])
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert "ingest.parsers.topic_pattern" in out
    assert "ingest.parsers.parser" in out
    for parser in installed_parsers():
        assert f"ingest.parsers.options ({parser})" in out
    assert "ingest.parsers.options.time_format time format (iso8601, epoch_ms" in out
    assert 'default "iso8601"' in out
    assert "ingest.parsers.options.time_field string required" in out
    assert "ingest.parsers.options.preset one of apache, hdfs, openssh, spark, zookeeper, linux" in out
    defaults = CliRunner().invoke(cli, ["config", "check", "--defaults"])
    assert "# each [[ingest.parsers]] rule" in defaults.output
    assert "# each [[ingest.tenants]] rule" in defaults.output
    bad = CliRunner().invoke(cli, ["config", "explain", "ingest.parsrs"])
    assert bad.exit_code == 1
    assert "no configuration key 'ingest.parsrs'" in bad.output


def test_the_text_presets_are_the_allowed_presets() -> None:
    assert TextOptions.model_fields["preset"].annotation is not None
    for preset in PRESETS:
        assert load_parser("text", {"preset": preset}).time_format == PRESETS[preset]["time_format"]
    assert options_model("msgpack") is options_model("json")


_RANDOM = random.Random(29)
_TEXTS = ["".join(_RANDOM.choices(string.printable, k=_RANDOM.randint(0, 12))) for _ in range(300)]


@pytest.mark.parametrize("text", [*NAMED_TIME_FORMATS, "isoo8601", "ISO8601", "epoch", "", *_TEXTS])
def test_a_time_format_without_a_directive_is_only_a_named_one(text: str) -> None:
    if "%" in text:
        return
    if text in NAMED_TIME_FORMATS:
        assert check_time_format(text) == text
    else:
        with pytest.raises(ValueError, match="is not a time format"):
            check_time_format(text)


_PATTERNS = [_RANDOM.choice([" ", "-", "/", "T", ":"]).join(
    f"%{d}" for d in _RANDOM.sample("aAbBdHIjmMpSyYfzZuwUWGV", _RANDOM.randint(1, 6))) for _ in range(200)]


@pytest.mark.parametrize("pattern", _PATTERNS)
def test_every_directive_an_accepted_pattern_uses_is_one_strptime_knows(pattern: str) -> None:
    assert check_time_format(pattern) == pattern
    moment = dt.datetime(2026, 11, 25, 7, 36, 5, 383971, tzinfo=dt.UTC)
    problem = ""
    try:
        dt.datetime.strptime(moment.strftime(pattern), pattern)
    except ValueError as exc:  # some combinations are refused by strptime (%G without %V), never as unknown
        problem = str(exc)
    assert "bad directive" not in problem, pattern


@pytest.mark.parametrize("pattern", ["%Q", "%Y-%m-%d %E", "%", "%Y %"])
def test_a_directive_strptime_does_not_know_is_refused(pattern: str) -> None:
    with pytest.raises(ValueError, match="strftime"):
        check_time_format(pattern)
    with pytest.raises(ValueError, match=r"bad directive|stray %"):
        dt.datetime.strptime("2026", pattern)
