"""A task's requests, counted in the process it ran in and returned with its result (``counting_requests``), are
added to the driver's metric once: by the driver when the task ran elsewhere, never again when it ran in the
driver's own process."""

from __future__ import annotations

import multiprocessing
import uuid

import pytest
from prometheus_client import REGISTRY

from shale.errors import NotFoundError
from shale.objstore import (
    RequestReport,
    add_task_requests,
    counting_requests,
    open_bucket_url,
    results_counted,
    scratch_bucket,
    with_requests,
)
from shale.objstore.counting import BY_PROCESS, BY_TASKS


def _metric(operation: str, outcome: str, by: str) -> float:
    value = REGISTRY.get_sample_value("shale_objstore_requests_total",
                                      {"operation": operation, "outcome": outcome, "by": by})
    return value or 0.0


def test_a_report_counts_every_request_the_block_made_by_bucket_operation_and_outcome() -> None:
    url = f"memory://counting-{uuid.uuid4().hex}"
    bucket, other = open_bucket_url(url), open_bucket_url(url + "-other")
    bucket.put("before", b"x")  # outside the block: not the task's
    with counting_requests() as out:
        for i in range(3):
            bucket.put(f"k{i}", b"x")
        bucket.get("k0")
        list(other.list(""))
        with pytest.raises(NotFoundError):
            bucket.head("missing")  # a not-found HEAD is a request too
        scratch_bucket().put("free", b"x")  # memory of its own: costs nothing, counted nowhere
    [report] = out
    assert report.total("put", bucket=url) == 3
    assert report.total("get", bucket=url) == 1
    assert report.total("list", bucket=url + "-other") == 1
    assert [(c.operation, c.outcome) for c in report.counts if c.operation == "head"] == [("head", "not_found")]
    assert report.total() == 6


def test_the_driver_adds_a_report_of_another_process_under_by_tasks_and_never_its_own() -> None:
    url = f"memory://counting-{uuid.uuid4().hex}"
    with counting_requests() as out:
        open_bucket_url(url).put("k", b"x")
    [own] = out
    before = (_metric("put", "ok", BY_TASKS), _metric("put", "ok", BY_PROCESS))
    assert add_task_requests(own) is False  # counted here already (by="process")
    assert (_metric("put", "ok", BY_TASKS), _metric("put", "ok", BY_PROCESS)) == before
    foreign = RequestReport.model_validate_json(own.model_copy(update={"process": "elsewhere"}).model_dump_json())
    assert add_task_requests(foreign) is True
    assert _metric("put", "ok", BY_TASKS) == before[0] + 1


def _child_report(url: str, queue: multiprocessing.Queue[str]) -> None:
    with counting_requests() as out:
        open_bucket_url(url).put("k", b"x")
    queue.put(out[0].model_dump_json())


def test_a_forked_process_reports_under_a_token_of_its_own() -> None:
    # Spark's daemon forks the Python workers: a worker must not carry its parent's token.
    url = f"memory://counting-{uuid.uuid4().hex}"
    context = multiprocessing.get_context("fork")
    queue: multiprocessing.Queue[str] = context.Queue()
    child = context.Process(target=_child_report, args=(url, queue))
    child.start()
    report = RequestReport.model_validate_json(queue.get(timeout=60))
    child.join(60)
    assert report.total("put") == 1
    with counting_requests() as out:
        pass
    assert out[0].process != report.process
    assert add_task_requests(report) is True


def test_reports_add_up() -> None:
    with counting_requests() as a:
        open_bucket_url(f"memory://counting-{uuid.uuid4().hex}").put("k", b"x")
    total = a[0] + a[0]
    assert total.total("put") == 2
    assert total.process == a[0].process


def test_with_requests_returns_a_tasks_report_and_results_counted_adds_it() -> None:
    url = f"memory://counting-{uuid.uuid4().hex}"

    def task(n: int) -> int:
        for i in range(n):
            open_bucket_url(url).put(f"k{i}", b"x")
        return n

    rows = [with_requests(task)(2), with_requests(task)(3)]
    assert [RequestReport.model_validate_json(r).total("put") for _, r in rows] == [2, 3]
    foreign = [(n, RequestReport.model_validate_json(r).model_copy(update={"process": "worker"}).model_dump_json())
               for n, r in rows]
    before = _metric("put", "ok", BY_TASKS)
    assert results_counted(foreign) == [2, 3]
    assert _metric("put", "ok", BY_TASKS) == before + 5
