"""The bucket acceptance suite (tests/bucket_acceptance.py) on a real MinIO server."""

from __future__ import annotations

import pytest
from tests.bucket_acceptance import *  # noqa: F403 (the suite's tests, collected here)

from shale.config import BucketConfig
from shale.objstore import ObstoreBucket, open_bucket


@pytest.fixture
def bucket(minio_bucket: BucketConfig) -> ObstoreBucket:
    return open_bucket(minio_bucket)
