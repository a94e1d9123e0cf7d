"""Spark's own UI and REST API redact every secret-bearing setting of a session Shale builds (issue 54, point 13):
the REST catalog's credential and its header.Authorization, whose keys Spark's default redaction regex misses,
and a secret in spark.conf. A real local Spark session, its UI on a loopback port, in a process of its own: a
pytest worker may hold a session already (another test file's), which the builder would return, UI off."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

from shale.config import ShaleConfig
from shale.iceberg import spark_catalog_conf
from shale.spark import spark_session

CREDENTIAL = "client-id:s3cr-client-9d1"  # no word Spark's default regex finds in a value
BEARER = "Bearer s3cr-eyJhbGciOi-77a"
OPTION = "s3cr-option-value-5c2"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _environment(port: int) -> str:
    """Run in a fresh process: a Shale session with the catalog's conf, and what its UI's REST API shows."""
    config = ShaleConfig.model_validate({
        "iceberg": {"catalog": "rest", "catalog_uri": "http://127.0.0.1:1/catalog", "credential": CREDENTIAL,
                    "rest_options": {"header.Authorization": BEARER}},
        "spark": {"master": "local[1]", "conf": {"spark.hadoop.fs.s3a.session.token": OPTION}}})
    extra = {**spark_catalog_conf(config), "spark.ui.enabled": "true", "spark.ui.port": str(port)}
    session = spark_session("shale-redaction", config.spark, kafka=False, extra_conf=extra)
    try:
        app = session.sparkContext.applicationId
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/applications/{app}/environment",
                                    timeout=30) as answer:
            return str(answer.read().decode())
    finally:
        session.stop()


def test_spark_ui_shows_the_catalog_credential_and_headers_redacted() -> None:
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)}
    probe = ("import sys; from tests.integration.test_spark_redaction import _environment; "
             "sys.stdout.write(_environment(int(sys.argv[1])))")
    done = subprocess.run([sys.executable, "-c", probe, str(_free_port())], cwd=root, env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    environment = done.stdout
    shown = dict(json.loads(environment)["sparkProperties"])
    assert shown["spark.sql.catalog.shale.credential"] == "*********(redacted)"
    assert shown["spark.sql.catalog.shale.header.Authorization"] == "*********(redacted)"
    assert shown["spark.hadoop.fs.s3a.session.token"] == "*********(redacted)"
    assert [s for s in (CREDENTIAL, BEARER, OPTION, "s3cr-") if s in environment] == []
