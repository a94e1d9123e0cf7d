"""A writer process killed with SIGKILL between its data upload and its meta.json, on MinIO.

The block must be Fresh and then Partial, never readable, and removed only after the sync and delete delays.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.waiting import eventually

from shale.block import BlockFetcher, BlockState, Cleaner
from shale.config import BucketConfig
from shale.failpoints import paused
from shale.objstore import open_bucket

WRITER = """
import os, sys
from pydantic import SecretStr
from shale.config import BucketConfig
from shale.objstore import open_bucket
from tests.factories import write_backup_block
# The JSON masks the secret key; it comes through the environment, never the command line.
config = BucketConfig.model_validate_json(sys.argv[1]).model_copy(
    update={"secret_access_key": SecretStr(os.environ["SHALE_BUCKET__SECRET_ACCESS_KEY"])})
write_backup_block(open_bucket(config), "acme", "app", 0, 0, 5000, block_time_ms=int(__import__("time").time() * 1000))
print("unreachable: the failpoint pauses before meta.json")
"""


def test_writer_killed_before_meta_json_leaves_a_partial_block_that_is_never_read(
        minio_bucket: BucketConfig, tmp_path: Path) -> None:
    env = dict(os.environ, SHALE_FAILPOINTS="block.before-meta", SHALE_FAILPOINT_DIR=str(tmp_path),
               SHALE_BUCKET__SECRET_ACCESS_KEY=minio_bucket.secret_access_key.get_secret_value())
    proc = subprocess.Popen([sys.executable, "-c", WRITER, minio_bucket.model_dump_json()], env=env,
                            cwd=Path(__file__).resolve().parents[2])

    def reached() -> bool:
        if paused(tmp_path, "block.before-meta"):
            return True
        assert proc.poll() is None, "writer exited before reaching the failpoint"
        return False

    eventually(reached, 60, "the writer to reach the failpoint")
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL

    bucket = open_bucket(minio_bucket)
    objects = [i.key for i in bucket.list("group=backup/tenant=acme/")]
    assert len(objects) == 1
    assert objects[0].endswith("/records-0.parquet")  # data landed, meta.json did not
    now = time.time()
    sync_delay, delete_delay = 30.0, 60.0
    at = [now]
    fetcher = BlockFetcher(bucket, sync_delay, clock=lambda: at[0])
    cleaner = Cleaner(bucket, fetcher, delete_delay, clock=lambda: at[0])

    (view,) = fetcher.sync("acme").blocks.values()
    assert view.state is BlockState.FRESH
    assert not view.readable
    assert cleaner.run("acme").actions == []

    at[0] = now + sync_delay + 1
    (view,) = fetcher.sync("acme").blocks.values()
    assert view.state is BlockState.PARTIAL
    assert not view.readable
    report = cleaner.run("acme")
    assert [a.kind for a in report.actions] == ["mark"]
    assert objects == [i.key for i in bucket.list("group=backup/tenant=acme/")]

    at[0] = now + sync_delay + delete_delay  # the mark is a moment younger than the delete delay
    assert cleaner.run("acme").actions == []
    assert objects == [i.key for i in bucket.list("group=backup/tenant=acme/")]

    at[0] = now + sync_delay + delete_delay + 2
    assert [a.kind for a in cleaner.run("acme").actions] == ["delete"]
    assert list(bucket.list("group=backup/tenant=acme/")) == []
