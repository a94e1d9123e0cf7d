"""``shale run`` on one machine of a multi-machine deployment: ``run.services`` selects the processes; without
the metastore, the others use the configured remote nodes (an embedded metastore there is refused)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shale.config import load_config
from shale.errors import ConfigError
from shale.launcher import Deployment


def _deployment(tmp_path: Path, *overrides: str) -> Deployment:
    config = load_config(None, env={}, overrides=["run.metrics_base_port=9500", *overrides])
    return Deployment(config, [], tmp_path)


def test_the_whole_deployment_by_default(tmp_path: Path) -> None:
    names = [s.name for s in _deployment(tmp_path).services]
    assert names == ["metastore", "ingest-backup", "ingest-partition", "compact-0"]


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
    assert deployment.status_page == "http://10.0.0.1:7070/ui"
    with pytest.raises(ConfigError, match=r"metastore\.mode must be 'remote'"):
        _deployment(tmp_path, 'run.services=["ingest"]')
