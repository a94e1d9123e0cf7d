"""Object storage: one small bucket interface over obstore (see protocols.py for the contract)."""

from shale.objstore.counting import CallCounter
from shale.objstore.obstore_bucket import ObstoreBucket
from shale.objstore.open import local_path, open_bucket, open_bucket_url, scratch_bucket, task_bucket
from shale.objstore.protocols import (
    Bucket,
    BucketReader,
    ObjectDeleter,
    ObjectLister,
    ObjectReader,
    ObjectWriter,
)
from shale.objstore.types import ObjectInfo, PutResult, check_key

__all__ = [
    "Bucket",
    "BucketReader",
    "CallCounter",
    "ObjectDeleter",
    "ObjectInfo",
    "ObjectLister",
    "ObjectReader",
    "ObjectWriter",
    "ObstoreBucket",
    "PutResult",
    "check_key",
    "local_path",
    "open_bucket",
    "open_bucket_url",
    "scratch_bucket",
    "task_bucket",
]
