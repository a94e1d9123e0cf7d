"""Secrets are masked wherever the configuration is shown, and redacted from every log line."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from click.testing import CliRunner
from pydantic import SecretStr

from shale import logs
from shale.cli import cli
from shale.config import ShaleConfig, load_config, masked, secret_values
from shale.config.model import _Section
from shale.config.secrets import Secret
from shale.errors import ConfigError

BUCKET_KEY = "bucket-key-7f3a9c"
RAFT_SECRET = "raft-secret-51d2e0"
TOKEN = "shale_client-token-8e11"
KAFKA_PASSWORD = 'kafka-pa"ss\\word-42'


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "shale.toml"
    path.write_text(f"""
[bucket]
url = "s3://b"
secret_access_key = "{BUCKET_KEY}"
[metastore]
secret = "{RAFT_SECRET}"
token = "{TOKEN}"
[kafka]
security_protocol = "SASL_SSL"
sasl_username = "shale"
sasl_password = {json.dumps(KAFKA_PASSWORD)}
[kafka.client_options]
"ssl.key.password" = "{RAFT_SECRET}x"
"fetch.min.bytes" = "1"
""")
    return path


def _leaks(text: str) -> list[str]:
    return [s for s in (BUCKET_KEY, RAFT_SECRET, TOKEN, KAFKA_PASSWORD, json.dumps(KAFKA_PASSWORD)[1:-1])
            if s in text]


def test_config_show_check_and_reprs_mask_every_secret(config_file: Path) -> None:
    runner = CliRunner()
    shown = runner.invoke(cli, ["--config", str(config_file), "config", "show"])
    assert shown.exit_code == 0, shown.output
    assert _leaks(shown.output) == []
    data = json.loads(shown.output)
    assert data["bucket"]["secret_access_key"] == "***"
    assert data["metastore"]["secret"] == "***"
    assert data["metastore"]["token"] == "***"
    assert data["metastore"]["accepted_secrets"] == []
    assert data["kafka"]["sasl_password"] == "***"
    assert data["kafka"]["client_options"] == {"ssl.key.password": "***", "fetch.min.bytes": "1"}
    defaults = runner.invoke(cli, ["config", "check", "--defaults"])
    assert defaults.exit_code == 0, defaults.output
    assert 'secret = ""' in defaults.output
    config = load_config(config_file, env={})
    assert _leaks(repr(config)) == []
    assert config.metastore.secret.get_secret_value() == RAFT_SECRET  # the value is there for the code that needs it
    assert set(secret_values(config)) >= {BUCKET_KEY, RAFT_SECRET, TOKEN, KAFKA_PASSWORD}


def test_a_new_field_of_the_secret_type_is_masked_with_no_further_change() -> None:
    class Future(_Section):
        sasl_password: Secret = SecretStr("")
        user: str = "u"

    value = Future(sasl_password="hunter22-secret")  # type: ignore[arg-type]
    assert masked(value) == {"sasl_password": "***", "user": "u"}
    assert "hunter22" not in repr(value)
    assert secret_values(value) == ["hunter22-secret"]


def test_validation_errors_never_print_a_secret(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(env={"SHALE_METASTORE__SECRET": f"[\"{RAFT_SECRET}\"]"})
    assert "metastore.secret = '***'" in str(info.value)
    assert RAFT_SECRET not in str(info.value)
    with pytest.raises(ConfigError) as info:  # a section-level error shows the section's input: masked too
        load_config(env={}, overrides=[f"metastore.token={TOKEN}", "metastore.tls_cert_file=/x.pem"])
    assert TOKEN not in str(info.value)
    assert "tls_key_file together" in str(info.value)
    numeric = load_config(env={}, overrides=["metastore.secret=123456789"])
    assert numeric.metastore.secret.get_secret_value() == "123456789"


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_every_log_line_is_redacted(fmt: str, config_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = load_config(config_file, env={})
    logs.setup_logging("INFO", fmt, secret_values(config))
    log = logging.getLogger("shale.test")
    from shale.kafka import client_options

    log.info("connecting with %s", KAFKA_PASSWORD, extra={"sasl": client_options(config.kafka)["sasl.password"]})
    try:
        raise RuntimeError(f"auth failed for {TOKEN}")
    except RuntimeError:
        log.exception("failed")
    log.warning("config %s", config)
    err = capsys.readouterr().err
    assert "***" in err
    assert _leaks(err) == []
    assert err.count("\n") >= 3


def test_shale_config_is_what_the_secret_walk_covers() -> None:
    assert masked(ShaleConfig())["metastore"]["secret"] == ""  # an unset secret shows as unset
