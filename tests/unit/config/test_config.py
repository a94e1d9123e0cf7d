"""Configuration: sources in order, and errors that name the key, the bad value and what is allowed."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from shale.cli import cli
from shale.config import load_config, parse_duration, parse_size
from shale.config.types import MAX_DURATION
from shale.errors import ConfigError


def test_defaults_are_valid_and_embedded() -> None:
    config = load_config(env={})
    assert config.bucket.url == "file://.shale/bucket"
    assert config.block.sync_delay == 900.0


def test_file_then_environment_then_flags(tmp_path: Path) -> None:
    path = tmp_path / "shale.toml"
    path.write_text('[bucket]\nurl = "s3://from-file"\n[block]\nsync_delay = "5m"\ndelete_delay = "1h"\n')
    env = {"SHALE_BLOCK__SYNC_DELAY": "30s", "SHALE_CONFIG_IGNORED": "x"}
    config = load_config(path, env=env, overrides=["block.delete_delay=40", "bucket_index.max_stale_period=5"])
    assert config.bucket.url == "s3://from-file"
    assert config.block.sync_delay == 30.0
    assert config.block.delete_delay == 40.0


def test_every_bad_key_is_named_with_value_and_advice() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(env={}, overrides=["bucket.url=ftp://x", "block.sync_delay=soon", "bukket.url=x"])
    text = str(info.value)
    assert "bucket.url = 'ftp://x': unsupported scheme 'ftp'" in text
    assert "block.sync_delay = 'soon'" in text
    assert "'15m'" in text
    assert "bukket: unknown key" in text


def test_topic_patterns_are_checked_when_the_config_loads(tmp_path: Path) -> None:
    path = tmp_path / "shale.toml"
    path.write_text('[ingest]\ntopic_pattern = "logs.("\n[[ingest.parsers]]\ntopic_pattern = "[a-"\nparser = "json"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    text = str(info.value)
    assert "ingest.topic_pattern = 'logs.(': not a valid regular expression" in text
    assert "ingest.parsers.0.topic_pattern = '[a-': not a valid regular expression" in text


def test_missing_and_malformed_files_are_clear(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml", env={})
    bad = tmp_path / "bad.toml"
    bad.write_text("[bucket\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad, env={})


@pytest.mark.parametrize(("text", "seconds"), [("250ms", 0.25), ("90s", 90), ("15m", 900), ("1h30m", 5400),
                                               ("7d", 604800), (12, 12.0), ("0", 0.0)])
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["-1", "5 minutes", "1x", True, "m5", float("nan"), float("inf"), -0.5,
                                  "99999999999999999999d"])
def test_bad_durations(text: object) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def test_sizes() -> None:
    assert parse_size("64MiB") == 64 * 1024 * 1024
    assert parse_size("1GB") == 10**9
    assert parse_size(10) == 10
    with pytest.raises(ValueError, match="size"):
        parse_size("lots")


def test_config_check_command_exit_codes() -> None:
    runner = CliRunner()
    ok = runner.invoke(cli, ["--set", "bucket.url=memory://x", "config", "check"])
    assert ok.exit_code == 0
    assert "configuration is valid" in ok.output
    bad = runner.invoke(cli, ["--set", "kafka.bootstrap_servers=nohost", "config", "check"])
    assert bad.exit_code == 1
    assert "kafka.bootstrap_servers = 'nohost': 'nohost' is not host:port" in bad.output


@given(st.one_of(st.floats(), st.integers(), st.text(max_size=12)))
def test_a_duration_is_a_finite_number_of_seconds_or_refused(value: object) -> None:
    """Issue 26 case 8: ``nan`` and ``inf`` were accepted (``lease_duration = nan`` failed every poll)."""
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        message = str(exc)
        seconds = None
    if seconds is None:
        assert "duration" in message
    else:
        assert math.isfinite(seconds)
        assert 0 <= seconds <= MAX_DURATION


def test_the_delete_delay_outlives_a_stale_bucket_index() -> None:
    """Issue 26 case 7: a reader may use a bucket index up to max_stale_period old; a block deleted sooner after
    its mark is listed by that reader although its objects are gone."""
    with pytest.raises(ConfigError) as info:
        load_config(env={}, overrides=["block.delete_delay=15m", "bucket_index.max_stale_period=1h"])
    assert "block.delete_delay (900 s) must be at least bucket_index.max_stale_period (3600 s)" in str(info.value)
    with pytest.raises(ConfigError, match=r"block.delete_delay \(60 s\) must be at least block.sync_delay \(900 s\)"):
        load_config(env={}, overrides=["block.delete_delay=1m", "bucket_index.max_stale_period=1m"])
    config = load_config(env={})
    assert config.block.delete_delay >= config.bucket_index.max_stale_period


@pytest.mark.parametrize(("template", "named"), [
    ("{team.name}", "{team.name}"), ("{team[0]}", "{team[0]}"), ("{other}", "{other}"), ("{team!r}", "{team}"),
    ("{team:>5}", "{team}"), ("{}", "{}"), ("{team", "not a valid template")])
def test_a_tenant_template_that_cannot_work_is_refused(tmp_path: Path, template: str, named: str) -> None:
    """Issue 26 case 8: ``{team.name}`` passed ``shale config check`` and then failed every task."""
    path = tmp_path / "shale.toml"
    path.write_text(f'[[ingest.tenants]]\ntopic_pattern = "(?P<team>[a-z]+)\\\\..*"\ntenant = "{template}"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert "ingest.tenants.0" in str(info.value)
    assert named in str(info.value)
    path.write_text('[[ingest.tenants]]\ntopic_pattern = "(?P<team>[a-z]+)\\\\..*"\ntenant = "t-{team}"\n')
    assert load_config(path, env={}).ingest.tenants[0].tenant == "t-{team}"


@pytest.mark.parametrize("key", ["options", "spark_options"])
def test_a_kafka_options_table_of_an_earlier_release_is_refused_naming_client_options(key: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load_config(env={}, overrides=[f'kafka.{key}={{"fetch.min.bytes" = "1"}}'])
    assert f"kafka.{key} is gone" in str(refused.value)
    assert "kafka.client_options" in str(refused.value)
