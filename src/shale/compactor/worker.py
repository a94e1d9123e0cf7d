"""``shale compact``: the compaction worker, a Spark application (seed 003's worker, with Spark doing the work).

Loop: report on the jobs it runs (lease refreshes; successes with their output block), ask for as many new
jobs as it has free slots, and run each new job's merge as a Spark task. A job whose report the service refuses
(the lease expired and the job went to another worker, or its sources left the index) is cancelled, and any
output it wrote is marked for deletion, unless the metastore indexes it (checked first: a committed output is
never marked). A job whose task fails is abandoned: its lease expires and the scheduler reassigns it, counting a
failure (seed 003 has workers report no failures).

Metastore outages: a poll that gets no answer (``RetryableError`` after the client's deadline) may or may not
have been applied, so the worker keeps it and sends it again, unchanged and with the same request id, until it is
answered (the service answers a poll it applied with the answer it gave then). Meanwhile merges keep running and
finished results are kept; polls back off exponentially with jitter. The first answer after the outage
refreshes the leases the worker still holds and completes the jobs it reported.
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import Counter, Gauge

from shale.block import BlockMeta, write_deletion_mark
from shale.bucketindex import DeltaWriter
from shale.compaction.messages import MAX_POLL_CAPACITY, Assigned, JobUpdate, PollRequest, PollResponse
from shale.config import BucketConfig
from shale.errors import RetryableError
from shale.failpoints import failpoint
from shale.objstore import open_bucket, task_bucket

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)
BYTES = Counter("shale_compaction_bytes_total", "Bytes read and written by compaction merges.", ["direction"])
RUNNING = Gauge("shale_compaction_worker_running_jobs", "Jobs this worker is running.")
PEAK_RSS = Gauge("shale_compaction_merge_peak_rss_bytes", "Peak resident memory of the task process during the last "
                 "merge.")
PEAK_ARROW = Gauge("shale_compaction_merge_peak_arrow_bytes", "Peak Arrow memory of the last merge (its data).")
FAILED = Counter("shale_compaction_task_failures_total", "Merge tasks that failed (their jobs are abandoned).")
UNANSWERED = Counter("shale_compaction_polls_unanswered_total", "Polls the metastore did not answer (sent again).")
MAX_BACKOFF = 10.0


class CompactionService(Protocol):
    """What the worker needs from the metastore (the HTTP client and the embedded service both fit)."""

    def poll_compaction(self, request: PollRequest) -> PollResponse: ...

    def get_block(self, block_id: str) -> BlockMeta | None: ...


class MergeRunner(Protocol):
    """Where merges run: Spark tasks in production (``SparkMergeRunner``)."""

    def start(self, job: Assigned) -> Future[dict[str, Any]]:
        """Start the job's merge; the future holds ``run_merge_task``'s result, parsed."""
        ...

    def cancel(self, job: str) -> None: ...

    def close(self) -> None: ...


def run_merge_task(payload: str, bucket_config: BucketConfig) -> str:
    """The Spark task: one job's merge. Input and output are JSON so nothing but plain data crosses to tasks."""
    from shale.compactor.merge import merge_blocks

    job = Assigned.model_validate_json(payload)
    result = merge_blocks(task_bucket(bucket_config), job.sources, job=job.job, token=job.token, level=job.level)
    return json.dumps({**vars(result), "output": result.output.model_dump(mode="json")})


class SparkMergeRunner:
    """Each merge is a one-task Spark job in its own job group, so a refused job can be cancelled."""

    def __init__(self, spark: SparkSession, bucket: BucketConfig, slots: int) -> None:
        self.spark = spark
        self.bucket = bucket
        self.pool = ThreadPoolExecutor(max_workers=slots, thread_name_prefix="compaction")
        self.groups: dict[str, str] = {}

    def start(self, job: Assigned) -> Future[dict[str, Any]]:
        group = self.groups[job.job] = f"shale-compaction-{uuid.uuid4().hex[:8]}"
        payload = job.model_dump_json()
        bucket = self.bucket

        def run() -> dict[str, Any]:
            sc = self.spark.sparkContext
            sc.setJobGroup(group, f"compaction {job.job}", interruptOnCancel=True)
            [result] = sc.parallelize([payload], 1).map(lambda p: run_merge_task(p, bucket)).collect()
            parsed: dict[str, Any] = json.loads(result)
            return parsed

        return self.pool.submit(run)

    def cancel(self, job: str) -> None:
        group = self.groups.pop(job, None)
        if group is not None:
            self.spark.sparkContext.cancelJobGroup(group)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


@dataclass
class RunningJob:
    job: Assigned
    future: Future[dict[str, Any]]
    started: float = field(default_factory=time.monotonic)

    def result(self) -> dict[str, Any] | None:
        """The merge's result once it finished well, else None."""
        if not self.future.done() or self.future.exception() is not None:
            return None
        return self.future.result()


class CompactionWorker:
    def __init__(self, service: CompactionService, bucket: BucketConfig, spark: SparkSession | None, *,
                 slots: int = 0, poll_interval: float = 2.0, worker_id: str = "", save_reports: Path | None = None,
                 deltas: bool = False, runner: MergeRunner | None = None) -> None:
        self.service = service
        self.bucket_config = bucket
        self.bucket = open_bucket(bucket)
        self.slots = slots or (max(1, spark.sparkContext.defaultParallelism) if spark is not None else 1)
        if runner is None:
            if spark is None:
                raise ValueError("a compaction worker needs a Spark session or a merge runner")
            runner = SparkMergeRunner(spark, bucket, self.slots)
        self.runner = runner
        self.poll_interval = poll_interval
        self.worker_id = worker_id or f"{os.uname().nodename}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.save_reports = save_reports
        self.running: dict[str, RunningJob] = {}
        self.deltas = DeltaWriter(self.bucket) if deltas else None
        self.completed: list[dict[str, Any]] = []
        self.unanswered: PollRequest | None = None
        """A poll that got no answer: sent again, unchanged, before anything else."""
        self.unanswered_polls = 0

    def _request(self) -> PollRequest:
        if self.unanswered is not None:
            return self.unanswered
        updates: list[JobUpdate] = []
        for name, running in list(self.running.items()):
            if not running.future.done():
                updates.append(JobUpdate(job=name, token=running.job.token, status="in_progress"))
                continue
            error = running.future.exception()
            if error is not None:
                FAILED.inc()
                log.error("compaction task failed; abandoning the job (its lease will expire)",
                          extra={"job": name, "token": running.job.token, "error": str(error)[:500]})
                del self.running[name]
                continue
            updates.append(JobUpdate(job=name, token=running.job.token, status="success",
                                     outputs=[BlockMeta.model_validate(running.future.result()["output"])]))
        busy = sum(1 for r in self.running.values() if not r.future.done())
        free = min(MAX_POLL_CAPACITY, max(0, self.slots - busy))
        request = PollRequest(worker=self.worker_id, request=uuid.uuid4().hex, capacity=free, updates=updates)
        if any(u.status == "success" for u in updates):
            if self.save_reports is not None:
                self.save_reports.mkdir(parents=True, exist_ok=True)
                (self.save_reports / f"{request.request}.json").write_text(request.model_dump_json())
            failpoint("compaction.before-report")
        return request

    def step(self) -> PollResponse | None:
        """One poll: report, receive, start. Returns the service's answer, or None if the metastore could not
        be reached (the same poll is sent again at the next step)."""
        request = self._request()
        try:
            response = self.service.poll_compaction(request)
        except RetryableError as exc:
            self.unanswered = request
            self.unanswered_polls += 1
            UNANSWERED.inc()
            log.warning("the metastore did not answer a compaction poll; merges go on and the poll is sent again",
                        extra={"error": str(exc)[:500], "running": len(self.running)})
            return None
        self.unanswered = None
        for name, outcome in response.updates.items():
            running = self.running.get(name)
            if running is None or outcome == "refreshed":
                continue
            del self.running[name]
            result = running.result()
            if outcome == "completed" and result is not None:
                self._completed(running, result)
            else:
                self._refused(running, result, outcome)
        for job in response.assigned:
            log.info("compaction job started", extra={"job": job.job, "token": job.token, "tenant": job.tenant,
                                                       "level": job.level, "sources": len(job.sources)})
            self.running[job.job] = RunningJob(job, self.runner.start(job))
        RUNNING.set(len(self.running))
        return response

    def _completed(self, running: RunningJob, result: dict[str, Any]) -> None:
        if self.deltas is not None:
            now = time.time()
            self.deltas.write(running.job.tenant, added=[BlockMeta.model_validate(result["output"])],
                              marks=[(s.id, now, "compacted") for s in running.job.sources])
        BYTES.labels("in").inc(result["bytes_in"])
        BYTES.labels("out").inc(result["bytes_out"])
        PEAK_RSS.set(result["peak_rss"])
        PEAK_ARROW.set(result["peak_arrow_bytes"])
        self.completed.append(result)
        log.info("compaction job completed", extra={"job": running.job.job, "token": running.job.token,
                                                    "block": result["output"]["id"], "rows": result["rows_out"]})

    def _refused(self, running: RunningJob, result: dict[str, Any] | None, outcome: str) -> None:
        """Stop a job the service refused, and mark its output for deletion unless the metastore indexes it (a
        report answered wrongly must never delete committed data). Unreachable metastore: no mark; the leader's
        bucket scan collects the output once no job can claim it."""
        self.runner.cancel(running.job.job)
        extra = {"job": running.job.job, "token": running.job.token, "outcome": outcome}
        if result is not None:
            output = result["output"]
            try:
                mark = self.service.get_block(output["id"]) is None
            except RetryableError:
                mark = False
            if mark:
                write_deletion_mark(self.bucket, output["tenant"], output["id"], time.time(),
                                    f"compaction report refused: {outcome}")
            extra["output"] = output["id"]
            extra["marked"] = mark
        log.warning("compaction job stopped: the service refused its report", extra=extra)

    def run(self, stop: threading.Event | None = None, until_idle: bool = False) -> None:
        """Poll until ``stop`` is set; with ``until_idle``, return once no job runs and none is handed out."""
        stop = stop or threading.Event()
        idle = unanswered = 0
        try:
            while not stop.is_set():
                response = self.step()
                if response is None:
                    unanswered += 1
                    stop.wait(min(MAX_BACKOFF, self.poll_interval * 2 ** unanswered) * random.uniform(0.5, 1.0))
                    continue
                unanswered = 0
                idle = idle + 1 if not response.assigned and not self.running else 0
                if until_idle and idle >= 2:
                    break
                stop.wait(self.poll_interval)
        finally:
            self.runner.close()
