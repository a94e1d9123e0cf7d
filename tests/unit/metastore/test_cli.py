"""`shale metastore` commands on an embedded metastore and a local bucket."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner
from tests.factories import write_backup_block

from shale.cli import cli
from shale.config import load_config
from shale.metastore import CommitIngestBatch, OffsetRange, open_metastore
from shale.objstore import open_bucket_url


def test_status_rebuild_snapshot_restore(tmp_path: Path) -> None:
    sets = ["--set", f"bucket.url=file://{tmp_path}/bucket", "--set", f"metastore.data_dir={tmp_path}/ms"]
    config = load_config(env={}, overrides=[s for s in sets if s != "--set"])
    bucket = open_bucket_url(f"file://{tmp_path}/bucket")
    store = open_metastore(config)
    block = write_backup_block(bucket, "acme", "app", 0, 0, 10)
    assert store.submit(CommitIngestBatch(group="backup", ranges=[OffsetRange(topic="app", partition=0, start=0,
                                                                              end=10)], blocks=[block])).ok
    runner = CliRunner()
    status = runner.invoke(cli, [*sets, "metastore", "status"])
    assert status.exit_code == 0, status.output
    assert json.loads(status.output)["blocks"] == 1

    out = tmp_path / "rebuilt.db"
    rebuilt = runner.invoke(cli, [*sets, "metastore", "rebuild", "--from-bucket", "--out", str(out)])
    assert rebuilt.exit_code == 0, rebuilt.output
    assert "1 tenants, 1 blocks, 0 tombstones, 1 committed offsets" in rebuilt.output

    snap = tmp_path / "snap.db"
    assert runner.invoke(cli, [*sets, "metastore", "snapshot", "--out", str(snap)]).exit_code == 0
    other = ["--set", f"bucket.url=file://{tmp_path}/bucket", "--set", f"metastore.data_dir={tmp_path}/ms2"]
    restored = runner.invoke(cli, [*other, "metastore", "restore", "--from", str(out)])
    assert restored.exit_code == 0, restored.output
    status2 = runner.invoke(cli, [*other, "metastore", "status"])
    assert json.loads(status2.output)["blocks"] == 1

    again = runner.invoke(cli, [*sets, "metastore", "rebuild", "--from-bucket", "--out", str(out)])
    assert again.exit_code == 1
    assert "exists; rebuild into a new file" in again.output
