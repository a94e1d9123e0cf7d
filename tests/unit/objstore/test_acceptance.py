"""The bucket acceptance suite (tests/bucket_acceptance.py) on the memory and local filesystem buckets."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from tests.bucket_acceptance import *  # noqa: F403 (the suite's tests, collected here)

from shale.objstore import ObstoreBucket, open_bucket_url


@pytest.fixture(params=["memory", "file"])
def bucket(request: pytest.FixtureRequest, tmp_path: Path) -> ObstoreBucket:
    if request.param == "memory":
        return open_bucket_url(f"memory://acceptance-{uuid.uuid4().hex}")
    return open_bucket_url(f"file://{tmp_path}/bucket")
