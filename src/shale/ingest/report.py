"""What an ingest group tells its operators about each plan and batch: the metrics of ``metrics.py`` and the log
lines for offsets lost or ahead of Kafka and for partitions paused on the Schema Registry."""

from __future__ import annotations

import logging
import time

from shale.encoder import Written
from shale.ingest import metrics
from shale.ingest.committer import Committer
from shale.ingest.pauses import RegistryBackoff
from shale.ingest.plan import BatchPlan, PartitionRange, TopicPartition
from shale.ingest.task import Paused

log = logging.getLogger(__name__)


class BatchReport:
    def __init__(self, group: str, backoff: RegistryBackoff, committer: Committer) -> None:
        self.group = group
        self.backoff = backoff
        self.committer = committer
        self.peak_task_rss = 0
        """The largest resident set a task process of this group reported."""
        self._reported: set[tuple[str, TopicPartition]] = set()

    def plan(self, plan: BatchPlan) -> None:
        """Lost and truncated offsets: a metric per partition, and one error log line each time one appears."""
        metrics.LOST.clear()
        paused: set[tuple[str, TopicPartition]] = set()
        for loss in plan.losses:
            tp = (loss.topic, loss.partition)
            metrics.LOST.labels(self.group, loss.topic, str(loss.partition)).set(loss.earliest - loss.start)
            paused.add(("lost", tp))
            if ("lost", tp) not in self._reported:
                log.error(
                    "offsets were deleted by Kafka before they were read; this partition waits, the others go on",
                    extra={"group": self.group, "topic": loss.topic, "partition": loss.partition,
                           "lost_from": loss.start, "lost_to": loss.earliest,
                           "action": f"shale offsets acknowledge-loss --group {self.group} --topic {loss.topic} "
                                     f"--partition {loss.partition} --to {loss.earliest}"})
        for ahead in plan.ahead:
            tp = (ahead.topic, ahead.partition)
            paused.add(("ahead", tp))
            if ("ahead", tp) not in self._reported:
                log.error("the committed end is beyond Kafka's end offset (was the log truncated?); this partition "
                          "waits until Kafka's end passes it", extra={
                              "group": self.group, "topic": ahead.topic, "partition": ahead.partition,
                              "committed_end": ahead.committed_end, "kafka_end": ahead.kafka_end})
        self._reported = paused
        for reason in ("lost", "ahead"):
            metrics.PAUSED.labels(self.group, reason).set(sum(1 for r, _ in paused if r == reason))


    def pauses(self, plan: BatchPlan, paused: list[Paused]) -> None:
        """The registry's pauses: the backoff, the metrics and a log line naming the registry and the partitions."""
        resumed = self.backoff.record(paused, [(r.topic, r.partition) for r in plan.ranges], time.monotonic())
        metrics.REGISTRY_FAILURES.labels(self.group).inc(len(paused))
        metrics.PAUSED.labels(self.group, "registry").set(len(self.backoff.held))
        if paused:
            first = paused[0]
            log.error("the schema registry did not answer for schemas these partitions need; they pause and are "
                      "tried again later, the others go on", extra={
                          "group": self.group, "registry": first.registry,
                          "partitions": [f"{p.topic}[{p.partition}]@{p.at}" for p in paused],
                          "error": first.error, "retry_in": self.backoff.delay((first.topic, first.partition))})
        if resumed:
            log.info("the schema registry answered; paused partitions resumed", extra={
                "group": self.group, "partitions": [f"{t}[{p}]" for t, p in resumed]})

    def batch(self, plan: BatchPlan, written: list[Written], ranges: list[PartitionRange], outcome: str) -> None:
        """``ranges``: what the batch committed (the plan's ranges, cut where a partition paused)."""
        committed = {(r.topic, r.partition): r for r in ranges}
        for tp, lag in plan.lag.items():
            done = committed.get(tp)
            metrics.LAG.labels(self.group, tp[0], str(tp[1])).set(lag - (done.end - done.start if done else 0))
        records = sum(w.records for w in written)
        metrics.BATCHES.labels(self.group, outcome).inc()
        metrics.RECORDS.labels(self.group).inc(records)
        metrics.QUARANTINED.labels(self.group).inc(sum(w.quarantined for w in written))
        metrics.BYTES.labels(self.group).inc(sum(w.bytes for w in written))
        metrics.BLOCKS.labels(self.group).inc(len({b.id for w in written for b in w.blocks}))
        metrics.SKIPPED.labels(self.group).inc(sum(r.end - r.start for r in ranges) - records)
        for w in written:
            for phase, seconds in w.seconds.items():
                metrics.TASK_SECONDS.labels(self.group, phase).inc(seconds)
        peak = max((w.peak_rss for w in written), default=0)
        self.peak_task_rss = max(self.peak_task_rss, peak)
        metrics.TASK_PEAK_RSS.labels(self.group).set(peak)
        metrics.DLQ_PENDING.labels(self.group).set(1 if self.committer.dlq_pending else 0)
        if ranges:
            metrics.LAST_COMMIT.labels(self.group).set(time.time())
