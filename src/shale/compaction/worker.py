"""``shale compact``: the compaction worker, a Spark application (seed 003's worker, with Spark doing the work).

Loop: report on the jobs it runs (lease refreshes; successes with their output block), ask for as many new
jobs as it has free slots, and run each new job's merge as a Spark task. A job whose report the service refuses
(the lease expired and the job went to another worker, or its sources left the index) is cancelled, and any
output it wrote is marked for deletion: it will never be committed. A job whose task fails is abandoned: its
lease expires and the scheduler reassigns it, counting a failure (seed 003 has workers report no failures).
"""

from __future__ import annotations

import json
import logging
import os
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
from shale.compaction.protocol import MAX_POLL_CAPACITY, Assigned, JobUpdate, PollRequest, PollResponse
from shale.config import BucketConfig
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


class CompactionService(Protocol):
    """What the worker needs from the metastore (the HTTP client and the embedded service both fit)."""

    def poll_compaction(self, request: PollRequest) -> PollResponse: ...


def run_merge_task(payload: str, bucket_config: BucketConfig) -> str:
    """The Spark task: one job's merge. Input and output are JSON so nothing but plain data crosses to tasks."""
    from shale.compaction.merge import merge_blocks

    job = Assigned.model_validate_json(payload)
    result = merge_blocks(task_bucket(bucket_config), job.sources, job=job.job, token=job.token, level=job.level)
    return json.dumps({**vars(result), "output": result.output.model_dump(mode="json")})


@dataclass
class RunningJob:
    job: Assigned
    future: Future[dict[str, Any]]
    group: str
    started: float = field(default_factory=time.monotonic)


class CompactionWorker:
    def __init__(self, service: CompactionService, bucket: BucketConfig, spark: SparkSession, *, slots: int = 0,
                 poll_interval: float = 2.0, worker_id: str = "", save_reports: Path | None = None,
                 deltas: bool = False) -> None:
        self.service = service
        self.bucket_config = bucket
        self.bucket = open_bucket(bucket)
        self.spark = spark
        self.slots = slots or max(1, spark.sparkContext.defaultParallelism)
        self.poll_interval = poll_interval
        self.worker_id = worker_id or f"{os.uname().nodename}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.save_reports = save_reports
        self.running: dict[str, RunningJob] = {}
        self.deltas = DeltaWriter(self.bucket) if deltas else None
        self.pool = ThreadPoolExecutor(max_workers=self.slots, thread_name_prefix="compaction")
        self.completed: list[dict[str, Any]] = []

    def _submit(self, job: Assigned) -> RunningJob:
        group = f"shale-compaction-{uuid.uuid4().hex[:8]}"
        payload = job.model_dump_json()
        bucket = self.bucket_config

        def run() -> dict[str, Any]:
            sc = self.spark.sparkContext
            sc.setJobGroup(group, f"compaction {job.job}", interruptOnCancel=True)
            [result] = sc.parallelize([payload], 1).map(lambda p: run_merge_task(p, bucket)).collect()
            parsed: dict[str, Any] = json.loads(result)
            return parsed

        log.info("compaction job started", extra={"job": job.job, "token": job.token, "tenant": job.tenant,
                                                   "level": job.level, "sources": len(job.sources)})
        return RunningJob(job, self.pool.submit(run), group)

    def _updates(self) -> tuple[list[JobUpdate], dict[str, dict[str, Any]]]:
        updates: list[JobUpdate] = []
        finished: dict[str, dict[str, Any]] = {}
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
            result = running.future.result()
            finished[name] = result
            updates.append(JobUpdate(job=name, token=running.job.token, status="success",
                                     outputs=[BlockMeta.model_validate(result["output"])]))
        return updates, finished

    def step(self) -> PollResponse:
        """One poll: report, receive, start. Returns the service's answer."""
        updates, finished = self._updates()
        busy = sum(1 for r in self.running.values() if not r.future.done())
        free = min(MAX_POLL_CAPACITY, max(0, self.slots - busy))
        request = PollRequest(worker=self.worker_id, capacity=free, updates=updates)
        if finished:
            if self.save_reports is not None:
                self.save_reports.mkdir(parents=True, exist_ok=True)
                (self.save_reports / f"{uuid.uuid4().hex}.json").write_text(request.model_dump_json())
            failpoint("compaction.before-report")
        response = self.service.poll_compaction(request)
        for name, outcome in response.updates.items():
            running = self.running.get(name)
            if running is None:
                continue
            if outcome in ("refreshed",):
                continue
            del self.running[name]
            if outcome == "completed":
                result = finished[name]
                if self.deltas is not None:
                    now = time.time()
                    self.deltas.write(running.job.tenant, added=[BlockMeta.model_validate(result["output"])],
                                      marks=[(s.id, now, "compacted") for s in running.job.sources])
                BYTES.labels("in").inc(result["bytes_in"])
                BYTES.labels("out").inc(result["bytes_out"])
                PEAK_RSS.set(result["peak_rss"])
                PEAK_ARROW.set(result["peak_arrow_bytes"])
                self.completed.append(result)
                log.info("compaction job completed", extra={"job": name, "token": running.job.token,
                                                            "block": result["output"]["id"],
                                                            "rows": result["rows_out"]})
                continue
            self.spark.sparkContext.cancelJobGroup(running.group)
            if name in finished:  # an output that will never be committed: mark it for deletion
                output = finished[name]["output"]
                write_deletion_mark(self.bucket, output["tenant"], output["id"], time.time(),
                                    f"compaction report refused: {outcome}")
            log.warning("compaction job stopped: the service refused its report",
                        extra={"job": name, "token": running.job.token, "outcome": outcome})
        for job in response.assigned:
            self.running[job.job] = self._submit(job)
        RUNNING.set(len(self.running))
        return response

    def run(self, stop: threading.Event | None = None, until_idle: bool = False) -> None:
        """Poll until ``stop`` is set; with ``until_idle``, return once no job runs and none is handed out."""
        stop = stop or threading.Event()
        idle = 0
        while not stop.is_set():
            response = self.step()
            idle = idle + 1 if not response.assigned and not self.running else 0
            if until_idle and idle >= 2:
                break
            stop.wait(self.poll_interval)
        self.pool.shutdown(wait=False, cancel_futures=True)
