"""Configuration: sources in order, and errors that name the key, the bad value and what is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from shale.cli import cli
from shale.config import load_config, parse_duration, parse_size
from shale.errors import ConfigError


def test_defaults_are_valid_and_embedded() -> None:
    config = load_config(env={})
    assert config.bucket.url == "file://.shale/bucket"
    assert config.block.sync_delay == 900.0


def test_file_then_environment_then_flags(tmp_path: Path) -> None:
    path = tmp_path / "shale.toml"
    path.write_text('[bucket]\nurl = "s3://from-file"\n[block]\nsync_delay = "5m"\ndelete_delay = "1h"\n')
    env = {"SHALE_BLOCK__SYNC_DELAY": "30s", "SHALE_CONFIG_IGNORED": "x"}
    config = load_config(path, env=env, overrides=["block.delete_delay=10"])
    assert config.bucket.url == "s3://from-file"
    assert config.block.sync_delay == 30.0
    assert config.block.delete_delay == 10.0


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


@pytest.mark.parametrize("text", ["-1", "5 minutes", "1x", True, "m5"])
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
