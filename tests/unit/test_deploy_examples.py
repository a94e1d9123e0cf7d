"""The example deployment under deploy/ is valid: the shared configuration loads with every machine's environment
file, each metastore member finds itself among the members, an application machine runs ingest and compaction
against the remote members with the pinned connector, and the systemd units run commands that exist."""

from __future__ import annotations

import shlex
from pathlib import Path

import click
import pytest

from shale.cli import cli
from shale.config import load_config
from shale.launcher import Deployment
from shale.spark import KAFKA_CONNECTOR_PACKAGE, session_conf

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
CONFIG = DEPLOY / "config" / "shale.toml"


def _env(name: str) -> dict[str, str]:
    lines = (DEPLOY / "config" / name).read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))


@pytest.mark.parametrize("member", ["meta-1", "meta-2", "meta-3"])
def test_each_metastore_member_is_one_of_the_members(member: str) -> None:
    config = load_config(CONFIG, env=_env(f"{member}.env"))
    m = config.metastore
    assert m.raft_address == f"{member}:7071"
    assert m.listen == f"{member}:7070"
    assert {x.raft for x in m.members} == {"meta-1:7071", "meta-2:7071", "meta-3:7071"}
    assert f"https://{m.listen}" in m.addresses
    assert m.tls_cert_file  # HTTPS
    assert m.tokens_file  # authenticated API
    assert m.secret  # Raft traffic is encrypted


def test_an_application_machine_runs_ingest_and_compaction_on_the_cluster(tmp_path: Path) -> None:
    config = load_config(CONFIG, env=_env("app.env"))
    assert config.spark.master.startswith("spark://")
    assert session_conf(config.spark, kafka=True)["spark.jars.packages"] == KAFKA_CONNECTOR_PACKAGE
    services = Deployment(config, [], tmp_path).services
    assert [s.name for s in services] == ["ingest-backup", "ingest-backup-1", "ingest-partition",
                                          "ingest-partition-1", "compact-0"]  # a shard's driver or a standby each
    assert config.ingest.shards == 2
    assert config.metastore.token_file  # the remote members' token, not one `shale run` makes up


def test_the_systemd_units_run_existing_commands_with_the_shared_configuration() -> None:
    units = sorted((DEPLOY / "systemd").glob("*.service"))
    assert [u.name for u in units] == ["shale-metastore.service", "shale-run.service"]
    for unit in units:
        (exec_start,) = [line for line in unit.read_text().splitlines() if line.startswith("ExecStart=")]
        argv = shlex.split(exec_start.removeprefix("ExecStart="))
        assert argv[1:3] == ["--config", "/etc/shale/shale.toml"]
        command = argv[5]
        assert command in cli.list_commands(click.Context(cli)), command
        assert "EnvironmentFile=/etc/shale/shale.env" in unit.read_text()
