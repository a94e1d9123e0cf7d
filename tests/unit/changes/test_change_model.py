"""The change-table model (docs/design/change-tables.md, "Exactness"): a hypothesis state machine producing any
sequence of inserts, updates and tombstones over any keys and partitions of an upsert topic, written by the real
chunk writer and json parser (a tombstone is quarantined: it has no value), committed to the real metastore
service, merged by the compaction worker's own task code, and the topic recreated (a new incarnation); after every
step, the latest view read through ``shale.query.read_latest`` equals a dictionary replayed from the produced
records, and so does the view as of any earlier time. An erasure of a key removes it from the view too.

``make test`` runs a short profile; ``HYPOTHESIS_PROFILE=nightly`` (or ``SHALE_HYPOTHESIS_PROFILE=long``) a long one.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any
from unittest import mock

import pyarrow as pa
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from tests.factories import BASE_MS, Clock
from tests.unit.erase.test_erase import _worker

from shale.block.schemas import BACKUP_SCHEMA
from shale.config import BucketConfig, CompactionConfig, IngestConfig, KafkaConfig, ParserRule
from shale.encoder.chunks import Chunk, GroupSpec, write_chunk
from shale.erase import ErasureRequest, erase
from shale.erase import api as erase_api
from shale.metastore import AddBlocks, ErasureWatermark, MetastoreService, SingleNodeLog, StateMachine, read_only_index
from shale.objstore import open_bucket
from shale.query import Query, read_latest
from shale.query.latest import LatestReads

TOPIC = "customers"
PARTITIONS = (0, 1, 2)
KEYS = (b"k0", b"k1", b"k1\n", b"k2")
RULES = [ParserRule(topic_pattern=TOPIC, parser="json", table="upsert",
                    options={"time_field": "ts", "time_format": "epoch_ms", "fields": ["v"]})]
INGEST = IngestConfig(topics=[TOPIC], default_tenant="acme", parsers=RULES)
KAFKA = KafkaConfig(bootstrap_servers="127.0.0.1:1")

_long = os.environ.get("SHALE_HYPOTHESIS_PROFILE") == "long" or os.environ.get("HYPOTHESIS_PROFILE") == "nightly"
MODEL_SETTINGS = settings(max_examples=int(os.environ.get("SHALE_MODEL_EXAMPLES", "200" if _long else "12")),
                          stateful_step_count=30 if _long else 12, deadline=None,
                          suppress_health_check=list(HealthCheck))

Change = tuple[bytes, int | None]
"""A record: its key and its value (None: a tombstone)."""


def _records(partition: int, start: int, changes: list[Change], first_ms: int) -> pa.Table:
    count = len(changes)
    ms = [first_ms + i for i in range(count)]
    return pa.table({
        "topic": [TOPIC] * count,
        "partition": pa.array([partition] * count, pa.int32()),
        "offset": pa.array(range(start, start + count), pa.int64()),
        "timestamp": pa.array(ms, pa.timestamp("ms", tz="UTC")),
        "timestamp_type": pa.array([0] * count, pa.int8()),
        "key": pa.array([k for k, _ in changes], pa.binary()),
        "value": pa.array([None if v is None else json.dumps({"ts": t, "v": str(v)}).encode()
                           for (_, v), t in zip(changes, ms, strict=True)], pa.binary()),
        "headers": pa.array([[]] * count, BACKUP_SCHEMA.field("headers").type),
    }, schema=BACKUP_SCHEMA)


class ChangeTableModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="change-model-"))
        self.clock = Clock()
        self.bucket = BucketConfig(url=f"memory://change-model-{uuid.uuid4().hex}")
        self.store = open_bucket(self.bucket)
        self._open()
        self.specs = [GroupSpec(group, 1, self.bucket, INGEST) for group in ("backup", "partition")]
        """Both groups, as ingestion writes them: an erasure finds a key's records in the backup group."""
        self.incarnation = "A" * 22
        self.ends = dict.fromkeys(PARTITIONS, 0)
        self.produced: list[tuple[int, bytes, int | None]] = []
        """Every record in produce order: its Kafka time (ms), key and value."""
        self.reads = LatestReads()
        """This process's earlier latest reads: a read through them reads only what was stored since."""
        self.sent = 0
        """Records produced so far: each gets the next millisecond (erased ones included: time never goes back)."""

    def _open(self) -> None:
        self.state = StateMachine(self.dir / "s.db")
        self.service = MetastoreService(self.state, SingleNodeLog(self.state, clock=self.clock), clock=self.clock,
                                        compaction=CompactionConfig(blocks_per_job=[2, 3]))

    def teardown(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(partition=st.sampled_from(PARTITIONS),
          changes=st.lists(st.tuples(st.sampled_from(KEYS), st.one_of(st.none(), st.integers(0, 9))), min_size=1,
                           max_size=6))
    def produce_and_ingest(self, partition: int, changes: list[Change]) -> None:
        start, first_ms = self.ends[partition], BASE_MS + self.sent
        table = _records(partition, start, changes, first_ms)
        chunk = Chunk(TOPIC, partition, self.incarnation, start, start + len(changes), first_ms + 10_000)
        blocks = [b for spec in self.specs for b in write_chunk(spec, self.store, table, chunk).blocks]
        self.service.submit(AddBlocks(blocks=blocks)).raise_for_rejection()
        self.ends[partition] = start + len(changes)
        self.produced += [(first_ms + i, k, v) for i, (k, v) in enumerate(changes)]
        self.sent += len(changes)

    @rule()
    def compact(self) -> None:
        _worker(self.service, self.bucket).run(until_idle=True)

    @rule()
    def compaction_worker_killed_before_reporting(self) -> None:
        """A worker killed (kill -9 at ``compaction.before-report``) after its merges wrote their blocks, before it
        reported them: the blocks are orphans no index names, and once the jobs' leases expire the next worker merges
        their sources again."""
        worker = _worker(self.service, self.bucket)
        worker.step()
        for running in worker.running.values():
            running.future.result()
        self.clock.advance(CompactionConfig().lease_duration + 1)

    @rule()
    def restart(self) -> None:
        """The metastore restarted from its files, and the reader a new process: no earlier read is kept."""
        self.state.close()
        self._open()
        self.reads = LatestReads()

    @rule()
    def recreate_topic(self) -> None:
        """A new incarnation. It starts past the older ones' offsets: a merge of two incarnations whose offsets
        overlap cannot tell their rows apart (the view then refuses to guess, ``test_change_view``)."""
        self.incarnation = chr(ord(self.incarnation[0]) + 1) * 22

    @rule(key=st.sampled_from(KEYS))
    def erase_key(self, key: bytes) -> None:
        """``shale erase`` of one key, its rewrite run by the compaction worker: gone from the history, gone from the
        view (a later record of the key brings it back: an erasure removes what was stored before it)."""
        marks = [ErasureWatermark(topic=TOPIC, partition=p, end=self.ends[p], incarnation=self.incarnation)
                 for p in PARTITIONS]
        with mock.patch.object(erase_api, "high_watermarks", return_value=marks):
            erase(self.service, self.bucket, ErasureRequest("acme", key, topics=[TOPIC]), kafka=KAFKA,
                  dry_run=False, by="model")
        _worker(self.service, self.bucket).run(until_idle=True)
        self.produced = [(t, k, v) for t, k, v in self.produced if k != key]

    def _read(self, as_of: int | None = None, columns: list[str] | None = None,
              reads: LatestReads | None = None) -> tuple[dict[bytes, bytes], Query, list[str]]:
        query = Query("acme", 0, 1, f'{{topic="{TOPIC}"}}', columns=columns)
        view, stats = read_latest(query, read_only_index(self.state.path), self.store, RULES, as_of, reads, "model")
        assert stats.withheld == 0
        if columns:
            assert view.column_names == columns
            return {k: v.encode() for k, v in zip(view.column("key").to_pylist(), view.column("v").to_pylist(),
                                                  strict=True)}, query, view.column_names
        return {k: json.loads(v)["v"].encode() for k, v in zip(view.column("key").to_pylist(),
                                                               view.column("value").to_pylist(), strict=True)}, query, \
            view.column_names

    def _view(self, as_of: int | None = None) -> dict[bytes, bytes]:
        """The view read in full and, now, through this process's earlier reads (only the blocks stored since,
        then none at all when nothing was); naming columns reads only those the view needs: the same rows."""
        rows, _, names = self._read(as_of)
        if as_of is None:
            assert self._read(reads=self.reads)[0] == rows
            again, query, _ = self._read(reads=self.reads)
            assert (again, query.stats.objects) == (rows, 0)
        if "v" in names:  # nothing parsed stored yet: no column to name
            for reads in (None, self.reads):
                assert self._read(as_of, ["key", "v"], reads)[0] == rows
        return rows

    def _replay(self, as_of: int | None = None) -> dict[bytes, bytes]:
        table: dict[bytes, bytes] = {}
        for ms, key, value in self.produced:
            if as_of is not None and ms > as_of:
                break
            if value is None:
                table.pop(key, None)
            else:
                table[key] = str(value).encode()
        return table

    @invariant()
    def the_view_is_the_replayed_dictionary(self) -> None:
        assert self._view() == self._replay()

    @rule(data=st.data())
    def the_view_as_of_an_earlier_time(self, data: Any) -> None:
        if self.produced:
            as_of = data.draw(st.sampled_from([ms for ms, _, _ in self.produced]))
            assert self._view(as_of) == self._replay(as_of)


ChangeTableModel.TestCase.settings = MODEL_SETTINGS
test_change_table_model = ChangeTableModel.TestCase


def _run(*steps: tuple[str, dict[str, Any]]) -> None:
    """One sequence of the model's rules, its invariant checked after each (the model's found or named inputs)."""
    model = ChangeTableModel()
    try:
        model.the_view_is_the_replayed_dictionary()
        for name, arguments in steps:
            getattr(model, name)(**arguments)
            model.the_view_is_the_replayed_dictionary()
    finally:
        model.teardown()


def test_a_tombstone_deletes_across_a_compaction_and_a_later_partition() -> None:
    """A tombstone is quarantined by the json parser, so the view reads the quarantine dataset too (a mutation
    dropping it was found by the model with these steps)."""
    _run(("produce_and_ingest", {"partition": 0, "changes": [(b"k0", 1), (b"k0", None)]}),
         ("compact", {}),
         ("produce_and_ingest", {"partition": 1, "changes": [(b"k1\n", None), (b"k1\n", 7), (b"k1\n", None)]}),
         ("produce_and_ingest", {"partition": 2, "changes": [(b"k0", 3)]}),
         ("produce_and_ingest", {"partition": 0, "changes": [(b"k0", None), (b"k1", 2)]}),
         ("compact", {}))


def test_a_recreated_topic_and_an_erased_key() -> None:
    _run(("produce_and_ingest", {"partition": 0, "changes": [(b"k0", 1), (b"k1", 2)]}),
         ("recreate_topic", {}),
         ("produce_and_ingest", {"partition": 0, "changes": [(b"k0", 5)]}),
         ("produce_and_ingest", {"partition": 1, "changes": [(b"k1", 6), (b"k2", None)]}),
         ("compact", {}),
         ("erase_key", {"key": b"k1"}),
         ("produce_and_ingest", {"partition": 1, "changes": [(b"k2", 4)]}),
         ("erase_key", {"key": b"k0"}))


def test_records_after_an_erasure_are_later_than_every_one_before() -> None:
    """Found by the nightly model (a fault of the model, not of the view): its clock counted the records still
    stored, so records produced after an erasure took the times of older ones and the replay's order was wrong."""
    _run(("produce_and_ingest", {"partition": 0, "changes": [(b"k0", None), (b"k2", 6), (b"k0", 5), (b"k2", None)]}),
         ("produce_and_ingest", {"partition": 1, "changes": [(b"k0", None), (b"k1", 7), (b"k2", 7)]}),
         ("erase_key", {"key": b"k0"}),
         ("produce_and_ingest", {"partition": 2, "changes": [(b"k2", 3), (b"k0", None)]}))


def test_a_compaction_killed_before_reporting_leaves_an_orphan_the_view_never_reads() -> None:
    """The killed worker's merge wrote a block no index names; after its lease the next worker merges the same
    sources again, and through a metastore restart the view is the replay (each step checked by ``_run``'s
    invariant)."""
    model = ChangeTableModel()
    try:
        for partition, changes in ((0, [(b"k0", 1), (b"k1", 2)]), (0, [(b"k0", None)]), (1, [(b"k1", 3)])):
            model.produce_and_ingest(partition, changes)
        model.compaction_worker_killed_before_reporting()
        indexed = {m.id for m in model.service.tenant_blocks("acme")}
        written = {o.key.split("/")[-2] for o in model.store.list() if o.key.endswith("/meta.json")}
        assert written - indexed  # the orphan
        model.the_view_is_the_replayed_dictionary()
        model.restart()
        model.compact()
        assert {m.level for m in model.service.tenant_blocks("acme")} > {0}  # merged again, by the next worker
        model.the_view_is_the_replayed_dictionary()
    finally:
        model.teardown()
