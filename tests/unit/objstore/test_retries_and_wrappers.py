"""Retries (transient only, jittered), the conditional-put recovery, and the test wrappers."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from shale.config import BucketConfig
from shale.errors import ArchivedObjectError, ConflictError, NotFoundError, StoreUnavailableError
from shale.objstore import ObstoreBucket, open_bucket_url, task_bucket
from shale.objstore.obstore_bucket import RetryPolicy
from shale.objstore.testing import DelayedVisibilityBucket, Fault, FaultyBucket


def _bucket() -> ObstoreBucket:
    b = open_bucket_url(f"memory://retries-{uuid.uuid4().hex}")
    sleeps: list[float] = []
    b.retry = RetryPolicy(sleep=sleeps.append)  # no real waiting in unit tests
    b.sleeps = sleeps  # type: ignore[attr-defined]
    return b


def test_transient_errors_are_retried_with_bounded_jittered_backoff() -> None:
    b = _bucket()
    attempts: list[int] = []

    def flaky() -> str:
        attempts.append(1)
        if len(attempts) < 3:
            raise OSError("Server returned non-2xx status code: 503 Service Unavailable")
        return "ok"

    assert b._call("get", "k", flaky) == "ok"
    assert len(attempts) == 3
    assert len(b.sleeps) == 2  # type: ignore[attr-defined]
    assert all(0 <= s <= 5.0 for s in b.sleeps)  # type: ignore[attr-defined]
    assert b.calls.snapshot()["get"] == 3


def test_the_time_requests_take_is_counted_failures_included() -> None:
    b = _bucket()

    def slow() -> None:
        time.sleep(0.02)
        raise FileNotFoundError("k")

    with pytest.raises(NotFoundError):
        b._call("head", "k", slow)
    b._call("get", "k", lambda: time.sleep(0.02))
    assert b.calls.seconds >= 0.04
    b.calls.reset()
    assert b.calls.seconds == 0


def test_an_archived_object_is_a_clear_error_never_a_missing_object_nor_retried() -> None:
    """S3 answers a GET of an object in Glacier Flexible Retrieval or Deep Archive with 403 InvalidObjectState
    (the text obstore passes on): Shale says to restore it in the store, and never takes it for a missing object
    (which a bucket scan would judge a partial block, and the cleaner delete)."""
    b = _bucket()

    def archived() -> None:
        raise OSError("Error performing GET https://s3.amazonaws.com/b/group%3Dbackup/tenant%3Dacme/X/meta.json: "
                      "Server returned non-2xx status code: 403 Forbidden: <Error><Code>InvalidObjectState</Code>"
                      "<Message>The operation is not valid for the object's storage class</Message></Error>")

    with pytest.raises(ArchivedObjectError, match=r"group=backup/tenant=acme/X/meta.json is in an archive storage "
                                                  r"class .* restore-object"):
        b._call("get", "group=backup/tenant=acme/X/meta.json", archived)
    assert b.sleeps == []  # type: ignore[attr-defined]
    assert b.calls.snapshot()["get"] == 1


def test_exhausted_retries_raise_store_unavailable_naming_the_call() -> None:
    b = _bucket()

    def down() -> None:
        raise OSError("error sending request: connection refused")

    with pytest.raises(StoreUnavailableError, match="get 'tenant/x' failed 5 times"):
        b._call("get", "tenant/x", down)


def test_permanent_errors_are_not_retried() -> None:
    b = _bucket()
    attempts: list[int] = []

    def forbidden() -> None:
        attempts.append(1)
        raise PermissionError("Server returned non-2xx status code: 403 Forbidden")

    with pytest.raises(PermissionError):
        b._call("get", "k", forbidden)
    assert len(attempts) == 1


def test_conditional_put_whose_first_attempt_landed_succeeds_on_retry() -> None:
    b = _bucket()
    state = {"n": 0}

    def landed_then_timed_out():  # type: ignore[no-untyped-def]
        state["n"] += 1
        if state["n"] == 1:
            b.put("k", b"mine")  # the write lands ...
            raise OSError("operation timed out")  # ... but the answer is lost
        raise ConflictError("exists")

    result = b._conditional("put", "k", b"mine", landed_then_timed_out)
    assert result.etag is not None
    with pytest.raises(ConflictError):  # someone else's content is still a conflict
        b._conditional("put", "k", b"other", landed_then_timed_out)


def test_delayed_visibility_hides_new_objects_until_the_delay_passes() -> None:
    now = [100.0]
    inner = _bucket()
    inner.put("old", b"o")
    b = DelayedVisibilityBucket(inner, delay=10, clock=lambda: now[0])
    b.put("t/new", b"n")
    assert [i.key for i in b.list("")] == ["old"]
    with pytest.raises(NotFoundError):
        b.get("t/new")
    now[0] += 10
    assert b.get("t/new") == b"n"
    assert [i.key for i in b.list("")] == ["old", "t/new"]


def test_faulty_bucket_fails_chosen_calls_and_can_lose_answers() -> None:
    inner = _bucket()
    b = FaultyBucket(inner, [Fault("put", key=r"meta\.json$", times=1, after=True), Fault("get", times=2)])
    b.put("t/data.parquet", b"d")
    with pytest.raises(StoreUnavailableError, match="injected"):
        b.put("t/meta.json", b"m")
    assert inner.get("t/meta.json") == b"m"  # the write landed; only the answer was lost
    for _ in range(2):
        with pytest.raises(StoreUnavailableError):
            b.get("t/data.parquet")
    assert b.get("t/data.parquet") == b"d"
    assert b.injected == [("put", "t/meta.json"), ("get", "t/data.parquet"), ("get", "t/data.parquet")]


def test_spark_tasks_share_one_client_per_bucket_configuration(tmp_path: Path) -> None:
    first = BucketConfig(url=f"file://{tmp_path}/a")
    assert task_bucket(first) is task_bucket(BucketConfig(url=f"file://{tmp_path}/a"))
    other = task_bucket(BucketConfig(url=f"file://{tmp_path}/b"))
    assert other is not task_bucket(first)
    task_bucket(first).put("k", b"v")
    assert list(other.list("")) == []
    assert [i.key for i in task_bucket(first).list("")] == ["k"]
