"""``shale ingest``: one ingest group's loop. Each batch reads exact Kafka offsets and commits exactly them.

Per batch (docs/DESIGN.md, section 10):

1. Plan (``plan.py``): from the metastore's committed offsets and Kafka's current state, the exact offsets
   ``[start, end)`` each partition reads, in its topic incarnation; lost offsets are reported, never skipped.
2. Read those offsets in at most as many Spark tasks as Spark has cores, each with one librdkafka consumer
   (``read_committed``; ``read.py``, ``source.py``); tasks write blocks in byte-bounded chunks that tile each
   partition's range (``task.py``), data objects then meta.json, under deterministic ids.
3. Send one ``CommitIngestBatch`` with every block and every planned range; the metastore accepts it only if
   each range starts at the committed end (or it is an exact replay). Only then is the next batch planned.
   A partition whose task paused on the Schema Registry commits only the chunks written before the pause
   (``pauses.py``) and is left out of the plans for a growing delay; the others commit as usual. Metrics and
   log lines of each plan and batch: ``report.py``.

The metastore is the only record of progress: there is no Spark checkpoint. A crash anywhere leaves, at worst,
blocks that no commit holds; the next batch is planned from the committed offsets again, and the commit that
takes their offsets again is followed by marks on them (``orphans.py``; the metastore's bucket scan removes what
is left, section 9.5).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING

from shale.bucketindex import DeltaLink, DeltaWriter
from shale.config import ShaleConfig
from shale.encoder import GROUPS, GroupSpec, Written, check_typed_rules, raise_for_errors
from shale.errors import ConfigError, MetastoreUnavailableError, RetryableError
from shale.failpoints import failpoint
from shale.ingest import metrics
from shale.ingest.committer import (
    Committer,
    IngestConflictError,
    LeaseLostError,
    batch_commit,
    stream_name,
)
from shale.ingest.lease import IngestLease, LeaseTarget
from shale.ingest.orphans import CLOCK_SKEW_MS, OrphanSweep
from shale.ingest.pauses import RegistryBackoff, backoff, commit_ranges
from shale.ingest.plan import BatchPlan, Limits, PartitionRange, TopicPartition, plan_batch, recreated
from shale.ingest.read import SparkRead
from shale.ingest.report import BatchReport
from shale.ingest.summary import IngestSummary
from shale.ingest.task import phase_sums
from shale.kafka import admin, describe_topics, offset_bounds, value_bytes_per_offset
from shale.metastore import DeadLetterQueue, open_metastore
from shale.objstore import open_bucket
from shale.schemas import RegistryUnavailableError
from shale.signals import Stopper

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)
WARM_RECORDS = 10_000
"""The warm-up rehearsal's records (read, parsed, not written): the last ones of each partition, shared out
evenly, at least one each (it is reading a partition once that makes its consumer ready)."""
AVAILABLE_NOW_ATTEMPTS = 5  # consecutive failed batches before `--available-now` gives up (about a minute)


class IngestJob:
    def __init__(self, config: ShaleConfig, group: str, *, spark: SparkSession | None = None,
                 metastore: LeaseTarget | None = None, shard: int | None = None) -> None:
        if group not in GROUPS:
            raise ConfigError(f"--group {group!r}: choose one of {', '.join(GROUPS)}")
        ingest = config.ingest
        if not ingest.topics and not ingest.topic_pattern:
            raise ConfigError("ingest.topics or ingest.topic_pattern must name what to persist")
        if group == "partition" and not ingest.parsers:
            raise ConfigError("the partition group needs ingest.parsers (which parser reads which topics)")
        self.config = config
        self.group = group
        self.generation = ingest.generation
        self.spec = GroupSpec(group, ingest.generation, config.bucket, ingest)
        self.spec.tenants  # noqa: B018 - validates the default tenant now rather than in a task
        self.metastore = metastore or open_metastore(config)
        self.bucket = open_bucket(config.bucket)
        self.committer = Committer(self.metastore, DeadLetterQueue(self.bucket), group, ingest.generation)
        self.orphans = OrphanSweep(self.bucket, group, ingest.generation)
        self.run_id = uuid.uuid4().hex[:8]
        self.spark = SparkRead(config, self.spec, self.bucket, spark)
        self._admin: AdminClient | None = None
        self.batches = 0
        self.record_bytes: dict[TopicPartition, float] = {}
        self.starts: dict[TopicPartition, int] = {}
        self.last_plan: BatchPlan | None = None
        self.plan_seconds = 0.0
        """How long the last plan took (Kafka's offsets asked, the batch sized): the batch log line says it."""
        # Stale-tolerant bucket index: tell readers about committed blocks before the index writer does.
        self.deltas = DeltaWriter(self.bucket) if config.bucket_index.deltas else None
        self.summary = IngestSummary(group, ingest.quarantine_warn_share)
        # The time policy, per group as seed 002's upload policy: the backup group's blocks are read only on a bad
        # day, so it plans less often (fewer, larger objects).
        self.trigger = ingest.backup_trigger_interval if group == "backup" else ingest.trigger_interval
        # A failure's first delay, doubling with each in a row: at least a second, even when batches run back to back.
        self.retry_base = max(1.0, ingest.trigger_interval)
        self.pauses = RegistryBackoff(self.retry_base)
        self.report = BatchReport(group, self.pauses, self.committer)
        if shard is not None and ingest.shards == "auto":
            raise ConfigError(f"--shard {shard}: ingest.shards is auto (each driver takes the shard it is given)")
        if shard is not None and isinstance(ingest.shards, int) and shard >= ingest.shards:
            raise ConfigError(f"--shard {shard}: ingest.shards is {ingest.shards} (shards 0 to {ingest.shards - 1})")
        self.lease = IngestLease(self.metastore, group, ingest.generation, ingest.lease_duration, shard=shard,
                                 shards=ingest.shards)

    def mine(self, topic: str, partition: int) -> bool:
        """Whether ``topic[partition]`` belongs to the shard this driver holds (under the group's shard map)."""
        return self.lease.owner(topic, partition) == self.lease.shard

    # -- planning ---------------------------------------------------------------------------------------

    @property
    def kafka_admin(self) -> AdminClient:
        """One admin client for the job's questions to Kafka (it keeps its connections between batches)."""
        if self._admin is None:
            self._admin = admin(self.config.kafka)
        return self._admin

    def plan(self, targets: Mapping[TopicPartition, int] | None = None) -> BatchPlan:
        """The next batch, from Kafka's state now and the offsets committed so far. Partitions never read before
        are sized from a sample of their first records (``value_bytes_per_offset``)."""
        started = time.perf_counter()
        ingest, kafka = self.config.ingest, self.config.kafka
        topics = describe_topics(kafka, ingest.topics, ingest.topic_pattern, client=self.kafka_admin)
        bounds = offset_bounds(kafka, [(t, p) for t, state in topics.items() for p in state.partitions
                                       if self.mine(t, p)], client=self.kafka_admin)
        incarnations = {t: state.incarnation for t, state in topics.items()}
        starts: dict[TopicPartition, int] = {}
        for tp, (earliest, end) in bounds.items():
            done = self.committer.committed.get(tp)
            if done is not None and done[1] and done[1] != incarnations[tp[0]]:
                starts[tp] = earliest  # a recreated topic: its new incarnation starts at its earliest offset
            elif done is None and ingest.starting_offsets == "latest":
                starts[tp] = self.starts.setdefault(tp, end)  # pinned: records after it are never skipped
        limits = Limits(ingest.max_records_per_batch, ingest.max_batch_bytes, self.record_bytes)
        now = int(time.time() * 1000)
        self.pauses.forget(bounds)
        held = self.pauses.waiting(time.monotonic())
        plan = plan_batch(incarnations, bounds, self.committer.committed, starts, limits, now, targets, held)
        unknown = {(r.topic, r.partition): (r.start, bounds[(r.topic, r.partition)][1]) for r in plan.ranges
                   if (r.topic, r.partition) not in self.record_bytes}
        if unknown:  # sampled once; a partition that gave no size (0.0) is probed by the plan, as before
            self.record_bytes.update(value_bytes_per_offset(kafka, unknown))
            plan = plan_batch(incarnations, bounds, self.committer.committed, starts, limits, now, targets, held)
        self.report.plan(plan)
        self.plan_seconds = time.perf_counter() - started
        metrics.BATCH_SECONDS.labels(self.group, "plan").inc(self.plan_seconds)
        return plan

    # -- one batch ----------------------------------------------------------------------------------------

    def run_batch(self, plan: BatchPlan) -> str:
        """Read, write and commit one planned batch; return the commit's outcome ("paused" when every partition
        paused on the Schema Registry and there was nothing to commit)."""
        started = time.perf_counter()
        written, paused = self.spark.read(plan)
        named = plan.ranges + plan.quiet
        topics = describe_topics(self.config.kafka, {r.topic for r in named}, client=self.kafka_admin)
        changed = recreated(named, {name: t.incarnation for name, t in topics.items()})
        if changed:  # the blocks written stay orphans, removed by the bucket cleaner's rule
            raise RetryableError(f"topics {changed} were deleted and recreated while this batch read them; it is "
                                 "not committed and is planned again for the new incarnation")
        wrote = time.perf_counter()
        self.lease.check()  # a driver that lost its lease (its heartbeat was refused) stops before committing
        ranges = commit_ranges(plan.ranges, paused)
        command = batch_commit(written, ranges, group=self.group, generation=self.generation, writer="ingest",
                               batch=f"{self.run_id}/{self.batches}", lease=self.lease.token,
                               shard=self.lease.shard, quiet=plan.quiet if ranges else ())
        # What the commit holds, for a history check of the commits (the partition tests read it from the log).
        log.debug("batch commit", extra={
            "group": self.group, "batch": command.batch, "lease": command.lease, "shard": command.shard,
            "ranges": [[r.topic, r.partition, r.start, r.end] for r in command.ranges],
            "block_ids": [b.id for b in command.blocks]})
        failpoint("ingest.before-commit")
        committing = time.perf_counter()
        outcome = self.committer.commit(command) if ranges else "paused"
        committed = time.perf_counter()
        if ranges:
            self.orphans.record(command)
        if outcome in ("committed", "replayed"):  # a lost batch's blocks hold these offsets too: mark them now
            self.orphans.sweep(self.committer.committed)
        failpoint("ingest.after-commit")
        self.report.pauses(plan, paused)
        if outcome == "committed" and self.deltas is not None:
            for tenant in sorted({b.tenant for b in command.blocks}):
                self.deltas.write(tenant, added=[b for b in command.blocks if b.tenant == tenant],
                                  link=DeltaLink.of(self.committer.links.get(tenant)))
        self.batches += 1
        metrics.BATCH_SECONDS.labels(self.group, "spark").inc(wrote - started)
        metrics.BATCH_SECONDS.labels(self.group, "commit").inc(time.perf_counter() - wrote)
        self._learn_sizes(written, ranges)
        self.report.batch(plan, written, ranges, outcome)
        log.info("batch committed", extra={
            "group": self.group, "batch": command.batch, "outcome": outcome, "blocks": len(command.blocks),
            "records": sum(w.records for w in written), "partitions": len(command.ranges),
            "offsets": sum(r.end - r.start for r in ranges), "paused": len(paused),
            "plan_seconds": round(self.plan_seconds, 3), "write_seconds": round(wrote - started, 3),
            "commit_seconds": round(committed - committing, 3),
            "seconds": round(time.perf_counter() - started, 3), "task_seconds": phase_sums(written)})
        self.summary.batch(written)
        return outcome

    def _learn_sizes(self, written: list[Written], ranges: list[PartitionRange]) -> None:
        """Bytes per offset of each committed range, smoothed over batches: what the next plans size ranges by."""
        size: dict[TopicPartition, int] = {}
        for w in written:
            size[(w.topic, w.partition)] = size.get((w.topic, w.partition), 0) + w.bytes
        for r in ranges:
            tp = (r.topic, r.partition)
            if size.get(tp):
                seen, old = size[tp] / (r.end - r.start), self.record_bytes.get(tp)
                self.record_bytes[tp] = 0.5 * old + 0.5 * seen if old else seen

    # -- the loop -------------------------------------------------------------------------------------------

    def _targets(self) -> dict[TopicPartition, int]:
        """With --available-now: every current partition's end offset now (what "now" means)."""
        ingest, kafka = self.config.ingest, self.config.kafka
        topics = describe_topics(kafka, ingest.topics, ingest.topic_pattern, client=self.kafka_admin)
        missing = sorted(set(ingest.topics) - set(topics))
        if missing:
            raise ConfigError(f"topics {missing} do not exist in Kafka at {kafka.bootstrap_servers}")
        bounds = offset_bounds(kafka, [(t, p) for t, state in topics.items() for p in state.partitions
                                       if self.mine(t, p)], client=self.kafka_admin)
        return {tp: end for tp, (_, end) in bounds.items()}

    def run(self, available_now: bool = False, stop: threading.Event | None = None) -> None:
        """Run until SIGTERM/SIGINT (or ``stop``); with ``available_now``, until what Kafka holds now is stored. A
        failed batch is planned again after a growing delay, for ever when running continuously; with
        ``available_now``, the ``AVAILABLE_NOW_ATTEMPTS``-th failure in a row is raised."""
        if stop is None:  # nobody else handles signals: the first stops at the next batch (shale.signals)
            stop = Stopper(f"ingest {self.group}").install().event
        if self.group == "partition":
            self._check_rules()
        # A run to the end has no freshness to protect and no standby: no rehearsal.
        held = bool(self._warm()) if not available_now else False
        while held or self.lease.wait(stop):
            held = False
            self.spec.shard = self.lease.shard
            self.committer.stream = stream_name(self.group, self.generation, self.lease.shard)
            ending = threading.Event()
            beat = self.lease.heartbeat(ending)
            try:
                self._run(available_now, stop)
                return
            except LeaseLostError as exc:
                if self.lease.lost is None:
                    self.lease.lose(str(exc), exc.reason)  # says so in the log (once)
                if exc.reason != "resharded":
                    raise  # this process writes no more
            finally:
                ending.set()
                beat.join(timeout=30)
                self.lease.release()
            # The group's shard map changed: acquire a shard again under the new map (offsets are per partition,
            # so a partition that moved resumes at its committed end under whichever driver holds it now).
            self.lease.reset()

    def _check_rules(self) -> None:
        """The typed rules against the registry's schemas, as `shale config check` does: a rule that does not fit
        its subject's newest version would quarantine every record, so ingest refuses to start. A registry that does
        not answer usefully leaves the check to the records themselves (their partitions pause)."""
        try:
            findings = check_typed_rules(self.config.ingest, self.config.ingest.topics)
        except RegistryUnavailableError as exc:
            log.warning("the typed parser rules could not be checked against the schema registry; partitions whose "
                        "schemas it does not give pause", extra={"group": self.group, "error": str(exc)})
            return
        for finding in findings:
            if not finding.error:
                log.warning(finding.message, extra={"group": self.group})
        raise_for_errors(findings)

    def _give_up_on_registry(self) -> None:
        """With --available-now: only partitions paused on the registry are left; after
        ``schema_registry.available_now_attempts`` pauses in a row of one of them, the run reports it instead of
        waiting for ever (nothing of it was quarantined; its offsets from the pause on are not committed)."""
        attempts = self.config.ingest.schema_registry.available_now_attempts
        worst = max(self.pauses.held.items(), key=lambda item: item[1].failures, default=None)
        if worst is not None and worst[1].failures >= attempts:
            (topic, partition), held = worst
            raise RegistryUnavailableError(
                f"ingest {self.group}: stored everything it could, but {topic}[{partition}] paused {held.failures} "
                f"times in a row on the schema registry {held.registry}: {held.error}. Nothing of it was "
                "quarantined; the next run continues where it paused (ingest.schema_registry."
                "available_now_attempts sets how often a one-shot run tries)", registry=held.registry)

    def _warm(self) -> bool:
        """Start what a batch needs before waiting for the lease, so that the first batch after a standby's
        takeover does not pay the cold start (docs/DESIGN.md 10.7). First the Spark application; then, if a lease
        is free at once, this process takes it and returns True: its first batch pays the cold start, which a
        rehearsal would only have paid before it. Otherwise, while others hold the leases, the Kafka admin client
        and a rehearsal of a batch on the last ``WARM_RECORDS`` records of the partitions it may own: Spark's Kafka
        source reads them through the same columns, tasks, Arrow hand-off and Python workers as a batch (creating
        the executor's pooled consumer of each partition), and each worker imports the task's modules and parses
        and encodes them into a scratch bucket in its own memory (nothing is written, nothing committed).
        Partitions with no record yet are not read; with none at all, a tiny job still starts the Python workers
        with the task's modules imported. Best effort: returns False."""
        started = time.perf_counter()
        self.spark.session()
        phases = {"spark": time.perf_counter() - started}
        try:
            if self.lease.step(time.monotonic()) is not None:
                log.info("ingest driver warmed", extra={
                    "group": self.group, "seconds": round(time.perf_counter() - started, 3), "partitions": 0,
                    "records": 0, "phases": {k: round(v, 3) for k, v in phases.items()}, "lease": "free"})
                return True
        except MetastoreUnavailableError:
            pass  # the lease is waited for after the rehearsal, as when it is held
        plan = BatchPlan(read_time_ms=int(time.time() * 1000))
        task_seconds: dict[str, float] = {}
        try:
            ingest = self.config.ingest
            topics = describe_topics(self.config.kafka, ingest.topics, ingest.topic_pattern, client=self.kafka_admin)
            want = self.lease.want
            candidates = sorted((t, p) for t, state in topics.items() for p in state.partitions
                                if want is None or self.lease.owner(t, p) == want)
            bounds = offset_bounds(self.config.kafka, candidates, client=self.kafka_admin) if candidates else {}
            share = max(1, WARM_RECORDS // max(1, len(bounds)))
            plan.ranges = [PartitionRange(t, p, topics[t].incarnation, max(low, end - share), end)
                           for (t, p), (low, end) in sorted(bounds.items()) if end > low]
            phases["kafka_admin"] = time.perf_counter() - started - sum(phases.values())
        except Exception as exc:
            log.warning("warming the Kafka read failed; the first batch will be slower",
                        extra={"group": self.group, "error": f"{type(exc).__name__}: {str(exc)[:500]}"})
        try:
            task_seconds = self.spark.rehearse(plan)
            phases["rehearsal"] = time.perf_counter() - started - sum(phases.values())
        except Exception as exc:
            log.warning("the warm-up batch failed; the first batch will be slower",
                        extra={"group": self.group, "error": f"{type(exc).__name__}: {str(exc)[:500]}"})
        log.info("ingest driver warmed", extra={
            "group": self.group, "seconds": round(time.perf_counter() - started, 3), "partitions": len(plan.ranges),
            "records": plan.offsets, "phases": {k: round(v, 3) for k, v in phases.items()},
            "task_seconds": task_seconds, "lease": "held"})
        return False

    def _run(self, available_now: bool, stop: threading.Event) -> None:
        self.committer.load()  # after the lease: the offsets the previous holder committed are final now
        # The previous holder's last batch may be lost (killed before its commit): its blocks are marked after this
        # process's first commit takes their offsets. It was planned after the shard's last commit and after that
        # holder took the lease (nothing to look for if nobody held the shard before).
        since = max([t for tp, t in self.committer.updated.items() if self.mine(*tp)]
                    + ([self.lease.previous_ms] if self.lease.previous_ms is not None else []), default=None)
        if since is not None:
            self.orphans.arm(since - CLOCK_SKEW_MS)
        targets = self._targets() if available_now else None
        if not available_now and self.config.ingest.topics:
            missing = sorted(set(self.config.ingest.topics) - set(describe_topics(
                self.config.kafka, self.config.ingest.topics, client=self.kafka_admin)))
            if missing:
                log.warning("named topics do not exist (yet); ingesting the others",
                            extra={"group": self.group, "topics": missing})
        for counter in (metrics.FAILED, metrics.SKIPPED, metrics.REGISTRY_FAILURES):
            counter.labels(self.group)  # served from the start, at 0
        metrics.PAUSED.labels(self.group, "registry").set(len(self.pauses.held))
        log.info("ingest started", extra={"group": self.group, "generation": self.generation})
        waiting_since: float | None = None
        failures = 0
        while not stop.is_set():
            self.lease.check()  # a lease lost while idle (its heartbeat refused) ends this shard's loop too
            planned_at = time.monotonic()
            try:
                plan = self.plan(targets)
            except RetryableError as exc:
                log.warning("Kafka did not answer; retrying", extra={"group": self.group, "error": str(exc)})
                stop.wait(self.retry_base)
                continue
            self.last_plan = plan
            if available_now and not plan.ranges and plan.held:
                self._give_up_on_registry()
                stop.wait(self.retry_base)  # the paused partitions' delay passes
                continue
            if available_now and not plan.ranges:
                blocked = [f"{x.topic}[{x.partition}]" for x in plan.losses] + [
                    f"{x.topic}[{x.partition}]" for x in plan.ahead]
                if blocked:
                    raise IngestConflictError(
                        f"ingest {self.group}: stored everything it could, but partitions are blocked: "
                        f"{', '.join(blocked)} (see the log for the offsets and the command to run)")
                break
            minimum = self.config.ingest.min_records_per_batch
            if plan.ranges and minimum and plan.offsets < minimum and not available_now:
                waiting_since = waiting_since or time.monotonic()
                if time.monotonic() - waiting_since < self.config.ingest.max_batch_delay:
                    stop.wait(min(1.0, self.trigger))
                    continue
            waiting_since = None
            if not plan.ranges:
                metrics.BATCHES.labels(self.group, "empty").inc()
                stop.wait(self.trigger)
                continue
            try:
                self.run_batch(plan)
            except IngestConflictError:
                raise  # the metastore refused the commit: this process must not write more
            except Exception as exc:  # Spark, Kafka or the bucket failed before the commit: nothing was committed
                self.orphans.arm(plan.read_time_ms)  # blocks it completed carry its read time in their ids
                failures += 1
                metrics.FAILED.labels(self.group).inc()
                if available_now and failures >= AVAILABLE_NOW_ATTEMPTS:
                    raise  # a one-shot run reports a persistent failure instead of retrying for ever
                delay = backoff(self.retry_base, failures)
                log.error("batch failed before its commit; planning it again", extra={
                    "group": self.group, "error": f"{type(exc).__name__}: {str(exc)[:2000]}", "retry_in": delay})
                stop.wait(delay)
                continue
            failures = 0
            if not available_now and sum(v for tp, v in plan.lag.items() if tp not in plan.held) <= plan.offsets:
                # Caught up: the next plan comes the group's trigger after this one, at once if the batch took longer
                # (as Spark's processing-time trigger). A pause after the batch would add its duration to every
                # record's latency; the object count stays bounded by one batch per interval either way.
                stop.wait(max(0.0, self.trigger - (time.monotonic() - planned_at)))
        log.info("ingest stopped", extra={"group": self.group, "batches": self.batches})

