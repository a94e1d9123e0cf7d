"""A stateful, model-based test of the metastore's state machine (issue 26).

Hypothesis drives the real state machine, in-process (``MetastoreService`` over a log that applies every command
through its encoded bytes, as a replica does), with random sequences of ingest commits (both groups, two
generations, recreated topic incarnations, overlaps, gaps, stale incarnations, replays), acknowledged offset
losses, compaction polls and reports (good outputs, and bad ones that must be refused), retention, generation
switches with and without retire, repairs (rebuild, merge, quarantine), tombstone deletion, and snapshot/restore
of the index. ``tests/unit/metastore/model.py`` is the reference: which records each block holds, which records are
committed, which blocks are live. After every step:

* the index's live blocks are exactly the model's (nothing live is ever removed, nothing dead comes back);
* every committed record is held by exactly one live block per (group, generation);
* committed offsets tile: every batch the model accepts starts at its incarnation's committed end, the others are
  refused, and the index's committed ends and ended incarnations are the model's;
* the index passes ``PRAGMA integrity_check``;
* a query of the whole time range (and, as a rule, of random ranges and selectors) returns blocks that hold each
  committed record in it exactly once per generation, and the query planner reads each partition-group record
  exactly once in its active generation and never in another.

At teardown a fresh replica applies the same log and must reach the same state hash.
"""

from __future__ import annotations

import copy
import itertools
import shutil
import sqlite3
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from tests.factories import BASE_MS, Clock
from tests.unit.metastore.model import (
    HOUR_MS,
    LANES,
    PARTITIONS,
    TENANT,
    TOPICS,
    Block,
    Held,
    Rec,
    active_generation,
    build_meta,
    hour_values,
    incarnation,
    rtime,
    window,
)

from shale.block import BlockMeta, KafkaRange, deterministic_block_id
from shale.compaction.messages import JobUpdate, PollRequest
from shale.compaction.scheduler import owns
from shale.compaction.state import CompactionState
from shale.compactor.merge import merge_ranges, output_id
from shale.config import CompactionConfig
from shale.index import PARTITION_WINDOW_MS, parse_matchers
from shale.metastore import MetastoreService, SingleNodeLog, StateMachine, encode
from shale.metastore.commands import (
    AcknowledgeOffsetLoss,
    AddBlocks,
    Command,
    CommitIngestBatch,
    DeleteTombstones,
    OffsetRange,
    PartitionKey,
    QuarantineBlocks,
    ReplaceBlocks,
    Result,
    SetActiveGeneration,
    TruncateIndex,
)
from shale.metastore.fsm import Entry
from shale.query.plan import plan_query

SCRATCH = "/dev/shm" if Path("/dev/shm").is_dir() else None  # memory: every step commits (fsync)
Lane = tuple[str, int, str, int]
"""(group, generation, topic, partition): one committed-offsets row."""


INGEST_ARGS = {
    "lane": st.sampled_from(LANES),
    "chunks": st.lists(st.tuples(st.sampled_from(TOPICS), st.sampled_from(PARTITIONS), st.integers(1, 4),
                                 st.sampled_from([False, False, False, True])),
                       min_size=1, max_size=2, unique_by=lambda c: c[:2]),
    "variant": st.sampled_from(["ok", "ok", "overlap", "gap", "stale"]),
    "first": st.sampled_from([0, 0, 3]),
}
"""A batch: its group and generation; per topic-partition the offsets read and whether none held a readable record
(an empty block records the range); the variant of the first range; where a new incarnation's offsets start."""
REPORTS = st.sampled_from(["", "", "", "", "lose-range", "merge-incarnations", "parents", "lineage", "wrong-level",
                           "wrong-generation", "reuse-id", "more-rows", "no-rows"])
"""A report's output: good (""), or bad in one way (each must be refused)."""


def accepted(result: Result) -> dict[str, Any]:
    assert result.ok, result
    return result.data


class RecordingLog(SingleNodeLog):
    """The single-node log, applying each command through its bytes (JSON and msgpack by turns) and keeping the
    entries, so that a second replica can apply the same log at the end."""

    def __init__(self, state: StateMachine, clock: Clock) -> None:
        super().__init__(state, clock)
        self.entries: list[tuple[Entry, bytes]] = []

    def propose_command(self, command: Command, timeout: float = 30.0) -> Result:
        index = self.state.applied()[0] + 1
        entry, data = Entry(index, 1, int(self.clock() * 1000)), encode(command, ("json", "msgpack")[index % 2])
        self.entries.append((entry, data))
        return self.state.apply(entry, data)


@settings(stateful_step_count=40)
class MetastoreModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="fsm-model-", dir=SCRATCH))
        self.clock = Clock(BASE_MS / 1000 + 600)
        self.state = StateMachine(self.dir / "state.db")
        self.log = RecordingLog(self.state, self.clock)
        config = CompactionConfig(blocks_per_job=[2, 3], max_level=3, lease_duration=60, max_age=900)
        self.service = MetastoreService(self.state, self.log, compaction=config, clock=self.clock)
        self.kafka = dict.fromkeys(TOPICS, 0)  # each topic's current incarnation in Kafka
        self.m: dict[str, Any] = {
            "committed": {},  # Lane -> (incarnation, end)
            "past": {},  # Lane -> {incarnation: end}
            "ranges": {},  # (Lane, incarnation) -> [(start, end, "batch" | "loss")], in commit order
            "batches": [],  # accepted CommitIngestBatch commands
            "live": {},  # block id -> Block
            "expected": set(),  # Held records the live blocks must hold, each exactly once
            "tombstoned": {},  # block id -> Block (removed with a tombstone, tombstone not yet deleted)
            "rules": [],  # generation switches, oldest first
            "jobs": {},  # job name -> (token, sources) as assigned to us
            "reported": [],  # success reports applied
        }
        self.snapshot: tuple[Path, dict[str, Any], int, str] | None = None
        self.seq = 0

    def teardown(self) -> None:
        try:
            replica = StateMachine(self.dir / "replica.db")
            for entry, data in self.log.entries:
                replica.apply(entry, data)
            assert replica.state_hash() == self.state.state_hash(), "a replica applying the same log differs"
            replica.close()
            self.state.close()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    # -- helpers ----------------------------------------------------------------------------------

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    def next_id(self, key: str) -> str:
        self.seq += 1
        return deterministic_block_id(self.now_ms(), f"{key}/{self.seq}")

    def submit(self, command: Command) -> Result:
        return self.service.submit(command)

    def remove(self, block_id: str, *, tombstone: bool = True, keep_records: bool = False) -> None:
        block = self.m["live"].pop(block_id)
        if tombstone:
            self.m["tombstoned"][block_id] = block
        if not keep_records:
            self.m["expected"] -= block.held()

    def add(self, block: Block) -> None:
        self.m["live"][block.meta.id] = block

    # -- ingest -----------------------------------------------------------------------------------

    @rule(**INGEST_ARGS)
    def ingest(self, lane: tuple[str, int, str], chunks: list[tuple[str, int, int, bool]], variant: str,
               first: int) -> None:
        """One batch of several topic-partitions. The first chunk carries the variant: continuing at the committed
        end (ok), one offset early (overlap), one late (gap), or read from an incarnation that has ended."""
        group, generation, writer = lane
        ranges, blocks, plan, refusal = [], [], [], None
        for i, (topic, partition, count, empty) in enumerate(chunks):
            key: Lane = (group, generation, topic, partition)
            inc = incarnation(self.kafka[topic])
            current = self.m["committed"].get(key)
            past = self.m["past"].get(key, {})
            if i == 0 and variant == "stale" and past:
                inc = sorted(past)[0]
            if inc in past:
                start = past[inc]
                refusal = refusal or "stale-incarnation"
            elif current is None or current[0] != inc:
                start = first  # the first batch of an incarnation starts where Kafka's log starts
            else:
                start = current[1]
                shift = {"overlap": -1, "gap": 1}.get(variant, 0) if i == 0 else 0
                start += shift
                if shift:
                    refusal = refusal or ("offset-overlap" if shift < 0 else "offset-gap")
            end = start + count
            recs = [] if empty else [(topic, partition, inc, o) for o in range(start, end)]
            ranges.append(OffsetRange(topic=topic, partition=partition, start=start, end=end, incarnation=inc,
                                      stored=len(recs)))
            kafka = [KafkaRange(topic=topic, partition=partition, start=start, end=end, incarnation=inc)]
            parts: dict[str, list[Rec]] = {}
            for r in recs:  # the partition group stores one block per hour of event time, the backup group one
                parts.setdefault(str(hour_values(rtime(r))) if group == "partition" else "", []).append(r)
            for pv_key, held in (parts or {"": []}).items():
                pv = hour_values(rtime(held[0])) if pv_key else {}
                block_id = self.next_id(f"{group}/{generation}/{topic}/{inc}/{partition}/{start}/{end}/{pv_key}")
                blocks.append(Block(build_meta(block_id, group, generation, 0, kafka, held, partition_values=pv),
                                    frozenset(held)))
            plan.append((key, inc, start, end, recs))
        command = CommitIngestBatch(group=group, generation=generation, writer=writer, ranges=ranges,  # type: ignore[arg-type]
                                    blocks=[b.meta for b in blocks])
        result = self.submit(command)
        assert result.ok == (refusal is None), (refusal, result)
        if refusal is not None:
            assert result.reason == refusal, result
            return
        assert result.data["replay"] is False
        for key, inc, start, end, recs in plan:
            current = self.m["committed"].get(key)
            if current is not None and current[0] != inc:
                self.m["past"].setdefault(key, {})[current[0]] = current[1]
            self.m["committed"][key] = (inc, end)
            self.m["ranges"].setdefault((key, inc), []).append((start, end, "batch"))
            self.m["expected"] |= {(group, generation, r) for r in recs}
        for b in blocks:
            self.add(b)
        self.m["batches"].append(command)

    # Ingest, polls and reports are the usual traffic: each has more than one rule, so hypothesis draws them more often.
    @rule(lane=INGEST_ARGS["lane"], chunks=INGEST_ARGS["chunks"], variant=INGEST_ARGS["variant"],
          first=INGEST_ARGS["first"])
    def ingest_more(self, lane: tuple[str, int, str], chunks: list[tuple[str, int, int, bool]], variant: str,
                    first: int) -> None:
        self.ingest(lane, chunks, variant, first)

    @precondition(lambda self: any(k[:2] == ("partition", 1) for k in self.m["committed"]))
    @rule(data=st.data())
    def reprocess_catch_up(self, data: st.DataObject) -> None:
        """Reprocessing writes generation 2 of a topic-partition up to where generation 1 is (so that a switch to it
        with retire has something to retire)."""
        key = data.draw(st.sampled_from(sorted(k for k in self.m["committed"] if k[:2] == ("partition", 1))))
        inc, end = self.m["committed"][key]
        mine = self.m["committed"].get(("partition", 2, *key[2:]))
        start = mine[1] if mine is not None and mine[0] == inc else self.m["ranges"][(key, inc)][0][0]
        if incarnation(self.kafka[key[2]]) == inc and end > start:
            self.ingest(LANES[2], [(key[2], key[3], end - start, False)], "ok", start)

    @precondition(lambda self: self.m["batches"])
    @rule(data=st.data())
    def replay_batch(self, data: st.DataObject) -> None:
        """A writer's retry of a batch committed before: a no-op while its incarnations are current, refused once
        one has ended."""
        command: CommitIngestBatch = data.draw(st.sampled_from(self.m["batches"]))
        current = all(self.m["committed"][(command.group, command.generation, r.topic, r.partition)][0]
                      == r.incarnation for r in command.ranges)
        result = self.submit(command)
        assert result.ok == current, result
        if current:
            assert result.data["replay"] is True

    @rule(topic=st.sampled_from(TOPICS))
    def recreate_topic(self, topic: str) -> None:
        """``delete_topics`` and create again: a new topic id; offsets start again."""
        self.kafka[topic] += 1

    @precondition(lambda self: self.m["committed"])
    @rule(data=st.data(), lost=st.integers(1, 3), moved=st.booleans())
    def acknowledge_loss(self, data: st.DataObject, lost: int, moved: bool) -> None:
        key: Lane = data.draw(st.sampled_from(sorted(self.m["committed"])))
        inc, end = self.m["committed"][key]
        start = end + 1 if moved else end
        command = AcknowledgeOffsetLoss(group=key[0], generation=key[1], topic=key[2], partition=key[3],
                                        incarnation=inc, start=start, end=start + lost)
        result = self.submit(command)
        assert result.ok == (not moved), result
        if moved:
            assert result.reason == "offset-moved"
            return
        self.m["committed"][key] = (inc, start + lost)
        self.m["ranges"].setdefault((key, inc), []).append((start, start + lost, "loss"))
        again = self.submit(command)
        assert accepted(again)["replay"] is True

    # -- compaction -------------------------------------------------------------------------------

    @rule(capacity=st.integers(0, 3))
    def poll(self, capacity: int) -> None:
        response = self.service.poll_compaction(PollRequest(worker="w", capacity=capacity))
        for job in response.assigned:
            ids = [s.id for s in job.sources]
            assert all(i in self.m["live"] for i in ids), "a job was assigned sources that are not live"
            assert len({(s.group, s.generation, s.level) for s in job.sources}) == 1
            self.m["jobs"][job.job] = (job.token, ids)

    def _output(self, name: str, token: int, sources: list[Block], bad: str) -> tuple[BlockMeta, frozenset[Rec]]:
        metas = [s.meta for s in sources]
        records = frozenset().union(*(s.records for s in sources))
        head = metas[0]
        kafka = merge_ranges([r for m in metas for r in m.kafka])
        lineage = sorted({x for m in metas for x in m.compaction.sources})
        parents = sorted(m.id for m in metas)
        level, generation = head.level + 1, head.generation
        if bad == "lose-range" and len(kafka) > 1:
            kafka = kafka[1:]
        elif bad == "merge-incarnations":  # offsets of two incarnations told as one
            kafka = merge_ranges([r.model_copy(update={"incarnation": ""}) for r in kafka])
        elif bad == "parents":
            parents = parents[1:]
        elif bad == "lineage":
            lineage = lineage[1:]
        elif bad == "wrong-level":
            level += 1
        elif bad == "wrong-generation":
            generation = 3
        common = {k: v for k, v in head.partition_values.items() if all(m.partition_values.get(k) == v for m in metas)}
        block_id = head.id if bad == "reuse-id" else output_id(metas, name, token)
        meta = build_meta(block_id, head.group, generation, level, kafka, records, partition_values=common,
                          sources=lineage, parents=parents)
        if bad in ("more-rows", "no-rows") and meta.datasets:
            rows = (lambda d: d.rows + 1) if bad == "more-rows" else (lambda d: 0)
            meta = meta.model_copy(update={"datasets": [d.model_copy(update={"rows": rows(d)}) for d in meta.datasets]})
        return meta, records

    @rule(capacity=st.integers(1, 3))
    def poll_more(self, capacity: int) -> None:
        self.poll(capacity)

    @precondition(lambda self: self.m["jobs"])
    @rule(data=st.data(), bad=REPORTS)
    def report_more(self, data: st.DataObject, bad: str) -> None:
        self.report(data, bad)

    @precondition(lambda self: self.m["jobs"])
    @rule(data=st.data(), bad=REPORTS)
    def report(self, data: st.DataObject, bad: str) -> None:
        name = data.draw(st.sampled_from(sorted(self.m["jobs"])))
        token, ids = self.m["jobs"].pop(name)
        ours = owns(CompactionState(self.state.reader.conn).job(name), token)
        missing = [i for i in ids if i not in self.m["live"]]
        sources = [self.m["live"].get(i) or self.m["tombstoned"].get(i) for i in ids]
        if any(s is None for s in sources):
            return  # a source was quarantined or its tombstone deleted: no output can be built from the model
        blocks = [s for s in sources if s is not None]
        changed = {"lose-range": len(merge_ranges([r for b in blocks for r in b.meta.kafka])) > 1,
                   "merge-incarnations": any(b.meta.kafka for b in blocks),
                   "no-rows": any(b.records for b in blocks), "more-rows": any(b.records for b in blocks)}
        bad = bad if changed.get(bad, True) else ""
        meta, records = self._output(name, token, blocks, bad)
        response = self.service.poll_compaction(PollRequest(worker="w", capacity=0, updates=[
            JobUpdate(job=name, token=token, status="success", outputs=[meta])]))
        outcome = response.updates[name]
        if not ours:
            assert outcome in ("lost", "unknown-job"), outcome
        elif missing:
            assert outcome == "sources-missing", outcome
        elif bad:
            assert outcome.startswith("invalid-outputs"), (bad, outcome)
        else:
            assert outcome == "completed", outcome
            for i in ids:
                self.remove(i, keep_records=True)
            self.add(Block(meta, records))
            self.m["reported"].append(JobUpdate(job=name, token=token, status="success", outputs=[meta]))

    @precondition(lambda self: self.m["reported"])
    @rule(data=st.data())
    def report_again(self, data: st.DataObject) -> None:
        """A worker's retry of a success report already applied: answered completed while its effect is in the index
        (every parent tombstoned into these outputs), else refused; never applied twice."""
        update: JobUpdate = data.draw(st.sampled_from(self.m["reported"]))
        effect = all(i in self.m["live"] or i in self.m["tombstoned"] for i in (o.id for o in update.outputs)) and all(
            p in self.m["tombstoned"] for o in update.outputs for p in o.compaction.parents)
        response = self.service.poll_compaction(PollRequest(worker="w", capacity=0, updates=[update]))
        assert response.updates[update.job] == ("completed" if effect else "unknown-job"), (effect, response)

    @precondition(lambda self: self.m["tombstoned"])
    @rule(data=st.data())
    def add_removed_block(self, data: st.DataObject) -> None:
        """A removed block offered again (a late writer, a scan of the bucket) stays removed while its tombstone
        is kept."""
        block = self.m["tombstoned"][data.draw(st.sampled_from(sorted(self.m["tombstoned"])))]
        assert accepted(self.submit(AddBlocks(blocks=[block.meta])))["rejected"] == [block.meta.id]

    @rule(minutes=st.sampled_from([1, 5, 20, 120, 600]))
    def tick(self, minutes: int) -> None:
        self.clock.now += minutes * 60

    # -- retention, generations, repair -----------------------------------------------------------

    @rule(back=st.sampled_from([0, 6, 12, 24, 48]), data_based=st.booleans())
    def retention(self, back: int, data_based: bool) -> None:
        cutoff = BASE_MS + back * HOUR_MS if data_based else self.now_ms() - back * HOUR_MS
        partitions = [PartitionKey(tenant=p.tenant, shard=p.shard, window_start=p.window_start)
                      for p in self.state.reader.partitions(TENANT)]
        result = self.submit(TruncateIndex(prepared_term=1, partitions=partitions, cutoffs={TENANT: cutoff}))
        assert result.ok, result
        expired = [i for i, b in self.m["live"].items()
                   if window(b.meta.time_ms) + PARTITION_WINDOW_MS <= cutoff and b.meta.max_time <= cutoff]
        assert result.data["removed"] == len(expired)
        for i in expired:
            self.remove(i)

    @rule(topic=st.sampled_from(TOPICS), generation=st.sampled_from([1, 2]), retire=st.booleans(),
          span=st.sampled_from([(0, 2**62), (0, 4), (2, 6), (5, 30)]))
    def switch_generation(self, topic: str, generation: int, retire: bool, span: tuple[int, int]) -> None:
        start, end = (span[0], span[1]) if span[1] == 2**62 else (BASE_MS + span[0] * HOUR_MS,
                                                                   BASE_MS + span[1] * HOUR_MS - 1)
        if span[0] == 0:
            start = 0
        doomed = [b for b in self.m["live"].values()
                  if b.meta.group == "partition" and b.meta.generation != generation
                  and all(d.topic == topic for d in b.meta.datasets) and all(k.topic == topic for k in b.meta.kafka)
                  and b.meta.min_time >= start and b.meta.max_time <= end]
        held = {h for b in self.m["live"].values() if b.lane == ("partition", generation) for h in b.held()}
        covered = all(("partition", generation, r) in held for b in doomed for r in b.records)
        retire = retire and covered  # an uncovered retire is issue 26 case 5 (the lead's): not driven here
        result = self.submit(SetActiveGeneration(tenant=TENANT, topic=topic, generation=generation, start=start,
                                                 end=end, retire=retire))
        assert result.ok, result
        rule_ = (topic, start, end, generation)
        last = [r for r in self.m["rules"] if r[0] == topic][-1:]
        if last != [rule_]:
            self.m["rules"].append(rule_)
        retired = set(result.data["retired"])
        assert retired == ({b.meta.id for b in doomed} if retire else set())
        for block_id in retired:
            self.remove(block_id)

    @precondition(lambda self: self.m["live"])
    @rule(data=st.data(), how=st.sampled_from(["rebuild", "merge", "quarantine"]))
    def repair(self, data: st.DataObject, how: str) -> None:
        """``shale bucket repair``'s index steps: a damaged block rebuilt (same records, new id), two overlapping
        blocks merged into one, or a damaged block quarantined (its records leave the index on purpose)."""
        first = data.draw(st.sampled_from(sorted(self.m["live"])))
        block = self.m["live"][first]
        if how == "quarantine":
            result = self.submit(QuarantineBlocks(tenant=TENANT, block_ids=[first], reason="damaged"))
            assert accepted(result)["removed"] == [first]
            self.remove(first, tombstone=False)
            return
        group = [block]
        if how == "merge":
            peers = sorted(i for i, b in self.m["live"].items() if b.lane == block.lane and i != first)
            if peers:
                group.append(self.m["live"][data.draw(st.sampled_from(peers))])
        metas = [b.meta for b in group]
        records = frozenset().union(*(b.records for b in group))
        new_id = self.next_id(f"repair/{how}/{first}")
        meta = build_meta(new_id, block.meta.group, block.meta.generation, max(m.level for m in metas),
                          merge_ranges([r for m in metas for r in m.kafka]), records,
                          sources=sorted({x for m in metas for x in m.compaction.sources}))
        result = self.submit(ReplaceBlocks(tenant=TENANT, sources=[m.id for m in metas], blocks=[meta],
                                           reason="repair"))
        assert not accepted(result)["replay"]
        for m in metas:
            self.remove(m.id, keep_records=True)
        self.add(Block(meta, records))

    @precondition(lambda self: self.m["tombstoned"])
    @rule(data=st.data())
    def delete_tombstones(self, data: st.DataObject) -> None:
        ids = data.draw(st.lists(st.sampled_from(sorted(self.m["tombstoned"])), min_size=1, unique=True))
        result = self.submit(DeleteTombstones(block_ids=ids))
        assert accepted(result)["deleted"] == len(ids)
        for i in ids:
            del self.m["tombstoned"][i]

    @rule()
    def take_snapshot(self) -> None:
        path = self.dir / f"snapshot-{self.seq}.db"
        self.seq += 1
        self.state.backup_to(path)
        self.snapshot = (path, copy.deepcopy(self.m), len(self.log.entries), self.state.state_hash())

    @precondition(lambda self: self.snapshot is not None)
    @rule()
    def restore_snapshot(self) -> None:
        """A replica installing the snapshot (Kafka itself is not rolled back: the topics stay as they are)."""
        assert self.snapshot is not None
        path, model, entries, digest = self.snapshot
        self.state.restore_from(path)
        assert self.state.state_hash() == digest
        self.m = copy.deepcopy(model)
        del self.log.entries[entries:]

    # -- queries ----------------------------------------------------------------------------------

    @rule(low=st.integers(-2, 30), length=st.integers(0, 30), group=st.sampled_from(["backup", "partition"]),
          topic=st.sampled_from(["", *TOPICS]))
    def query(self, low: int, length: int, group: str, topic: str) -> None:
        start = BASE_MS + low * HOUR_MS // 2
        self.check_query(start, start + length * HOUR_MS // 2, group, topic)

    def check_query(self, start: int, end: int, group: str, topic: str = "") -> None:
        matchers = parse_matchers(f'{{topic="{topic}"}}') if topic else []
        got = self.state.reader.query_blocks([TENANT], start, end, matchers, group)
        ids = [m.id for m in got]
        assert len(set(ids)) == len(ids)
        assert set(ids) <= set(self.m["live"])
        wanted = {h for h in self.m["expected"] if h[0] == group and start <= rtime(h[2]) <= end
                  and topic in ("", h[2][0])}
        found = Counter(h for m in got for h in self.m["live"][m.id].held()
                        if start <= rtime(h[2]) <= end and any(d.topic == h[2][0] for d in m.datasets)
                        and topic in ("", h[2][0]))
        assert set(found) == wanted, (sorted(wanted - set(found))[:5], sorted(set(found) - wanted)[:5])
        assert all(n == 1 for n in found.values()), [h for h, n in found.items() if n > 1][:5]
        if group != "partition":
            return
        plan = plan_query(got, "partition", "records", rules=self.state.reader.generation_rules(TENANT),
                          default_generation=1, start=start, end=end)
        reads: Counter[Held] = Counter()
        for part in plan.parts:
            for h in self.m["live"][part.block.id].held():
                t = rtime(h[2])
                if h[2][0] == part.dataset.topic and start <= t <= end and (
                        part.intervals is None or any(lo <= t <= hi for lo, hi in part.intervals)):
                    reads[h] += 1
        for h in wanted:
            active = active_generation(self.m["rules"], h[2][0], rtime(h[2])) == h[1]
            assert reads[h] == (1 if active else 0), (h, reads[h], self.m["rules"])

    # -- invariants -------------------------------------------------------------------------------

    @invariant()
    def live_blocks_are_the_models(self) -> None:
        live = self.state.reader.tenant_block_ids(TENANT)
        assert live == set(self.m["live"]), (sorted(set(self.m["live"]) - live), sorted(live - set(self.m["live"])))
        tombstones = {t.block_id for t in self.state.reader.tombstones(limit=100_000)}
        assert tombstones == set(self.m["tombstoned"])
        assert not tombstones & live

    @invariant()
    def each_committed_record_is_held_exactly_once(self) -> None:
        held = Counter(h for b in self.m["live"].values() for h in b.held())
        assert all(n == 1 for n in held.values()), [h for h, n in held.items() if n > 1][:5]
        assert set(held) == self.m["expected"], (sorted(self.m["expected"] - set(held))[:5])

    @invariant()
    def committed_offsets_tile(self) -> None:
        for spans in self.m["ranges"].values():
            for (_, end, _), (start, _, _) in itertools.pairwise(spans):
                assert start == end, spans
        index = {(r.group, r.generation, r.topic, r.partition): (r.incarnation, r.committed_end)
                 for r in self.state.reader.offsets()}
        assert index == self.m["committed"]
        past = {}
        for r in self.state.reader.incarnations():
            past.setdefault((r.group, r.generation, r.topic, r.partition), {})[r.incarnation] = r.committed_end
        assert past == self.m["past"]

    @invariant()
    def index_is_sound(self) -> None:
        conn = sqlite3.connect(str(self.state.path))
        try:
            assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        finally:
            conn.close()

    @invariant()
    def a_query_of_everything_returns_each_record_once(self) -> None:
        for group in ("backup", "partition"):
            self.check_query(0, 2**62, group)


TestMetastoreModel = MetastoreModel.TestCase


# -- what the model found, kept as named examples ---------------------------------------------------------------


def test_a_retiring_switch_of_one_topic_keeps_another_topics_block_without_records() -> None:
    """Found by the model: ``SetActiveGeneration(retire=True)`` chose the blocks to retire by their datasets alone,
    so a partition-group block without datasets (a batch range whose offsets held no readable record) of *another*
    topic was tombstoned by a switch of this one: the only record of those offsets in the index, whose loss leaves
    a gap in the offsets a bucket rebuild reconstructs (and the blocks after the gap are then left out)."""
    machine = MetastoreModel()
    try:
        machine.ingest(LANES[2], [("b", 0, 1, True)], "ok", 0)  # generation 2 of b: one offset, no readable record
        (kept,) = machine.m["live"]
        result = machine.submit(SetActiveGeneration(tenant=TENANT, topic="a", generation=1, start=0, end=2**62,
                                                    retire=True))
        assert accepted(result)["retired"] == []
        assert machine.state.reader.tenant_block_ids(TENANT) == {kept}
    finally:
        machine.teardown()


def test_a_restore_to_an_older_snapshot_leaves_no_stale_names_in_queries() -> None:
    """Found by the model (a nightly-sized run; this is its shrunk example). The index reader cached its interned
    strings (topics, groups, label values) by id for good, but a restore replaces the strings table, and an id
    interned after the snapshot is given to another string after the restore: the reader named the topic of the
    partition-group block of "b" with the string its id held before the restore, and a query for
    ``{topic="b"}`` missed the block."""
    machine = MetastoreModel()
    try:
        machine.take_snapshot()
        machine.ingest(LANES[0], [("a", 0, 1, False)], "ok", 0)
        machine.a_query_of_everything_returns_each_record_once()  # the reader caches the strings' ids
        machine.restore_snapshot()
        machine.ingest(LANES[1], [("b", 0, 1, False)], "ok", 0)
        machine.query(low=0, length=0, group="partition", topic="b")
    finally:
        machine.teardown()


@pytest.mark.xfail(strict=True, reason="a batch of a topic incarnation the group never committed is taken as the "
                                       "newest one, even when it is older than the current (a zombie writer)")
def test_a_zombie_batch_of_an_older_incarnation_does_not_take_the_partition_back() -> None:
    """Found while writing the model (not driven by it: the model's writers read Kafka's current incarnation). The
    topic was recreated twice; the group committed incarnations 0 and 2, never 1. A second ingest process of the
    group (the writer the offset checks fence) that read incarnation 1 before it was deleted commits now: the
    state machine cannot tell that 1 is older than 2, accepts the batch as a newly recreated topic and ends
    incarnation 2, so every later batch of the live topic is refused as stale and the group stops for good."""
    machine = MetastoreModel()
    try:
        machine.ingest(LANES[0], [("a", 0, 2, False)], "ok", 0)
        machine.kafka["a"] = 2
        machine.ingest(LANES[0], [("a", 0, 2, False)], "ok", 0)
        zombie = build_meta(machine.next_id("zombie"), "backup", 1, 0, [KafkaRange(
            topic="a", partition=0, start=0, end=1, incarnation=incarnation(1))], [("a", 0, incarnation(1), 0)])
        stale = machine.submit(CommitIngestBatch(group="backup", ranges=[OffsetRange(
            topic="a", partition=0, start=0, end=1, incarnation=incarnation(1))], blocks=[zombie]))
        assert not stale.ok
        machine.ingest(LANES[0], [("a", 0, 1, False)], "ok", 0)  # the live writer goes on in incarnation 2
    finally:
        machine.teardown()
