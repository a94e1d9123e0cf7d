"""Every secret-bearing setting of the configuration models, walked field by field: its value never appears in
``shale config show``, in a log line, nor unredacted in the Spark conf Shale builds (issue 54, point 13).

A setting bears a secret when it is a ``Secret`` (or a list of them), a value of a free-form option map whose key
looks secret (``header.Authorization`` of ``iceberg.rest_options``, ``credential``, ``*.key``), or a URL's
password. The walk is over the models themselves, so a field added later is covered, or fails
``test_every_field_is_classified`` until it is."""

from __future__ import annotations

import io
import json
import logging
import re
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, SecretStr

from shale import logs
from shale.cli import cli
from shale.config import ShaleConfig, load_config, looks_secret, secret_values, spark_redaction_regex
from shale.iceberg import spark_catalog_conf
from shale.iceberg.catalog import rest_properties
from shale.spark import session_conf

OPTION_MAPS = {"bucket.options", "kafka.client_options", "spark.conf", "iceberg.rest_options"}
"""The free-form option maps (``dict[str, str]``): any key, so a secret is recognised by its key."""
SECRET_KEYS = ("credential", "token", "secret", "password", "header.Authorization", "header.X-Api-Key",
               "ssl.key", "sasl.jaas.config", "Authorization", "rest.signing-secret", "cookie",
               "spark.sql.catalog.shale.credential", "spark.sql.catalog.shale.header.Authorization")
NOT_SECRET = {
    "bucket.access_key_id": "an access key's public id (AWS shows it in every request's log)",
    "metastore.tokens_file": "a path", "metastore.token_file": "a path", "metastore.tls_key_file": "a path",
    "kafka.ssl_key_file": "a path",
    "ingest.parsers[].key": "a change table's key: a column path, or '' for the Kafka record key",
}
"""Fields whose name looks secret but whose value is not one, and why."""
REST = {"catalog": "rest", "catalog_uri": "http://127.0.0.1:1/catalog"}


def _fields(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every leaf setting of ``model``: (dotted path, annotation); a list of models is walked as its item."""
    for name, field in model.model_fields.items():
        path, annotation = f"{prefix}{name}", field.annotation
        inner = typing.get_args(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from _fields(annotation, f"{path}.")
        elif typing.get_origin(annotation) is list and inner and isinstance(inner[0], type) and issubclass(
                inner[0], BaseModel):
            yield from _fields(inner[0], f"{path}[].")
        else:
            yield path, annotation


def _is_secret(annotation: Any) -> bool:
    return annotation is SecretStr or "SecretStr" in repr(annotation)


SECRET_FIELDS = sorted(p for p, a in _fields(ShaleConfig) if _is_secret(a))
CASES = [(path, None) for path in SECRET_FIELDS] + [(m, k) for m in sorted(OPTION_MAPS) for k in SECRET_KEYS]


def test_every_field_is_classified() -> None:
    """A field whose name looks secret is a ``Secret`` or named harmless here; the option maps are known ones."""
    fields = dict(_fields(ShaleConfig))
    unclassified = [p for p, a in fields.items() if looks_secret(p.rsplit(".", 1)[-1]) and not _is_secret(a)
                    and p not in NOT_SECRET]
    assert unclassified == []
    assert {p for p, a in fields.items() if a == dict[str, str]} == OPTION_MAPS
    assert {"iceberg.credential", "iceberg.token", "metastore.secret", "metastore.accepted_secrets",
            "bucket.secret_access_key", "kafka.sasl_password"} <= set(SECRET_FIELDS)


def _toml(data: dict[str, Any], prefix: str = "") -> str:
    """A TOML document of nested tables of strings and lists of strings (JSON strings are TOML basic strings)."""
    plain = [f"{json.dumps(k)} = {json.dumps(v, ensure_ascii=False)}" for k, v in data.items()
             if not isinstance(v, dict)]
    out = [f"[{prefix}]", *plain] if prefix and plain else plain
    for k, v in data.items():
        if isinstance(v, dict):
            out.append(_toml(v, f"{prefix}.{k}" if prefix else k))
    return "\n".join(out)


def _config(path: str, key: str | None, value: str) -> dict[str, Any]:
    *sections, name = path.split(".")
    data: dict[str, Any] = {"iceberg": dict(REST), "bucket": {"url": "s3://b"}}
    target = data
    for section in sections:
        target = target.setdefault(section, {})
    if key is not None:
        target[name] = {key: value}
    else:
        target[name] = [value] if name == "accepted_secrets" else value
    return data


def _logged(config: ShaleConfig, value: str, fmt: str) -> str:
    """What a process's log shows of this value when the code logs it carelessly: the configuration, the REST
    catalog's properties, the Spark conf, an error naming it."""
    logs.register_secrets(secret_values(config))  # as shale.cli.common does at start-up
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.JsonFormatter() if fmt == "json" else logs.TextFormatter())
    log = logging.getLogger("shale.test.secrets")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        log.warning("config %s", config)
        log.info("catalog properties %s", rest_properties(config), extra={"conf": spark_catalog_conf(config)})
        log.info("spark conf", extra={"conf": session_conf(config.spark, kafka=False)})
        log.error("the catalog refused %s", value, extra={"value": value})
    finally:
        log.removeHandler(handler)
    return stream.getvalue()


def _forms(value: str) -> list[str]:
    """The value as it is, as JSON would write it and as Python's repr would (a dict's ``str``)."""
    return [value, json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1], repr(value)[1:-1]]


VALUES = st.text(st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="*"), min_size=4,
                 max_size=24).map(lambda s: f"s3cr-{s}")


def _check(tmp_path: Path, path: str, key: str | None, value: str) -> None:
    file = tmp_path / "shale.toml"
    file.write_text(_toml(_config(path, key, value)), encoding="utf-8")
    shown = CliRunner().invoke(cli, ["--config", str(file), "config", "show"])
    assert shown.exit_code == 0, shown.output
    assert not [f for f in _forms(value) if f in shown.output], (path, key)
    config = load_config(file, env={})
    for fmt in ("text", "json"):
        text = _logged(config, value, fmt)
        assert not [f for f in _forms(value) if f in text], (path, key, fmt)
    # Spark: every setting holding the value is named by the redaction regex (UI, REST API, event log) and kept
    # off the JVM's command line (shale.spark passes secret-looking keys through a 0600 properties file).
    for conf in (session_conf(config.spark, kafka=False), spark_catalog_conf(config)):
        regex = re.compile(conf.get("spark.redaction.regex", spark_redaction_regex()))
        carrying = [k for k, v in conf.items() if value in v]
        assert [k for k in carrying if not (regex.search(k) and looks_secret(k))] == [], (path, key)


@pytest.mark.parametrize(("path", "key"), CASES, ids=[f"{p}:{k}" if k else p for p, k in CASES])
def test_each_secret_setting_is_masked_redacted_and_hidden_from_spark(tmp_path: Path, path: str,
                                                                      key: str | None) -> None:
    _check(tmp_path, path, key, 'pa"ss\\word-42')


@settings(max_examples=60, deadline=None)
@given(case=st.sampled_from(CASES), value=VALUES)
@example(case=("iceberg.rest_options", "header.Authorization"), value="Bearer eyJhbGciOi.abc")
@example(case=("iceberg.rest_options", "credential"), value="client:secret-1")
def test_no_secret_value_leaks(tmp_path_factory: pytest.TempPathFactory, case: tuple[str, str | None],
                               value: str) -> None:
    _check(tmp_path_factory.mktemp("cfg"), case[0], case[1], value)


def test_a_url_password_is_refused_without_echoing_it() -> None:
    from shale.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        load_config(env={}, overrides=["iceberg.catalog=rest",
                                       "iceberg.catalog_uri=https://user:hunter2-pw@catalog.example"])
    assert "hunter2-pw" not in str(info.value)
    assert "credential or token" in str(info.value)
