"""Object storage: one small bucket interface over obstore (see protocols.py for the contract)."""

import typing as _typing

from shale.exports import lazy_exports as _lazy_exports
from shale.objstore.counting import (
    CallCounter,
    RequestReport,
    add_task_requests,
    counting_requests,
    results_counted,
    with_requests,
)
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

if _typing.TYPE_CHECKING:
    from shale.objstore.naming import OrderedNames

__getattr__ = _lazy_exports(__name__, {  # each public name's module, imported on first use
    "OrderedNames": "naming",
})

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
    "OrderedNames",
    "PutResult",
    "RequestReport",
    "add_task_requests",
    "check_key",
    "counting_requests",
    "local_path",
    "open_bucket",
    "open_bucket_url",
    "results_counted",
    "scratch_bucket",
    "task_bucket",
    "with_requests",
]
