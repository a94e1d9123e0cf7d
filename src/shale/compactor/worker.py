"""``shale compact``: the compaction worker, a Spark application (seed 003's worker, with Spark doing the work).

Loop: report on the jobs it runs (lease refreshes; successes with their output block), ask for as many new
jobs as it has free slots, and run the jobs of one answer as the tasks of one Spark job (a Spark job's fixed cost
is paid once per poll, not once per compaction job). A job whose report the service refuses
(the lease expired and the job went to another worker, or its sources left the index) is cancelled, and any
output it wrote is marked for deletion, unless the metastore indexes it (checked first: a committed output is
never marked). A job whose merge fails is abandoned: its lease expires and the scheduler reassigns it, counting a
failure (seed 003 has workers report no failures). A merge's error is caught in its task and returned as that
job's result, so one bad job never fails the other jobs of its Spark job.

Metastore outages: a poll that gets no answer (``RetryableError`` after the client's deadline) may or may not
have been applied, so the worker keeps it and sends it again, unchanged and with the same request id, until it is
answered (the service answers a poll it applied with the answer it gave then). Meanwhile merges keep running and
finished results are kept; polls back off exponentially with jitter. The first answer after the outage
refreshes the leases the worker still holds and completes the jobs it reported.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from prometheus_client import Counter, Gauge

from shale.block import write_deletion_mark
from shale.bucketindex import DeltaLink, DeltaWriter
from shale.compaction import MAX_POLL_CAPACITY, Assigned, JobUpdate, PollRequest, PollResponse
from shale.compactor.erase import erase_block
from shale.compactor.merge import READ_THREADS, MergeResult, fetch_sources, merge_blocks
from shale.compactor.wire import (
    MergeFailedError,
    decode_job,
    decode_outcome,
    encode_failure,
    encode_job,
    encode_result,
)
from shale.config import BucketConfig
from shale.errors import RetryableError
from shale.failpoints import failpoint
from shale.objstore import open_bucket, results_counted, task_bucket, with_requests
from shale.resources import release_free_memory

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
JOBS_PER_CORE = 8
"""Default slots: the jobs a worker claims per Spark core. Spark runs one merge per core at a time, and a poll's
jobs run as one Spark job of one task per core, each task merging its share one after the other. On a 2-core
machine a poll's Spark job starts its first merge 0.07-0.1 s after the poll and a Python task costs about 0.1 s of a
core, where a 40-block level-0 merge takes about 0.4 s: with eight merges per core the fixed costs stay a few
percent of the work."""


class CompactionService(Protocol):
    """What the worker needs from the metastore (the HTTP client and the embedded service both fit)."""

    def poll_compaction(self, request: PollRequest) -> PollResponse: ...


class MergeRunner(Protocol):
    """Where merges run: Spark tasks in production (``SparkMergeRunner``)."""

    def start(self, jobs: list[Assigned]) -> list[Future[MergeResult]]:
        """Start the jobs' merges; each future holds its job's merge result (a merge that raised has the error
        as its exception)."""
        ...

    def cancel(self, job: str) -> None: ...

    def close(self) -> None: ...


def run_merge_task(payload: str, bucket_config: BucketConfig, fetched: dict[str, Future[bytes]] | None = None) -> str:
    """One job's merge, in a Spark task: an encoded job in, its encoded outcome out (``shale.compactor.wire``). A
    merge that raises returns its error: the other jobs of the Spark job go on."""
    job = decode_job(payload)
    try:
        if job.erase is not None:  # an erase job (``shale erase``): its one source rewritten without the records
            result = erase_block(task_bucket(bucket_config), job.sources[0], job.erase, job=job.job, token=job.token,
                                 fetched=fetched)
        else:
            result = merge_blocks(task_bucket(bucket_config), job.sources, job=job.job, token=job.token,
                                  level=job.level, fetched=fetched, erased=job.erased)
    except Exception as exc:
        log.exception("compaction merge failed", extra={"job": job.job, "token": job.token})
        return encode_failure(exc)
    return encode_result(result)


def run_merge_share(payloads: list[str], bucket_config: BucketConfig) -> list[str]:
    """A Spark task's share of the jobs, merged one after the other; the GETs of each merge's input objects start
    when the merge before it starts, so the next input is in memory (compressed, as stored) when a merge ends.
    Memory an earlier task freed is returned to the system first (its peak must not count towards this task's);
    memory a merge frees stays with the process for the next merge of the share, which would otherwise fault the
    same pages in again (a tenth of a 40-block merge's time)."""
    release_free_memory()
    bucket = task_bucket(bucket_config)
    sources = [decode_job(p).sources for p in payloads]
    results: list[str] = []
    with ThreadPoolExecutor(READ_THREADS, thread_name_prefix="compaction-fetch") as pool:
        fetched = fetch_sources(bucket, sources[0], pool) if sources else {}
        for k, payload in enumerate(payloads):
            current, fetched = fetched, fetch_sources(bucket, sources[k + 1], pool) if k + 1 < len(payloads) else {}
            results.append(run_merge_task(payload, bucket_config, current))
    return results


def spread(jobs: list[Assigned], tasks: int) -> list[list[int]]:
    """The positions of ``jobs`` in at most ``tasks`` lists of about equal input bytes (largest job first, each to
    the lightest list), each in the order given."""
    loads: list[tuple[int, list[int]]] = [(0, []) for _ in range(min(tasks, len(jobs)))]
    for position in sorted(range(len(jobs)), key=lambda i: -sum(m.size for m in jobs[i].sources)):
        lightest = min(range(len(loads)), key=lambda t: loads[t][0])
        weight, positions = loads[lightest]
        loads[lightest] = (weight + sum(m.size for m in jobs[position].sources), [*positions, position])
    return [sorted(positions) for _, positions in loads]


class SparkMergeRunner:
    """The jobs of one ``start`` run as one Spark job of one task per Spark core, each task running its share of
    the merges one after the other: a Spark job and a Python task cost a few hundred and about a hundred
    milliseconds on this scale of machine, paid once per poll and core instead of once per merge. The job group is
    cancelled once every job of it is cancelled."""

    def __init__(self, spark: SparkSession, bucket: BucketConfig, slots: int) -> None:
        self.spark = spark
        self.bucket = bucket
        self.pool = ThreadPoolExecutor(max_workers=slots, thread_name_prefix="compaction")
        self.groups: dict[str, str] = {}
        self.pending: dict[str, set[str]] = {}
        """The jobs of each job group not cancelled yet."""

    def start(self, jobs: list[Assigned]) -> list[Future[MergeResult]]:
        group = f"shale-compaction-{uuid.uuid4().hex[:8]}"
        self.pending[group] = {j.job for j in jobs}
        self.groups.update((j.job, group) for j in jobs)
        shares = spread(jobs, max(1, self.spark.sparkContext.defaultParallelism))
        payloads = [[encode_job(jobs[i]) for i in share] for share in shares]
        names = ", ".join(j.job for j in jobs)
        bucket = self.bucket

        def run() -> list[list[str]]:
            sc = self.spark.sparkContext
            sc.setJobGroup(group, f"compaction {names}"[:1000], interruptOnCancel=True)
            try:
                results: list[list[str]] = results_counted(
                    sc.parallelize(payloads, len(payloads))
                    .map(with_requests(lambda share: run_merge_share(share, bucket))).collect())
            finally:
                self.pending.pop(group, None)
            return results

        batch = self.pool.submit(run)
        futures: list[Future[MergeResult]] = [Future() for _ in jobs]

        def settle(done: Future[list[list[str]]]) -> None:
            error = done.exception()
            results = [] if error is not None else done.result()
            for t, share in enumerate(shares):
                for k, position in enumerate(share):
                    if error is not None:
                        futures[position].set_exception(error)
                        continue
                    try:
                        futures[position].set_result(decode_outcome(results[t][k]))
                    except MergeFailedError as exc:
                        futures[position].set_exception(exc)

        batch.add_done_callback(settle)
        return futures

    def cancel(self, job: str) -> None:
        group = self.groups.pop(job, None)
        jobs = self.pending.get(group, set()) if group is not None else set()
        jobs.discard(job)
        if group is not None and not jobs and self.pending.pop(group, None) is not None:
            self.spark.sparkContext.cancelJobGroup(group)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


@dataclass
class RunningJob:
    job: Assigned
    future: Future[MergeResult]
    started: float = field(default_factory=time.monotonic)

    def result(self) -> MergeResult | None:
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
        cores = max(1, spark.sparkContext.defaultParallelism) if spark is not None else 1
        self.slots = slots or JOBS_PER_CORE * cores
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
        self.completed: list[MergeResult] = []
        self.unanswered: PollRequest | None = None
        """A poll that got no answer: sent again, unchanged, before anything else."""
        self.unanswered_polls = 0
        self.wake = threading.Event()
        """Set when a merge finishes: its report goes out at once, not at the next poll interval."""

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
                                     outputs=[running.future.result().output]))
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
                self._completed(running, result, DeltaLink.of(response.links.get(name)))
            else:
                self._refused(running, result, outcome, response.indexed)
        if response.assigned:
            for job, future in zip(response.assigned, self.runner.start(response.assigned), strict=True):
                log.info("compaction job started", extra={"job": job.job, "token": job.token, "tenant": job.tenant,
                                                           "level": job.level, "sources": len(job.sources)})
                future.add_done_callback(lambda _: self.wake.set())
                self.running[job.job] = RunningJob(job, future)
        RUNNING.set(len(self.running))
        return response

    def _completed(self, running: RunningJob, result: MergeResult, link: DeltaLink | None) -> None:
        if self.deltas is not None:
            now = time.time()
            self.deltas.write(running.job.tenant, added=[result.output],
                              marks=[(s.id, now, "compacted") for s in running.job.sources], link=link)
        BYTES.labels("in").inc(result.bytes_in)
        BYTES.labels("out").inc(result.bytes_out)
        PEAK_RSS.set(result.peak_rss)
        PEAK_ARROW.set(result.peak_arrow_bytes)
        self.completed.append(result)
        log.info("compaction job completed", extra={"job": running.job.job, "token": running.job.token,
                                                    "block": result.output.id, "rows": result.rows_out})

    def _refused(self, running: RunningJob, result: MergeResult | None, outcome: str,
                 indexed: list[str] | None) -> None:
        """Stop a job the service refused, and mark its output for deletion unless the metastore indexes it (a
        report answered wrongly must never delete committed data). The poll's answer says which refused outputs
        the index holds (``indexed``); an answer that does not say: no mark, the leader's bucket scan collects the
        output once no job can claim it."""
        self.runner.cancel(running.job.job)
        extra: dict[str, object] = {"job": running.job.job, "token": running.job.token, "outcome": outcome}
        if result is not None:
            output = result.output
            mark = indexed is not None and output.id not in indexed
            if mark:
                write_deletion_mark(self.bucket, output.tenant, output.id, time.time(),
                                    f"compaction report refused: {outcome}")
            extra["output"] = output.id
            extra["marked"] = mark
        log.warning("compaction job stopped: the service refused its report", extra=extra)

    def _pause(self, stop: threading.Event, seconds: float) -> None:
        """Wait ``seconds``, or until ``stop`` is set or a merge finishes."""
        deadline = time.monotonic() + seconds
        while not stop.is_set() and not self.wake.is_set() and (left := deadline - time.monotonic()) > 0:
            self.wake.wait(min(left, 0.2))
        self.wake.clear()

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
                self._pause(stop, self.poll_interval)
        finally:
            self.runner.close()
