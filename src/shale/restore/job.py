"""``shale restore``: the driver. It finds the source topic's backup blocks through the index, plans (pure,
``shale.restore.plan``), prepares the target (the topic, the progress topic, the fencing of a killed run's
producers) and runs one Spark task per source partition (``shale.restore.task``).

A restore job is named by what it restores (tenant, topic, incarnation, target cluster and topic, range), unless
the user names it: the same command started again is the same job, so it resumes from the committed progress.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from shale.block import RESTORE_JOB
from shale.config import BucketConfig, KafkaConfig
from shale.errors import ConfigError
from shale.kafka import client_options, describe_topics
from shale.logs import redact
from shale.metastore import Commands, IndexReads, RecordRestore, erased_offsets, every_erasure
from shale.objstore import results_counted, with_requests
from shale.restore import metrics
from shale.restore.plan import (
    PartitionPlan,
    RestorePlan,
    RestoreRange,
    build_plan,
    choose_incarnation,
    recorded_partitions,
    source_count,
)
from shale.restore.progress import (
    ProgressLine,
    ProgressWatcher,
    ensure_progress_topic,
    fence,
    progress_line,
    read_progress,
)
from shale.restore.task import PartitionOutcome, PartitionWork, encode_work, run_partition
from shale.restore.throttle import RestoreLimits

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

ALL_TIME = (0, 1 << 53)


@dataclass(frozen=True)
class RestoreRequest:
    tenant: str
    topic: str
    target_topic: str
    range: RestoreRange = field(default_factory=RestoreRange)
    incarnation: str | None = None
    incarnation_at_ms: int | None = None
    partitions: int | None = None
    """Partitions of a target topic created by the restore (default: the source's)."""
    source_partitions: int | None = None
    """The source topic's partition count, when it is gone and its last partitions never held a record (the
    metastore knows only those that did; a live source topic of the same incarnation is asked)."""
    job: str = ""
    generation: int = 1
    commit_every: int = 20_000
    allow_log_append_time: bool = False
    limits: RestoreLimits = field(default_factory=RestoreLimits)
    """Records and bytes per second for the whole restore."""
    dead_letter: bool = False
    """Records larger than the target's ``max.message.bytes`` go to the bucket instead of stopping their
    partition."""


@dataclass
class RestoreReport:
    job: str
    plan: dict[str, Any]
    executed: bool
    why_not: str = ""
    resumed: bool = False
    warnings: list[str] = field(default_factory=list)
    partitions: list[PartitionOutcome] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.why_not and all(not p.error for p in self.partitions)


def _iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def job_name(request: RestoreRequest, incarnation: str, target_bootstrap: str) -> str:
    if request.job:
        if not RESTORE_JOB.fullmatch(request.job):
            raise ConfigError(f"restore job name {request.job!r}: use 1 to 64 letters, digits, '-' or '_'")
        return request.job
    offsets = sorted((request.range.offsets or {}).items())
    what = json.dumps([request.tenant, request.topic, incarnation, target_bootstrap, request.target_topic,
                       request.range.until_ms, offsets, request.generation])
    return hashlib.sha256(what.encode()).hexdigest()[:16]


def partition_work(job: str, plan: RestorePlan, p: PartitionPlan, request: RestoreRequest,
                   limits: RestoreLimits | None = None, max_message_bytes: int = 0) -> PartitionWork:
    """What one source partition's task is given."""
    return PartitionWork(
        job, request.topic, request.target_topic, p.partition, p.start, p.end,
        tuple((i.start, i.end, i.block) for i in p.intervals), plan.mapping.source_partitions,
        plan.mapping.target_partitions, plan.until_ms, request.commit_every,
        "; ".join(f"partition {p.partition}: a gap in the backup at offsets [{g.start}, {g.end}): {g.reason}"
                  for g in p.gaps),
        request.tenant, limits or request.limits, max_message_bytes, request.dead_letter, plan.incarnation)


class RestoreJob:
    def __init__(self, index: IndexReads, bucket: BucketConfig, target: KafkaConfig, request: RestoreRequest,
                 spark: SparkSession | None = None, clock: Callable[[], float] = time.time,
                 on_progress: Callable[[str, ProgressLine], None] | None = None,
                 progress_interval: float = 5.0, journal: Commands | None = None, by: str = "") -> None:
        """``journal`` records each run (who: ``by``, or the API caller's token); without one nothing is recorded
        (tests of the protocol alone)."""
        self.clock, self.on_progress, self.progress_interval = clock, on_progress, progress_interval
        self.journal, self.by = journal, by
        self.index, self.bucket, self.target, self.request, self.spark = index, bucket, target, request, spark
        self.client = client_options(target)
        self.admin = AdminClient(self.client)

    def plan(self) -> RestorePlan:
        r = self.request
        blocks = [m for m in self.index.query_blocks([r.tenant], *ALL_TIME, f'{{topic="{r.topic}"}}', group="backup")
                  if m.generation == r.generation]
        incarnation = choose_incarnation(blocks, r.topic, r.incarnation, r.incarnation_at_ms)
        history, losses = self.index.offset_history("backup", r.generation)
        recorded = recorded_partitions([*self.index.offsets("backup", r.generation), *history, *losses], r.topic,
                                       incarnation)
        topics = describe_topics(self.target, sorted({r.target_topic, r.topic}), client=self.admin)
        existing = topics.get(r.target_topic)
        target_partitions = len(existing.partitions) if existing else r.partitions
        # The metastore knows the partitions that held a record; the topic itself, while it lives, knows them all.
        counted = r.source_partitions or source_count(topics.get(r.topic), incarnation)
        return build_plan(blocks, tenant=r.tenant, topic=r.topic, incarnation=incarnation,
                          target_partitions=target_partitions, range_=r.range, losses=losses, recorded=recorded,
                          counted=counted, counted_from="operator" if r.source_partitions else "kafka")

    def run(self, dry_run: bool = False, into_existing: bool = False) -> RestoreReport:
        r = self.request
        plan = self.plan()
        job = job_name(r, plan.incarnation, self.target.bootstrap_servers)
        report = RestoreReport(job, plan.summary(), executed=False)
        self._erased(plan, report)
        timestamp_type = self._timestamp_type()
        report.plan["target"] = {"topic": r.target_topic, "exists": timestamp_type is not None,
                                 "partitions": plan.mapping.target_partitions, "timestamp_type": timestamp_type}
        if timestamp_type == "LogAppendTime" and not r.allow_log_append_time:
            report.why_not = (f"the target topic {r.target_topic} stamps records with LogAppendTime: the restored "
                              "records would lose their timestamps. Set message.timestamp.type=CreateTime on it, or "
                              "pass --allow-log-append-time")
            return report
        if dry_run:
            report.why_not = "dry run"
            if timestamp_type is not None and self._holds_data(plan.mapping.target_partitions):
                report.warnings.append(f"the target topic {r.target_topic} already holds records: a restore adds "
                                       "to them only with --into-existing (a consumer would read both)")
            return report
        ensure_progress_topic(self.admin)
        todo = [p for p in plan.partitions if p.end > p.start or p.gaps]
        fence(self.client, job, [p.partition for p in todo])
        progress = read_progress(self.client, job)
        report.resumed = bool(progress)
        if (timestamp_type is not None and not progress and not into_existing
                and self._holds_data(plan.mapping.target_partitions)):
            report.why_not = (f"the target topic {r.target_topic} already holds records and this restore job has "
                              "no progress there: this was a dry run. Pass --into-existing to add the restored "
                              "records to it")
            return report
        run = self._record(job, plan, "running", int(report.plan["records"]))
        try:
            self._send(job, plan, todo, progress, timestamp_type, report)
        except BaseException as exc:
            try:
                self._record(job, plan, "stopped", 0, f"{type(exc).__name__}: {redact(str(exc))}", run)
            except Exception as journal_error:  # the restore's own error is the one to raise
                log.error("restore end not recorded", extra={"job": job, "error": redact(str(journal_error))})
            raise
        stopped = "; ".join(f"partition {o.partition}: {o.error}" for o in report.partitions if o.error)
        self._record(job, plan, "stopped" if stopped else "done", sum(o.restored for o in report.partitions),
                     stopped, run)
        return report

    def _erased(self, plan: RestorePlan, report: RestoreReport) -> None:
        """Count, per partition, the records an erasure removed (``shale erase``) inside the range: a restore skips
        them (no block holds them any more) and says how many."""
        rows = getattr(self.index, "erasures", None)
        erased = erased_offsets(every_erasure(rows), plan.topic, plan.incarnation, plan.tenant) if rows else {}
        ids: set[str] = set()
        for part in report.plan["partitions"]:
            gone = {o: e for o, e in erased.get(part["partition"], {}).items() if part["start"] <= o < part["end"]}
            part["erased"] = len(gone)
            ids |= set(gone.values())
        total = sum(p["erased"] for p in report.plan["partitions"])
        report.plan["erased"] = total
        if total:
            report.warnings.append(f"{total} records of the range were erased (erasure {', '.join(sorted(ids))}) "
                                   "and are not restored")

    def _record(self, job: str, plan: RestorePlan, state: Literal["running", "done", "stopped"], records: int,
                message: str = "", run: str = "") -> str:
        """Record the run's start or end in the journal (a refusal raises: nothing is sent unrecorded)."""
        run = run or secrets.token_hex(8)
        if self.journal is None:
            return run
        r = self.request
        offsets = ", ".join(f"{p}:{a}-{b}" for p, (a, b) in sorted((r.range.offsets or {}).items()))
        until = r.range.until_ms
        what = " ".join(filter(None, [
            f"offsets {offsets}" if offsets else "",
            f"until {_iso(until)}" if until is not None else "everything backed up",
            f"generation {r.generation}"]))
        self.journal.submit(RecordRestore(
            run=run, job=job, state=state, by=self.by, tenant=r.tenant, topic=r.topic, incarnation=plan.incarnation,
            target=f"{self.target.bootstrap_servers[:900]} {r.target_topic}", range=what, records=records,
            message=message[:2000])).raise_for_rejection()
        return run

    def _send(self, job: str, plan: RestorePlan, todo: list[PartitionPlan], progress: dict[int, tuple[int, int]],
              timestamp_type: str | None, report: RestoreReport) -> None:
        r = self.request
        if timestamp_type is None:
            self._create_target(plan.mapping.target_partitions)
        configs = self._target_configs() or {}
        warning = self._retention_warning(plan.oldest_ms, configs)
        if warning:
            report.warnings.append(warning)
            log.warning("restore target retention", extra={"warning": warning})
        max_message_bytes = int(configs.get("max.message.bytes") or 0)
        report.plan["target"]["max_message_bytes"] = max_message_bytes
        running = min(len(todo), self.spark.sparkContext.defaultParallelism) if self.spark is not None else 1
        limits = r.limits.share(running)
        works = [encode_work(partition_work(job, plan, p, r, limits, max_message_bytes)) for p in todo]
        report.executed = True
        if not works:
            return
        if self.spark is None:
            raise ConfigError("a restore runs on Spark: no SparkSession was given")
        client, bucket = self.client, self.bucket
        planned = {p.partition: p.records for p in todo}
        started, first = time.monotonic(), dict(progress)

        def report_progress(now: dict[int, tuple[int, int]]) -> None:
            line = progress_line(planned, first, now, time.monotonic() - started)
            metrics.observe(job, line, planned, now)
            if self.on_progress is not None:
                self.on_progress(job, line)

        with ProgressWatcher(client, job, report_progress, self.progress_interval):
            results = results_counted(self.spark.sparkContext.parallelize(works, len(works))
                                      .map(with_requests(lambda w: run_partition(w, client, bucket))).collect())
        report.partitions = sorted((PartitionOutcome(**json.loads(raw)) for raw in results),
                                   key=lambda o: o.partition)
        for outcome in report.partitions:
            metrics.DEAD_LETTERED.labels(job).inc(len(outcome.dead_lettered))
            if outcome.error:
                metrics.STOPPED.labels(job).inc()
                log.error("restore partition stopped", extra={"partition": outcome.partition, "error": outcome.error})

    def _target_configs(self) -> dict[str, str] | None:
        """The target topic's configuration, or None when the topic does not exist."""
        if not describe_topics(self.target, [self.request.target_topic], client=self.admin):
            return None
        resource = ConfigResource(ConfigResource.Type.TOPIC, self.request.target_topic)
        configs = next(iter(self.admin.describe_configs([resource]).values())).result(timeout=30)
        return {name: str(entry.value) for name, entry in configs.items()}

    def _timestamp_type(self) -> str | None:
        """The target topic's ``message.timestamp.type``, or None when the topic does not exist."""
        configs = self._target_configs()
        return None if configs is None else configs.get("message.timestamp.type", "CreateTime")

    def _retention_warning(self, oldest_ms: int, configs: dict[str, str]) -> str:
        """A warning when Kafka would delete restored records at once: older than the target's ``retention.ms``."""
        retention = int(configs.get("retention.ms", "-1") or -1)
        if retention >= 0 and 0 < oldest_ms < self.clock() * 1000 - retention:
            return (f"the oldest restored records are older than the target topic's retention.ms ({retention}): "
                    "Kafka deletes them soon after the restore; raise retention.ms on the target first")
        return ""

    def _create_target(self, partitions: int) -> None:
        topic = NewTopic(self.request.target_topic, partitions, replication_factor=-1)
        for future in self.admin.create_topics([topic]).values():
            try:
                future.result(timeout=30)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
        deadline = time.monotonic() + 30
        while not describe_topics(self.target, [self.request.target_topic], client=self.admin):
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)

    def _holds_data(self, partitions: int, timeout: float = 30.0) -> bool:
        """Whether a ``read_committed`` consumer finds any record in the target topic."""
        consumer = Consumer({**self.client, "group.id": "shale-restore-probe", "enable.auto.commit": False,
                             "isolation.level": "read_committed", "enable.partition.eof": True})
        try:
            consumer.assign([TopicPartition(self.request.target_topic, p, -2) for p in range(partitions)])
            ended: set[int] = set()
            deadline = time.monotonic() + timeout
            while len(ended) < partitions and time.monotonic() < deadline:
                message = consumer.poll(0.5)
                if message is None:
                    continue
                error = message.error()
                if error is None:
                    return True
                if error.code() == KafkaError._PARTITION_EOF:
                    ended.add(message.partition() or 0)
            return False
        finally:
            consumer.close()
