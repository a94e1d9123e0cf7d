"""`shale run`'s tokens and secrets, without starting processes: each child a token of its own role in a 0600
file, the metastore's tokens file in step with the configured one, secrets off the children's command lines; and
``run.services`` on one machine of a multi-machine deployment: without the metastore, the others use the configured
remote nodes and token (an embedded metastore there is refused)."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from shale.cli import cli
from shale.config import load_config
from shale.errors import ConfigError
from shale.launcher import BACKGROUND_NICE, Deployment, lease_held, lower_autogroup_priority
from shale.metastore.api import auth
from shale.process import ManagedProcess, free_port


def test_children_get_tokens_of_their_own_role_and_the_metastore_accepts_them(tmp_path: Path) -> None:
    configured = tmp_path / "tokens.toml"
    operator = auth.new_token()
    auth.write_private(configured, auth.format_entry(auth.TokenEntry(
        name="grafana", role="reader", tenants=["*"], sha256=auth.digest(operator))))
    config = load_config(env={}, overrides=[f"metastore.data_dir={tmp_path / 'ms'}",
                                            f"metastore.tokens_file={configured}", "run.compaction_workers=2"])
    deployment = Deployment(config, ["--log-format", "json"], tmp_path / "logs",
                            {"SHALE_METASTORE__SECRET": "from-the-environment"})
    deployment.issue_tokens()
    table = auth.TokenTable(deployment.tokens_file, recheck_seconds=0)
    roles = {}
    for service in deployment.services[1:]:
        token_file = tmp_path / "ms" / "run" / f"{service.name}.token"
        assert token_file.stat().st_mode & 0o777 == 0o600
        token = token_file.read_text().strip()
        who = table.authenticate(token)
        assert who is not None
        roles[service.name] = (who.role, sorted(who.groups))
        assert f"metastore.token_file={token_file}" in service.args
        assert token not in " ".join(service.args)
    assert roles == {"ingest-backup": ("ingest", ["backup"]), "ingest-partition": ("ingest", ["partition"]),
                     "compact-0": ("compactor", []), "compact-1": ("compactor", [])}
    assert table.authenticate(operator) == auth.Principal("grafana", "reader", tenants=frozenset({"*"}))

    # A token issued while `shale run` runs reaches the metastore's file at the next supervision step.
    later = auth.new_token()
    auth.write_private(configured, configured.read_text() + auth.format_entry(auth.TokenEntry(
        name="later", role="admin", sha256=auth.digest(later))))
    deployment.sync_tokens()
    assert table.authenticate(later) is not None

    env = deployment._environment()
    assert env["SHALE_METASTORE__SECRET"] == "from-the-environment"
    os.environ["SHALE_METASTORE__TOKEN"] = operator
    try:
        assert "SHALE_METASTORE__TOKEN" not in deployment._environment()  # never widens a child's own token
    finally:
        del os.environ["SHALE_METASTORE__TOKEN"]


def test_token_create_appends_a_digest_and_prints_the_token_once(tmp_path: Path) -> None:
    path = tmp_path / "tokens.toml"
    runner = CliRunner()
    first = runner.invoke(cli, ["metastore", "token", "create", "--name", "grafana", "--role", "reader",
                                "--tenant", "acme", "--tokens-file", str(path)])
    assert first.exit_code == 0, first.output
    token = first.stdout.strip()
    assert token.startswith("shale_")
    assert token not in path.read_text()
    assert path.stat().st_mode & 0o777 == 0o600
    ingest = runner.invoke(cli, ["metastore", "token", "create", "--name", "ingest", "--role", "ingest",
                                 "--group", "backup", "--tokens-file", str(path)])
    assert ingest.exit_code == 0, ingest.output
    table = auth.TokenTable(path)
    assert table.authenticate(token) == auth.Principal("grafana", "reader", tenants=frozenset({"acme"}))
    assert table.authenticate(ingest.stdout.strip()) == auth.Principal("ingest", "ingest",
                                                                       groups=frozenset({"backup"}))
    again = runner.invoke(cli, ["metastore", "token", "create", "--name", "grafana", "--role", "admin",
                                "--tokens-file", str(path)])
    assert again.exit_code == 1
    assert "already has a token named 'grafana'" in again.output
    unscoped = runner.invoke(cli, ["metastore", "token", "create", "--name", "x", "--role", "reader",
                                   "--tokens-file", str(path)])
    assert unscoped.exit_code == 1
    assert "a reader token lists its tenants" in unscoped.output


def _deployment(tmp_path: Path, *overrides: str) -> Deployment:
    config = load_config(None, env={}, overrides=["run.metrics_base_port=9500", *overrides])
    return Deployment(config, [], tmp_path)


def test_the_whole_deployment_by_default(tmp_path: Path) -> None:
    names = [s.name for s in _deployment(tmp_path).services]
    assert names == ["metastore", "ingest-backup", "ingest-partition", "compact-0"]


def test_a_machine_runs_standbys_of_each_ingest_group(tmp_path: Path) -> None:
    deployment = _deployment(tmp_path, "run.ingest_processes=2", 'run.ingest_groups=["backup"]')
    ingest = [s for s in deployment.services if s.name.startswith("ingest-")]
    assert [s.name for s in ingest] == ["ingest-backup", "ingest-backup-1"]
    assert all(s.args[-2:] == ["--group", "backup"] for s in ingest)  # no --shard: each takes any free shard
    assert len({s.metrics for s in ingest}) == 2  # a metrics port each
    assert all(s.token is not None and s.token.groups == ["backup"] for s in ingest)  # a token each, of the group


def test_a_metastore_member_runs_the_metastore_only(tmp_path: Path) -> None:
    deployment = _deployment(tmp_path, 'run.services=["metastore"]')
    assert [s.name for s in deployment.services] == ["metastore"]


def test_a_worker_machine_uses_the_remote_metastore_nodes(tmp_path: Path) -> None:
    nodes = '["http://10.0.0.1:7070", "http://10.0.0.2:7070", "http://10.0.0.3:7070"]'
    deployment = _deployment(tmp_path, 'run.services=["ingest", "compaction"]', "metastore.mode=remote",
                             f"metastore.addresses={nodes}", "run.compaction_workers=2")
    assert [s.name for s in deployment.services] == ["ingest-backup", "ingest-partition", "compact-0", "compact-1"]
    for service in deployment.services:
        assert "metastore.mode=remote" not in service.args  # the configuration's own nodes, not a local one
        assert service.token is None  # and the configured token: the remote metastore knows no run/ tokens
        assert not any(arg.startswith("metastore.token_file=") for arg in service.args)
    assert deployment.status_page == "http://10.0.0.1:7070/ui"
    with pytest.raises(ConfigError, match=r"metastore\.mode must be 'remote'"):
        _deployment(tmp_path, 'run.services=["ingest"]')


def test_the_lease_pattern_reads_prometheus_clients_own_exposition() -> None:
    from prometheus_client import CollectorRegistry, Gauge, generate_latest

    registry = CollectorRegistry()
    held = Gauge("shale_ingest_lease_held", "help", ["group", "shard", "holder"], registry=registry)
    held.labels("partition", "0", "host-1").set(0)
    assert not lease_held(generate_latest(registry).decode())  # a standby, and the HELP/TYPE lines
    held.labels("partition", "0", "host-1").set(1)
    assert lease_held(generate_latest(registry).decode())


@given(st.text(max_size=20), st.sampled_from([0.0, 1.0]), st.floats(0, 10**6))
def test_the_lease_is_read_whatever_the_labels_and_other_metrics_say(holder: str, value: float,
                                                                     other: float) -> None:
    from prometheus_client import CollectorRegistry, Gauge, generate_latest

    registry = CollectorRegistry()
    Gauge("shale_ingest_lease_age_seconds", "help", ["group"], registry=registry).labels("partition").set(other)
    held = Gauge("shale_ingest_lease_held", "help", ["group", "shard", "holder"], registry=registry)
    held.labels("partition", "0", holder).set(value)  # a holder of quotes, braces, newlines, "} 1.0" ...
    assert lease_held(generate_latest(registry).decode()) == (value == 1.0)


def test_background_services_wait_for_the_partition_groups_lease(tmp_path: Path) -> None:
    """The partition group's process is a real HTTP server serving its metrics file; the wait ends when the file
    says the lease is held, when the process is gone, or when the deployment stops."""
    deployment = _deployment(tmp_path)
    [partition] = [s for s in deployment.services if s.name == "ingest-partition"]
    assert [s.name for s in deployment.services if s.background] == ["ingest-backup", "compact-0"]
    served = tmp_path / "served"
    served.mkdir()
    (served / "metrics").write_text('shale_ingest_lease_held{group="partition",holder="h",shard="0"} 0.0\n')
    port = free_port()
    partition.metrics = f"http://127.0.0.1:{port}/metrics"
    partition.process = ManagedProcess("fake-partition", [sys.executable, "-m", "http.server", str(port), "--bind",
                                                          "127.0.0.1", "--directory", str(served)],
                                       tmp_path / "fake.log")
    partition.process.start()
    try:
        stopper = threading.Timer(1.0, deployment.stop.set)  # a standby's metrics: it waits until stopped
        stopper.start()
        assert deployment.wait_for_foreground_lease(60) == "stopped"
        deployment.stop.clear()
        (served / "metrics").write_text('shale_ingest_lease_held{group="partition",holder="h",shard="0"} 1.0\n')
        assert deployment.wait_for_foreground_lease(60) == "lease"
        assert deployment.wait_for_foreground_lease(0) == "lease"
    finally:
        partition.process.stop()
    assert deployment.wait_for_foreground_lease(60) == "none"  # exited: the others start without it
    assert _deployment(tmp_path, 'run.ingest_groups=["backup"]').wait_for_foreground_lease(60) == "none"


def test_a_holder_with_a_brace_still_holds_the_lease() -> None:
    """Found by the property above: a line pattern stopping at the first "}" missed this lease."""
    assert lease_held('shale_ingest_lease_held{group="partition",holder="a}b",shard="0"} 1.0\n')


def test_a_background_service_s_whole_session_gets_the_lower_priority(tmp_path: Path) -> None:
    # A service is a session of its own (its own scheduler autogroup where the kernel has them): its nice value
    # must be the group's, or it weighs only against the service's own processes.
    child = ManagedProcess("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "s.log")
    child.start()
    try:
        autogroup = Path(f"/proc/{child.pid}/autogroup")
        if not Path("/proc/self/autogroup").exists():
            assert not lower_autogroup_priority(child.pid, BACKGROUND_NICE)  # no autogroups: nothing to set
            return
        assert autogroup.read_text().split()[-1] == "0"
        assert lower_autogroup_priority(child.pid, BACKGROUND_NICE)
        assert autogroup.read_text().split()[-1] == str(BACKGROUND_NICE)
        assert Path("/proc/self/autogroup").read_text() != autogroup.read_text()  # its own group, not ours
    finally:
        child.stop()
    assert not lower_autogroup_priority(child.pid, BACKGROUND_NICE)  # gone: refused, not raised
