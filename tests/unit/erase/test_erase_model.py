"""The erasure model (DESIGN 19.8): a hypothesis state machine interleaving produce and ingest of both groups
(committed by the real ``Committer``, through the dead letter queue in a metastore outage, replayed later),
compaction, topic recreation, repair quarantining a damaged copy, restore dead letters, erasures by key and by a
column's value (repeated, overlapping, killed between request and plan and run again), the passing of time with
the leader's maintenance, and receipts; against the real metastore service, block writer, compaction worker
(``ThreadRunner``), erase driver, receipt writer and leftover scan, on an in-memory bucket (``model_world``).

Invariants: every record not erased is in the live blocks byte for byte, exactly once per group, after every
step (unless its commit waits in the dead letter queue: then in neither), in each quarantined copy once, and in
each dead letter until an erasure's receipt makes it a stub; after
each receipt the leftover scan finds nothing of that erasure, and none of its records is live.

``make test`` runs a short profile; ``SHALE_HYPOTHESIS_PROFILE=long`` (or the nightly ``HYPOTHESIS_PROFILE=nightly``)
runs a long one."""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import tempfile
import uuid
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any
from unittest import mock

import pyarrow.parquet as pq
from hypothesis import HealthCheck, settings
from hypothesis import event as hypothesis_event
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from tests.factories import Clock
from tests.unit.erase.model_world import (
    COLUMN,
    CUSTOMERS,
    KEYS,
    PARTITIONS,
    TOPIC,
    CutOff,
    KilledBeforePlan,
    KilledError,
    Record,
    commit_of,
    customer_of,
    parsed,
    records_in,
    restore_dead_letter,
    value_of,
    write,
)
from tests.unit.erase.test_erase import _worker

from shale.block import DLQ_PREFIX, BlockMeta, block_file_key, read_dataset, write_quarantine_mark
from shale.config import BucketConfig, CompactionConfig, KafkaConfig, RetentionConfig
from shale.erase import (
    ColumnValueError,
    ErasureRequest,
    Needle,
    ReceiptNotReadyError,
    column_request,
    erase,
    scan_leftovers,
    write_receipt,
)
from shale.erase import api as erase_api
from shale.erase.api import ErasureNotReadyError, open_round
from shale.ingest.committer import Committer
from shale.metastore import DeadLetterQueue, ErasureWatermark, MetastoreService, SingleNodeLog, StateMachine
from shale.metastore.api.dlq import REJECTED_PREFIX
from shale.metastore.api.maintenance import Maintenance
from shale.objstore import open_bucket

HOUR = 3600.0
KAFKA = KafkaConfig(bootstrap_servers="127.0.0.1:1")
GROUPS = ("backup", "partition")

_long = os.environ.get("SHALE_HYPOTHESIS_PROFILE") == "long" or os.environ.get("HYPOTHESIS_PROFILE") == "nightly"
MODEL_SETTINGS = settings(max_examples=int(os.environ.get("SHALE_MODEL_EXAMPLES", "400" if _long else "6")),
                          stateful_step_count=40 if _long else 12, deadline=None,
                          suppress_health_check=list(HealthCheck))
"""Short in ``make test``; the long profile runs 400 sequences of up to 40 steps (``SHALE_MODEL_EXAMPLES`` sets
another count)."""


def event(what: str) -> None:
    """Count ``what`` in ``--hypothesis-show-statistics`` (nothing in a fixed walk: no hypothesis test runs it)."""
    if currently_in_test_context():
        hypothesis_event(what)


class ErasureModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="erase-model-"))
        self.clock = Clock()
        self.bucket = BucketConfig(url=f"memory://erase-model-{uuid.uuid4().hex}")
        self.store = open_bucket(self.bucket)
        state = StateMachine(self.dir / "s.db")
        self.service = MetastoreService(state, SingleNodeLog(state, clock=self.clock), clock=self.clock,
                                        compaction=CompactionConfig(blocks_per_job=[2, 3]))
        self.incarnation = "A" * 22
        self.ends: dict[int, int] = dict.fromkeys(PARTITIONS, 0)
        self.produced: dict[Record, bytes] = {}
        """Every record ingested: its key."""
        self.erased: dict[str, set[Record]] = {}
        """Per erasure planned, the records it erases."""
        self.receipts: set[str] = set()
        self.quarantined: list[tuple[BlockMeta, set[Record]]] = []
        """Damaged copies repair keeps (outside the index, for ever): each with the records it must still hold."""
        self.letters: dict[str, tuple[Record, bool]] = {}
        """Restore dead letters: each object's record, and whether a receipt made it a stub."""
        self.killed: list[tuple[ErasureRequest, set[Record]]] = []
        """Requests killed before their plan, each with the records it matched when first made: its own."""
        self.cut_off = CutOff(self.service)
        self.dlq = DeadLetterQueue(self.store, clock=self.clock)
        self.committers = {g: Committer(self.cut_off, self.dlq, g, 1) for g in GROUPS}
        """Each group's ingest driver, committing through the dead letter queue when the metastore is out of reach
        (``self.cut_off.down``)."""
        self.batches = 0
        self.patch = mock.patch.object(erase_api, "high_watermarks", self.high_watermarks)
        self.patch.start()

    def high_watermarks(self, kafka: KafkaConfig, topics: list[str]) -> list[ErasureWatermark]:
        """What Kafka answers now: each partition's end in the current incarnation."""
        return [ErasureWatermark(topic=TOPIC, partition=p, end=self.ends[p], incarnation=self.incarnation)
                for p in PARTITIONS]

    def teardown(self) -> None:
        self.patch.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(partition=st.sampled_from(PARTITIONS), keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=6),
          reachable=st.sampled_from([True, True, False]))
    def produce_and_ingest(self, partition: int, keys: list[bytes], reachable: bool = True) -> None:
        """Each group's driver writes its block and commits it (``Committer``); with the metastore out of reach
        (not ``reachable``) the commit goes to the dead letter queue in the bucket, and so does every later one of
        that driver until its queue is drained (by the driver before its next commit, or by the leader)."""
        start = self.ends[partition]
        self.cut_off.down = not reachable
        try:
            for group in GROUPS:
                block = write(self.store, group, partition, start, keys, self.incarnation)
                self.batches += 1
                outcome = self.committers[group].commit(commit_of(block, f"b{self.batches}"))
                assert outcome == ("committed" if reachable else "dead-lettered"), outcome
        finally:
            self.cut_off.down = False
        event(f"commit {'committed' if reachable else 'dead-lettered'}")
        self.ends[partition] = start + len(keys)
        for i, key in enumerate(keys):
            self.produced[(partition, start + i, self.incarnation)] = key

    @precondition(lambda self: any(self.ends.values()))
    @rule(partition=st.sampled_from(PARTITIONS), count=st.integers(1, 6))
    def repair_quarantines_a_copy(self, partition: int, count: int) -> None:
        """A damaged partition block of another generation whose records exist nowhere else as far as repair can
        tell: quarantined, its intact objects kept outside the index. It copies the partition's last ``count``
        records of this incarnation as they were produced (erased ones too: an old copy)."""
        end = self.ends[partition]
        start = max(0, end - count)
        records = [(partition, o, self.incarnation) for o in range(start, end)]
        if not records or not all(r in self.produced for r in records):
            return  # nothing produced there, or an incarnation started past the older ones' offsets (recreate_topic)
        meta = write(self.store, "partition", partition, start, [self.produced[r] for r in records],
                      self.incarnation, generation=9 + len(self.quarantined))
        write_quarantine_mark(self.store, "acme", meta.id, self.clock(), ["records: checksum"], "no other copy")
        self.quarantined.append((meta, set(records)))

    @precondition(lambda self: any(self.ends.values()))
    @rule(partition=st.sampled_from(PARTITIONS), count=st.integers(1, 3))
    def restore_dead_letters(self, partition: int, count: int) -> None:
        """A restore of the partition's last ``count`` records whose target refused them: each a dead letter in
        the bucket, key and value verbatim."""
        end = self.ends[partition]
        for offset in range(max(0, end - count), end):
            record = (partition, offset, self.incarnation)
            if record in self.produced and record not in self._pending()["backup"]:  # restored from the index
                name = restore_dead_letter(self.bucket, record, self.produced[record], f"r{len(self.letters)}")
                self.letters[name] = (record, False)

    @rule()
    def compact(self) -> None:
        """Merge jobs and erase jobs alike, run by the worker's own task code."""
        _worker(self.service, self.bucket).run(until_idle=True)

    @rule(from_zero=st.booleans())
    def recreate_topic(self, from_zero: bool) -> None:
        """The topic deleted and created again: a new incarnation, at any time (erasures waiting for their
        receipts, killed requests waiting for their retry: a record of the new incarnation is new data to them).
        Kafka starts it at offset 0 (its offsets overlap the older incarnations': compaction does not merge such
        partition blocks, ``test_a_merge_of_two_incarnations_...`` below), or past the older ones' offsets."""
        self.incarnation = chr(ord(self.incarnation[0]) + 1) * 22
        if from_zero:
            self.ends = dict.fromkeys(PARTITIONS, 0)

    @rule(key=st.sampled_from(KEYS), delay=st.sampled_from([0.0, HOUR]), killed=st.booleans(),
          with_kafka=st.booleans())
    def request_erasure(self, key: bytes, delay: float, killed: bool, with_kafka: bool) -> None:
        """With Kafka's watermarks, or without (``--no-kafka``: bounded by what the index held); either way the
        request's records are those of its key produced before it that it knows of (``_requested``)."""
        request = ErasureRequest("acme", key, topics=[TOPIC], delete_delay=delay)
        self._request(request, lambda r: self.produced[r] == key, killed, with_kafka)

    @rule(value=st.sampled_from([*map(str, CUSTOMERS), "1.0"]), delay=st.sampled_from([0.0, HOUR]),
          killed=st.booleans(), with_kafka=st.booleans())
    def request_erasure_by_column(self, value: str, delay: float, killed: bool, with_kafka: bool) -> None:
        """``shale erase --column customer.id --value V``: the request keeps the hash of the value's canonical form
        (``1.0`` is ``1``: the same request); its records are those whose typed column holds it, found in the
        partition group (a record its parser quarantined has no typed column, and is not one of them), erased in
        both groups by position. Before the index holds a typed record the column may be unknown: a clear error."""
        try:
            request = column_request(self.service, "acme", COLUMN, value, [TOPIC])
        except ColumnValueError as exc:  # no records dataset: every record so far quarantined by its parser
            assert "no records dataset" in str(exc)  # noqa: PT017 (a rule, not a test: either outcome may come)
            assert not [r for r in self._live()["partition"] if parsed(r)]
            return
        request = ErasureRequest("acme", topics=request.topics, column=request.column,
                                 value_sha256=request.value_sha256, delete_delay=delay)
        wanted = int(float(value))
        self._request(request, lambda r: parsed(r) and customer_of(r) == wanted, killed, with_kafka)

    def _request(self, request: ErasureRequest, match: Callable[[Record], bool], killed: bool,
                 with_kafka: bool) -> None:
        before = self._requested(match, with_kafka)
        if killed:
            try:
                erase(KilledBeforePlan(self.service), self.bucket, request,  # type: ignore[arg-type]
                      kafka=KAFKA if with_kafka else None, dry_run=False, by="model", wait=0)
            except ErasureNotReadyError:
                self._refused(request, with_kafka)
            except KilledError:
                if not any(r.id == request.id for r, _ in self.killed):  # else it resumed that one, killed again
                    self.killed.append((request, before))
                return
        self._erase(request, before, with_kafka)

    def _requested(self, match: Callable[[Record], bool], with_kafka: bool) -> set[Record]:
        """The records a request made now is for: those ``match`` takes that it knows of. With Kafka, every one of
        the current incarnation produced so far (its high watermarks) and of every older incarnation the index
        holds; without, those the index holds (a commit still in the dead letter queue is not there yet)."""
        pending = self._pending()["backup"]
        indexed = {r[2] for r in self.produced if r not in pending}
        return {r for r in self.produced if match(r) and (
            r not in pending or (with_kafka and (r[2] == self.incarnation or r[2] in indexed)))}

    @precondition(lambda self: bool(self.killed))
    @rule(with_kafka=st.booleans())
    def rerun_killed_request(self, with_kafka: bool) -> None:
        """The same command again: it resumes the round left ``requested``, with that round's watermarks."""
        request, before = self.killed[0]
        self._erase(request, before, with_kafka)

    def _erase(self, request: ErasureRequest, before: set[Record], with_kafka: bool) -> None:
        """Run ``request``; ``before``: its key's records produced before it. A killed round of the same key is
        resumed (its own records, from its own request)."""
        resumed = [b for r, b in self.killed if r.id == request.id]
        taken = resumed[0] if resumed else before
        try:
            report = erase(self.service, self.bucket, request, kafka=KAFKA if with_kafka else None, dry_run=False,
                           by="model", wait=0)
        except ErasureNotReadyError:
            assert not resumed  # its watermarks were indexed when it was requested: they stay so
            self._refused(request, with_kafka)
            return
        assert not report.replay
        scanned = "partition" if request.column else "backup"
        assert not (self._unindexed(with_kafka, scanned) if not resumed else taken & self._pending()[scanned])
        self.killed = [(r, b) for r, b in self.killed if r.id != request.id]  # this run resumed that round
        event("request planned")
        self.erased[report.id] = taken
        # Records an earlier round erased are found again while its rewrite is pending, not once it is done.
        earlier = set().union(*(e for i, e in self.erased.items() if i != report.id))
        assert len(taken - earlier) <= report.matches <= len(taken)

    @rule(hours=st.sampled_from([0.5, 1.1, 2.1]))
    def time_passes_and_maintenance_runs(self, hours: float) -> None:
        """The leader's tombstone collector and its bucket scan's cleaner (a refused rewrite's or merge's output,
        marked by its worker, is removed by the cleaner)."""
        self.clock.advance(hours * HOUR)
        leader = Maintenance(self.service, self.store, RetentionConfig(), delete_delay=2 * HOUR,
                             is_leader=lambda: True, term=lambda: 1, clock=self.clock, sync_delay=0,
                             erasure_delay_floor=HOUR)
        leader.run_once()  # the dead letter queue replayed, then tombstones collected
        leader.scan_bucket()

    @rule()
    def leader_replays_the_dead_letter_queue(self) -> None:
        """The leader's replay (every 15 s), with no time passing."""
        self.dlq.replay(self.service.submit_bytes)

    def _unindexed(self, with_kafka: bool, group: str) -> set[Record]:
        """The records a request made now covers that ``group`` has not indexed: its commits waiting in the dead
        letter queue, of the current incarnation or one the index holds. Without Kafka a request is bounded by
        what the index holds: none."""
        pending = self._pending()[group]
        indexed = {r[2] for r in self.produced if r not in pending}
        return {r for r in pending if with_kafka and (r[2] == self.incarnation or r[2] in indexed)}

    def _refused(self, request: ErasureRequest, with_kafka: bool) -> None:
        """A request refused for its records not indexed yet (``ErasureNotReadyError``): only then, and nothing
        of it committed."""
        assert self._unindexed(with_kafka, "partition" if request.column else "backup")
        assert not self.service.erasures(request.id_at(open_round(self.service, request)[0]))
        event("a request waits for its records to be indexed")

    def _pending(self) -> dict[str, set[Record]]:
        """Per group, the records of the commits waiting in the dead letter queue (none is ever refused here)."""
        assert not list(self.store.list(REJECTED_PREFIX))
        out: dict[str, set[Record]] = {g: set() for g in GROUPS}
        for queued in self.dlq.queued(DLQ_PREFIX):
            assert queued.command is not None
            for r in queued.command.ranges:
                out[queued.command.group].update((r.partition, o, r.incarnation) for o in range(r.start, r.end))
        return out

    @rule()
    def try_receipts(self) -> None:
        for erasure in sorted(set(self.erased) - self.receipts):
            try:
                receipt = write_receipt(self.service, self.store, erasure)
            except ReceiptNotReadyError:
                continue
            self.receipts.add(erasure)
            event("receipt written")
            self.quarantined = [(meta, kept - self.erased[erasure]) for meta, kept in self.quarantined]
            self.letters = {n: (r, stub or r in self.erased[erasure]) for n, (r, stub) in self.letters.items()}
            scanned = receipt["leftover_scan"]  # what it found before erasing outside the index, and what it erased
            assert bool(scanned["leftovers"]) == bool(scanned["erased_outside_index"])
            row = self.service.erasures(erasure)[0]  # the scan again, after the receipt: nothing
            assert scan_leftovers(self.store, "acme", Needle.of(row)).leftovers == []
            live = self._live()
            for group in ("backup", "partition"):
                assert not [r for r in self.erased[erasure] if live[group][r]], (erasure, group)

    def _live(self) -> dict[str, Counter[Record]]:
        """Per group, each record's copies in the live blocks, read back from the bucket (checked byte for byte)."""
        out: dict[str, Counter[Record]] = {"backup": Counter(), "partition": Counter()}
        for meta in self.service.tenant_blocks("acme"):
            for d in meta.datasets:
                out[meta.group].update(records_in(read_dataset(self.store, meta, d), self.produced))
        return out

    @invariant()
    def a_quarantined_copy_keeps_its_records_not_erased(self) -> None:
        """A receipt rewrites a quarantined copy without the erasure's records, keeping every other one as it was."""
        for meta, kept in self.quarantined:
            rows: Counter[Record] = Counter()
            for d in meta.datasets:
                rows.update(records_in(pq.read_table(io.BytesIO(self.store.get(block_file_key(meta, d.file)))),
                                       self.produced))
            assert set(rows) == kept, meta.id
            assert max(rows.values(), default=1) == 1

    @invariant()
    def a_dead_letter_is_verbatim_until_erased(self) -> None:
        """A dead letter of a record an erasure's receipt covers is a stub (no key, value or headers); every other
        one holds its record as it was produced."""
        for name, (record, stub) in self.letters.items():
            body = json.loads(self.store.get(name))
            if stub:
                assert (body["key"], body["value"], body["headers"]) == (None, None, []), name
            else:
                assert base64.b64decode(body["key"]) == self.produced[record], name
                assert base64.b64decode(body["value"]) == value_of(*record), name

    @invariant()
    def every_record_not_erased_is_there_once(self) -> None:
        """In each group, once, unless its commit waits in the dead letter queue (then in neither group yet)."""
        erased = set().union(*self.erased.values()) if self.erased else set()
        live, pending = self._live(), self._pending()
        assert pending["backup"] == pending["partition"]
        for group, copies in live.items():
            assert {r for r, n in copies.items() if n > 1} == set(), group
            assert set(self.produced) - erased - pending[group] - set(copies) == set(), group
            assert pending[group] & set(copies) == set(), group


ErasureModel.TestCase.settings = MODEL_SETTINGS
TestErasureModel = ErasureModel.TestCase


def _replay(*steps: tuple[str | Callable[..., None], dict[str, Any]]) -> set[str]:
    """Run the model through ``steps`` (a rule's name or a function of the model, and its arguments), checking
    the invariants after each; the erasures that got their receipt."""
    model = ErasureModel()
    try:
        for step, args in steps:
            (getattr(model, step) if isinstance(step, str) else partial(step, model))(**args)
            model.every_record_not_erased_is_there_once()
            model.a_quarantined_copy_keeps_its_records_not_erased()
            model.a_dead_letter_is_verbatim_until_erased()
    finally:
        model.teardown()
    return model.receipts


def test_a_sequence_through_every_rule_ends_in_receipts() -> None:
    """One fixed walk through every rule, so ``make test`` always passes each (the property draws the others)."""
    receipts = _replay(
        ("produce_and_ingest", {"partition": 0, "keys": [KEYS[0], KEYS[1], KEYS[2], KEYS[0]]}),
        ("produce_and_ingest", {"partition": 0, "keys": [KEYS[1], KEYS[0]]}),
        ("repair_quarantines_a_copy", {"partition": 0, "count": 6}),
        ("restore_dead_letters", {"partition": 0, "count": 3}),
        ("request_erasure", {"key": KEYS[0], "delay": HOUR, "killed": True, "with_kafka": True}),
        ("compact", {}),
        ("recreate_topic", {"from_zero": False}),  # before the retry: new data to the killed request
        ("produce_and_ingest", {"partition": 1, "keys": [KEYS[0], KEYS[2]]}),
        ("rerun_killed_request", {"with_kafka": False}),
        ("request_erasure", {"key": KEYS[0], "delay": 0.0, "killed": False, "with_kafka": True}),  # the next round
        ("request_erasure", {"key": KEYS[2], "delay": 0.0, "killed": False, "with_kafka": False}),  # overlapping
        ("compact", {}),
        ("time_passes_and_maintenance_runs", {"hours": 1.1}),
        ("try_receipts", {}),
        ("time_passes_and_maintenance_runs", {"hours": 2.1}),
        ("try_receipts", {}),
        ("produce_and_ingest", {"partition": 1, "keys": [KEYS[1]] * 5, "reachable": False}),  # an outage
        ("produce_and_ingest", {"partition": 0, "keys": [KEYS[1]] * 4}),  # the driver drains its queue first
        ("request_erasure_by_column", {"value": "1.0", "delay": 0.0, "killed": True, "with_kafka": True}),
        ("produce_and_ingest", {"partition": 0, "keys": [KEYS[2]] * 3, "reachable": False}),
        ("leader_replays_the_dead_letter_queue", {}),
        ("rerun_killed_request", {"with_kafka": True}),
        ("request_erasure_by_column", {"value": "2", "delay": 0.0, "killed": False, "with_kafka": False}),
        ("request_erasure", {"key": KEYS[1], "delay": 0.0, "killed": False, "with_kafka": True}),  # overlapping
        ("compact", {}),
        ("time_passes_and_maintenance_runs", {"hours": 2.1}),
        ("try_receipts", {}))
    assert len(receipts) == 6


def test_a_merge_of_two_incarnations_keeps_the_other_ones_record_at_the_erased_offset() -> None:
    """Found by the model: a partition block merged from two incarnations whose offsets overlap (the topic
    recreated, its offsets from 0 again), then an erasure of the older incarnation's record at offset 0: a merged
    partition dataset does not name its rows' incarnations (``shale.compactor.merge._keeps_incarnations``: backup
    only) and ``erased_rows`` removed the ambiguous row, the newer incarnation's record at the same offset with
    it, whatever its key. Then ``erased_rows`` kept a row of unknown incarnation unless every incarnation whose
    ranges cover it is wanted: nothing lost, but the erased record's partition row stayed and the receipt waited
    for ever. Now compaction does not merge such partition blocks (``shale.metastore.rules.compaction_service.apart``):
    each incarnation's rows are told by their block's ranges, and the receipt is written."""
    receipts = _replay(("produce_and_ingest", {"partition": 0, "keys": [KEYS[0], KEYS[0]]}),
                       ("recreate_topic", {"from_zero": True}),
                       ("produce_and_ingest", {"partition": 0, "keys": [KEYS[1]]}),
                       ("produce_and_ingest", {"partition": 0, "keys": [KEYS[1], KEYS[0]]}),
                       ("compact", {}),
                       ("request_erasure", {"key": KEYS[0], "delay": 0.0, "killed": False, "with_kafka": True}),
                       ("compact", {}),
                       ("time_passes_and_maintenance_runs", {"hours": 2.1}),
                       ("try_receipts", {}))
    assert len(receipts) == 1


def test_a_request_without_kafka_gets_its_receipt_after_a_later_record_of_the_key() -> None:
    """Found by the model: a request made without Kafka (``--no-kafka``) plans the key's records backed up then;
    a record of the key ingested after the plan is not rewritten (no position of the erasure), yet the receipt's
    final scan read every record of the key as the erasure's (no watermark bounded it) and refused the receipt
    for ever (a ShaleError, not a wait). Now the request is bounded by what the index held when it was made (each
    incarnation's highest indexed end; none: every record is later)."""
    receipts = _replay(("request_erasure", {"key": KEYS[1], "delay": 0.0, "killed": False, "with_kafka": False}),
                       ("produce_and_ingest", {"partition": 0, "keys": [KEYS[1]]}),
                       ("try_receipts", {}),
                       ("produce_and_ingest", {"partition": 0, "keys": [KEYS[1], KEYS[0]]}),
                       ("request_erasure", {"key": KEYS[1], "delay": 0.0, "killed": False, "with_kafka": False}),
                       ("produce_and_ingest", {"partition": 0, "keys": [KEYS[1]]}),
                       ("compact", {}),
                       ("time_passes_and_maintenance_runs", {"hours": 2.1}),
                       ("try_receipts", {}))
    assert len(receipts) == 2


def test_a_topic_recreated_after_a_request_gets_its_receipt() -> None:
    """Found by the model: a request, the topic recreated before its receipt, then a record of the key produced in
    the new incarnation: it has no position and is not rewritten, yet the receipt's final scan took it as the
    erasure's (``Watermarks`` took an incarnation the watermarks do not name as older) and refused the receipt
    for ever (a ShaleError, not a wait). The same with a killed request run again after the recreation. Now a
    request names every incarnation it knew (Kafka's and the index's): one it does not name is newer."""
    receipts = _replay(("request_erasure", {"key": KEYS[0], "delay": 0.0, "killed": False, "with_kafka": True}),
                       ("recreate_topic", {"from_zero": True}),
                       ("produce_and_ingest", {"partition": 0, "keys": [KEYS[0]]}),
                       ("try_receipts", {}),
                       ("produce_and_ingest", {"partition": 1, "keys": [KEYS[2], KEYS[0]]}),
                       ("request_erasure", {"key": KEYS[2], "delay": 0.0, "killed": True, "with_kafka": True}),
                       ("recreate_topic", {"from_zero": True}),
                       ("produce_and_ingest", {"partition": 1, "keys": [KEYS[2]]}),
                       ("rerun_killed_request", {"with_kafka": True}),
                       ("compact", {}),
                       ("time_passes_and_maintenance_runs", {"hours": 2.1}),
                       ("try_receipts", {}))
    assert len(receipts) == 2


STRANDING = (("produce_and_ingest", {"partition": 0, "keys": [KEYS[0], KEYS[1]]}),
             ("produce_and_ingest", {"partition": 0, "keys": [KEYS[0], KEYS[0]], "reachable": False}),
             ("request_erasure", {"key": KEYS[0], "delay": 0.0, "killed": False, "with_kafka": True}))
"""A batch of the key dead-lettered, then the request, while the batch's commit waits in the dead letter queue."""


def test_a_request_waits_until_its_records_dead_lettered_before_it_are_indexed() -> None:
    """Found by the model (a known bug until now): the metastore out of reach at an ingest commit, so the batch
    holding two records of the key waited in the dead letter queue; an erasure of the key requested with Kafka's
    watermarks (they cover the batch: it was produced before) scanned the index, where the batch was not yet; once
    the queue was replayed the batch entered the index with no position of the erasure, so its records were never
    rewritten and the receipt's final scan refused the receipt for ever. Any record below the watermarks ingested
    after the scan (an ingest lag) did the same. Now the request waits until the scanned group has indexed every
    record below its watermarks (``await_indexed``): refused meanwhile with nothing committed (the model checks
    it), made once the queue is replayed, and its receipt covers the batch. The same with a killed request."""
    receipts = _replay(*STRANDING,
                       ("leader_replays_the_dead_letter_queue", {}),
                       ("request_erasure", {"key": KEYS[0], "delay": 0.0, "killed": False, "with_kafka": True}),
                       ("produce_and_ingest", {"partition": 1, "keys": [KEYS[1]], "reachable": False}),
                       ("request_erasure", {"key": KEYS[1], "delay": 0.0, "killed": True, "with_kafka": True}),
                       ("time_passes_and_maintenance_runs", {"hours": 0.5}),  # the leader replays the queue
                       ("request_erasure", {"key": KEYS[1], "delay": 0.0, "killed": True, "with_kafka": True}),
                       ("rerun_killed_request", {"with_kafka": True}),
                       ("compact", {}),
                       ("time_passes_and_maintenance_runs", {"hours": 2.1}),
                       ("try_receipts", {}))
    assert len(receipts) == 2


def test_a_request_without_kafka_is_bounded_by_what_its_scanned_group_indexed() -> None:
    """``--no-kafka`` bounds the request by the scanned group's highest indexed end: a batch dead-lettered is
    not the request's, so it does not wait (and the next round erases the batch once indexed)."""
    receipts = _replay(*STRANDING[:2],
                       ("request_erasure", {"key": KEYS[0], "delay": 0.0, "killed": False, "with_kafka": False}),
                       ("leader_replays_the_dead_letter_queue", {}),
                       ("request_erasure", {"key": KEYS[0], "delay": 0.0, "killed": False, "with_kafka": False}),
                       ("compact", {}),
                       ("time_passes_and_maintenance_runs", {"hours": 2.1}),
                       ("try_receipts", {}))
    assert len(receipts) == 2


def test_a_column_erasure_before_any_typed_record_is_refused_then_made() -> None:
    """Found by the model's long run (a fault of the model's, not Shale's): the only record indexed is one its
    parser quarantined, so no records dataset has the column and the request is a clear error, nothing
    committed; once a typed record is indexed the same request is made and gets its receipt."""
    receipts = _replay(("produce_and_ingest", {"partition": 0, "keys": [KEYS[0]], "reachable": True}),
                       ("request_erasure_by_column", {"value": "0", "delay": 0.0, "killed": False,
                                                      "with_kafka": False}),
                       ("produce_and_ingest", {"partition": 0, "keys": [KEYS[1]] * 3}),
                       ("request_erasure_by_column", {"value": "0", "delay": 0.0, "killed": False,
                                                      "with_kafka": False}),
                       ("compact", {}),
                       ("time_passes_and_maintenance_runs", {"hours": 2.1}),
                       ("try_receipts", {}))
    assert len(receipts) == 1
