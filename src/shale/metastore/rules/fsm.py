"""The state machine: one registry of command handlers applied to the index, deterministically.

Every handler takes the index writer, the command and the log entry (index, term and the leader's timestamp),
and returns a ``Result`` or raises ``CommandRejectedError``. Handlers never read the clock or draw random
numbers: two replicas that apply the same log reach the same state (checked by ``state_hash``). Every handler
is idempotent: applied twice, a command leaves the state as applied once.

The applied index is written in the same transaction as the change. A rejected command still advances it
(the rejection is the entry's deterministic outcome), in a transaction of its own after the rollback.
"""

from __future__ import annotations

import functools
import hashlib
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from shale.block import META_FILENAME, BlockMeta
from shale.errors import CommandRejectedError
from shale.index import (
    PARTITION_WINDOW_MS,
    IndexReader,
    IndexWriter,
    begin,
    checkpoint,
    commit,
    connect,
    copy_state,
    create,
    rollback,
)
from shale.index import offsets as offset_store
from shale.metastore.rules.commands import (
    COMMAND_KINDS,
    AcknowledgeOffsetLoss,
    AcquireIngestLease,
    AddBlocks,
    Command,
    CommitIngestBatch,
    DeleteTombstones,
    Noop,
    OffsetRange,
    PlanErasure,
    QuarantineBlocks,
    RecordErasureReceipt,
    RecordRestore,
    ReleaseIngestLease,
    RenewIngestLease,
    ReplaceBlocks,
    RequestErasure,
    Result,
    SetActiveGeneration,
    SetCompactionFailureLimit,
    SetIngestShards,
    TrimBlockChanges,
    TruncateIndex,
    UpdateCompactionPlan,
    decode,
)
from shale.metastore.rules.compaction_service import apply_failure_limit, apply_plan
from shale.metastore.rules.erasures import apply_plan as apply_erasure_plan
from shale.metastore.rules.erasures import apply_receipt as apply_erasure_receipt
from shale.metastore.rules.erasures import apply_request as apply_erasure_request
from shale.metastore.rules.erasures import cover
from shale.metastore.rules.generations import first_gap, offsets_held, pin_switch, switch_when_caught_up
from shale.metastore.rules.leases import apply_acquire, apply_release, apply_renew, bridge_silence, check_commit_lease
from shale.metastore.rules.restores import apply_record
from shale.metastore.rules.shards import apply_set, check_commit_shard, record_load

COMMITS_KEPT_PER_PARTITION = 100
C = TypeVar("C")


@dataclass(frozen=True)
class Entry:
    """The log entry a command arrived in: its position, the leader's term, and the leader's clock."""

    index: int
    term: int
    time_ms: int


Handler = Callable[[IndexWriter, Any, Entry], Result]
HANDLERS: dict[str, Handler] = {}


def handles(kind: type[C]) -> Callable[[Callable[[IndexWriter, C, Entry], Result]], Callable[..., Result]]:
    def register(fn: Callable[[IndexWriter, C, Entry], Result]) -> Callable[..., Result]:
        HANDLERS[str(kind.model_fields["kind"].default)] = fn  # type: ignore[attr-defined]
        return fn
    return register


@handles(Noop)
def _noop(w: IndexWriter, cmd: Noop, entry: Entry) -> Result:
    return Result(ok=True, data={"index": entry.index})


@handles(AddBlocks)
def _add_blocks(w: IndexWriter, cmd: AddBlocks, entry: Entry) -> Result:
    for meta in cmd.blocks:
        _check_files(meta)
    ids = [m.id for m in cmd.blocks]
    tombstoned = w.tombstoned_among(ids)
    added = set(w.add_blocks([m for m in cmd.blocks if m.id not in tombstoned], entry.time_ms))
    cover(w, [m for m in cmd.blocks if m.id in added], entry.time_ms)
    links = w.touch({m.tenant for m in cmd.blocks if m.id in added}, entry.index, entry.time_ms)
    return Result(ok=True, data={"links": links, "added": [i for i in ids if i in added],
                                 "existing": [i for i in ids if i not in added and i not in tombstoned],
                                 "rejected": [i for i in ids if i in tombstoned]})


def _batch_digest(cmd: CommitIngestBatch) -> str:
    parts = sorted(b.id for b in cmd.blocks) + [f"{r.topic}/{r.partition}/{r.start}/{r.end}" for r in cmd.ranges]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def _check_files(meta: BlockMeta) -> None:
    """A block's data file names become object keys under the block's prefix: one path segment each, never
    meta.json (a name with ``/`` would make its tombstone's deletion fail on every pass)."""
    for name in [*(f.name for f in meta.files), *(d.file for d in meta.datasets)]:
        if _bad_file_name(name):
            raise CommandRejectedError(f"block {meta.id} names a data file {name[:200]!r}: a file name is one "
                                       f"path segment, not {META_FILENAME}", reason="malformed")


@functools.lru_cache(maxsize=4096)
def _bad_file_name(name: str) -> bool:
    """Cached: blocks repeat a few names, and this runs for every block the metastore adds."""
    return "/" in name or "\\" in name or name in ("", ".", "..", META_FILENAME) or len(name) > 200


def _check_batch(cmd: CommitIngestBatch) -> None:
    seen: dict[tuple[str, int], OffsetRange] = {}
    for r in cmd.ranges:
        if r.end < r.start:
            raise CommandRejectedError(f"{r.topic}[{r.partition}] range [{r.start},{r.end}) ends before it starts",
                                       reason="malformed")
        if (r.topic, r.partition) in seen:
            raise CommandRejectedError(f"{r.topic}[{r.partition}] appears twice in one batch", reason="malformed")
        if r.stored is not None and r.stored > r.end - r.start:
            raise CommandRejectedError(f"{r.topic}[{r.partition}] claims {r.stored} stored records in "
                                       f"[{r.start},{r.end})", reason="malformed")
        seen[(r.topic, r.partition)] = r
    for meta in cmd.blocks:
        _check_files(meta)
        if meta.level != 0 or meta.compaction.sources != [meta.id] or meta.compaction.parents:
            raise CommandRejectedError(
                f"block {meta.id} is level {meta.level} with sources {meta.compaction.sources} and parents "
                f"{meta.compaction.parents}: an ingest batch writes level-0 blocks whose only source is the block "
                "itself (lineage is written by compaction, which needs admin)", reason="malformed")
        if meta.group != cmd.group or meta.generation != cmd.generation or meta.shard != cmd.shard:
            raise CommandRejectedError(
                f"block {meta.id} is group {meta.group} generation {meta.generation} shard {meta.shard}, the batch "
                f"is {cmd.group} generation {cmd.generation} shard {cmd.shard}", reason="malformed")
        for kr in meta.kafka:
            span = seen.get((kr.topic, kr.partition))
            if span is None or kr.start < span.start or kr.end > span.end or kr.incarnation != span.incarnation:
                raise CommandRejectedError(
                    f"block {meta.id} holds {kr.topic}[{kr.partition}] [{kr.start},{kr.end}) outside the batch's "
                    f"ranges (or of another topic incarnation)", reason="malformed")


def _continuity(w: IndexWriter, cmd: CommitIngestBatch, r: OffsetRange) -> bool:
    """Check that ``r`` continues its partition's committed offsets; True when it starts a new topic incarnation.

    Within one incarnation a range must start at the committed end: a gap would leave offsets never stored, an
    overlap would store records twice. A range of an incarnation never seen before is the first of a recreated
    topic and may start anywhere; a range of an incarnation that has ended is stale. ``''`` (not recorded, from
    before incarnations were kept) matches any incarnation.
    """
    current = offset_store.committed(w.conn, cmd.group, cmd.generation, r.topic, r.partition)
    if current is None:
        return False
    end, incarnation, writer = current
    where = f"{cmd.group} generation {cmd.generation} {r.topic}[{r.partition}]"
    if writer and writer != cmd.writer:
        raise CommandRejectedError(
            f"{where} is written by {writer}; a {cmd.writer} commit must use another generation (live ingestion and "
            "reprocessing never write the same generation)", reason="generation-owned")
    if incarnation and r.incarnation and incarnation != r.incarnation:
        if offset_store.is_past_incarnation(w.conn, cmd.group, cmd.generation, r.topic, r.partition, r.incarnation):
            raise CommandRejectedError(
                f"{where}: topic incarnation {r.incarnation} has ended (the topic was deleted and recreated as "
                f"{incarnation}); this batch was read from the old topic and can never be committed",
                reason="stale-incarnation")
        return True
    if r.start == end:
        return False
    if r.start < end:
        raise CommandRejectedError(
            f"{where}: the batch starts at offset {r.start} but offsets up to {end} are committed already "
            f"(overlap [{r.start},{min(end, r.end)})). The writer must start at the committed end; "
            "a second ingest process of the same group is the usual cause.", reason="offset-overlap")
    raise CommandRejectedError(
        f"{where}: the batch starts at offset {r.start} but the committed end is {end}, so offsets "
        f"[{end},{r.start}) would never be stored. If Kafka deleted them before they were read, accept the loss "
        f"with `shale offsets acknowledge-loss --group {cmd.group} --topic {r.topic} --partition {r.partition} "
        f"--to {r.start}`.", reason="offset-gap")


def _event_times(blocks: list[BlockMeta]) -> dict[tuple[str, int], int]:
    """Per (topic, partition): the largest time of its stored records in the blocks that name it in their Kafka
    ranges (``BlockMeta.event_time_of``), each block read once: linear in the ranges of the batch, where asking every
    block once per range was quadratic in the partitions (35.8 s to apply one commit of 10,000 partitions)."""
    out: dict[tuple[str, int], int] = {}
    for block in blocks:
        for key, time_ms in block.event_times().items():
            out[key] = max(out[key], time_ms) if key in out else time_ms
    return out


@handles(CommitIngestBatch)
def _commit_ingest_batch(w: IndexWriter, cmd: CommitIngestBatch, entry: Entry) -> Result:
    _check_batch(cmd)
    digest = _batch_digest(cmd)
    ranges = [r for r in cmd.ranges if r.end > r.start]
    conn, group = w.conn, (cmd.group, cmd.generation)
    known = [offset_store.find_commit(conn, *group, r.topic, r.partition, r.incarnation, r.start) for r in ranges]
    if ranges and all(k == (r.end, digest) for k, r in zip(known, ranges, strict=True)):
        return Result(ok=True, data={"replay": True, "blocks": len(cmd.blocks)})
    check_commit_lease(w, cmd, entry.time_ms)
    check_commit_shard(w, cmd)
    restarts = [r for r in ranges if _continuity(w, cmd, r)]
    tombstoned = w.tombstoned_among([m.id for m in cmd.blocks])
    if tombstoned:
        raise CommandRejectedError(f"blocks {sorted(tombstoned)} were already compacted or deleted",
                                   reason="tombstoned")
    for r in restarts:
        offset_store.end_incarnation(conn, *group, r.topic, r.partition, entry.time_ms)
    w.add_blocks(cmd.blocks, entry.time_ms)
    cover(w, cmd.blocks, entry.time_ms)  # a new generation read from Kafka never brings an erased record back
    event_times = _event_times(cmd.blocks)
    for r in ranges:
        event_time = event_times.get((r.topic, r.partition), 0)
        skipped = r.end - r.start - r.stored if r.stored is not None else 0
        offset_store.set_committed_end(conn, *group, r.topic, r.partition, r.end, event_time, entry.time_ms,
                                       incarnation=r.incarnation, writer=cmd.writer, skipped=skipped)
        incarnation = (offset_store.committed(conn, *group, r.topic, r.partition) or (0, "", ""))[1]
        offset_store.record_commit(conn, *group, r.topic, r.partition, r.incarnation or incarnation, r.start, r.end,
                                   digest, entry.time_ms, COMMITS_KEPT_PER_PARTITION)
    for r in cmd.ranges:  # a partition never committed, with nothing to read (``BatchPlan.quiet``): now known
        if r.end == r.start and offset_store.committed(conn, *group, r.topic, r.partition) is None:
            offset_store.set_committed_end(conn, *group, r.topic, r.partition, r.end, 0, entry.time_ms,
                                           incarnation=r.incarnation, writer=cmd.writer, skipped=0)
    record_load(w, cmd, entry.time_ms)
    # After the offsets: whether the generation has caught up is decided by what this commit brings too.
    switches = switch_when_caught_up(w, cmd) if cmd.group == "partition" and cmd.writer == "ingest" else {}
    links = w.touch({m.tenant for m in cmd.blocks} | set(switches), entry.index, entry.time_ms)
    return Result(ok=True, data={"replay": False, "blocks": len(cmd.blocks), "ranges": len(ranges),
                                 "links": links, "switches": switches,
                                 "new_incarnations": [f"{r.topic}[{r.partition}]" for r in restarts]})


@handles(AcquireIngestLease)
def _acquire_ingest_lease(w: IndexWriter, cmd: AcquireIngestLease, entry: Entry) -> Result:
    return apply_acquire(w, cmd, entry.index, entry.time_ms)


@handles(RenewIngestLease)
def _renew_ingest_lease(w: IndexWriter, cmd: RenewIngestLease, entry: Entry) -> Result:
    return apply_renew(w, cmd, entry.index, entry.time_ms)


@handles(ReleaseIngestLease)
def _release_ingest_lease(w: IndexWriter, cmd: ReleaseIngestLease, entry: Entry) -> Result:
    return apply_release(w, cmd, entry.time_ms)


@handles(RequestErasure)
def _request_erasure(w: IndexWriter, cmd: RequestErasure, entry: Entry) -> Result:
    return apply_erasure_request(w, cmd, entry.index, entry.time_ms)


@handles(PlanErasure)
def _plan_erasure(w: IndexWriter, cmd: PlanErasure, entry: Entry) -> Result:
    return apply_erasure_plan(w, cmd, entry.index, entry.time_ms)


@handles(RecordErasureReceipt)
def _record_erasure_receipt(w: IndexWriter, cmd: RecordErasureReceipt, entry: Entry) -> Result:
    return apply_erasure_receipt(w, cmd, entry.time_ms)


@handles(RecordRestore)
def _record_restore(w: IndexWriter, cmd: RecordRestore, entry: Entry) -> Result:
    return apply_record(w, cmd, entry.index, entry.time_ms)


@handles(SetIngestShards)
def _set_ingest_shards(w: IndexWriter, cmd: SetIngestShards, entry: Entry) -> Result:
    return apply_set(w, cmd, entry.index, entry.time_ms)


@handles(AcknowledgeOffsetLoss)
def _acknowledge_offset_loss(w: IndexWriter, cmd: AcknowledgeOffsetLoss, entry: Entry) -> Result:
    where = f"{cmd.group} generation {cmd.generation} {cmd.topic}[{cmd.partition}]"
    if cmd.end <= cmd.start:
        raise CommandRejectedError(f"{where}: the lost range [{cmd.start},{cmd.end}) is empty", reason="malformed")
    current = offset_store.committed(w.conn, cmd.group, cmd.generation, cmd.topic, cmd.partition)
    if current is None:
        raise CommandRejectedError(f"{where} has no committed offsets: ingestion starts where Kafka's log starts, "
                                   "there is no loss to acknowledge", reason="no-offsets")
    end, incarnation, _ = current
    if incarnation and cmd.incarnation and incarnation != cmd.incarnation:
        raise CommandRejectedError(f"{where}: the current topic incarnation is {incarnation}, not {cmd.incarnation}",
                                   reason="stale-incarnation")
    key = (cmd.group, cmd.generation, cmd.topic, cmd.partition, incarnation or cmd.incarnation)
    if end == cmd.end and offset_store.find_loss(w.conn, *key, cmd.start) == cmd.end:
        return Result(ok=True, data={"replay": True})
    if end != cmd.start:
        raise CommandRejectedError(f"{where}: the committed end is {end}, not {cmd.start}; look again at the "
                                   "partition's committed offsets before acknowledging a loss", reason="offset-moved")
    offset_store.set_committed_end(w.conn, *key[:4], cmd.end, 0, entry.time_ms)
    offset_store.record_loss(w.conn, *key, cmd.start, cmd.end, cmd.reason or "acknowledged by an operator",
                             entry.time_ms)
    return Result(ok=True, data={"replay": False, "lost": cmd.end - cmd.start})


def _own_tenant(w: IndexWriter, block_ids: list[str], tenant: str) -> None:
    """A command that removes blocks never crosses tenants: a caller naming its own tenant must not remove
    another's blocks."""
    for block_id in block_ids:
        present = w.get_block(block_id)
        if present is not None and present.tenant != tenant:
            raise CommandRejectedError(f"block {block_id} belongs to tenant {present.tenant}, not {tenant}",
                                       reason="malformed")


@handles(ReplaceBlocks)
def _replace_blocks(w: IndexWriter, cmd: ReplaceBlocks, entry: Entry) -> Result:
    for meta in cmd.blocks:
        _check_files(meta)
        if meta.tenant != cmd.tenant:
            raise CommandRejectedError(f"block {meta.id} belongs to {meta.tenant}, not {cmd.tenant}",
                                       reason="malformed")
    missing = [s for s in cmd.sources if not w.has_block(s)]
    if missing:
        if all(w.has_block(b.id) for b in cmd.blocks) and all(w.tombstoned(s) for s in cmd.sources):
            return Result(ok=True, data={"replay": True})
        raise CommandRejectedError(
            f"sources {missing} are no longer in the index (retention or another replacement removed them); the "
            "new blocks must not bring their records back", reason="sources-missing")
    _own_tenant(w, cmd.sources, cmd.tenant)
    for meta in cmd.blocks:
        if w.tombstoned(meta.id):
            raise CommandRejectedError(f"block {meta.id} was already deleted", reason="tombstoned")
    outputs = ",".join(b.id for b in cmd.blocks)
    for source in cmd.sources:
        old = w.remove_block(source)
        assert old is not None
        w.add_tombstone(old, entry.time_ms, f"{cmd.reason} into {outputs}" if outputs else cmd.reason)
    for meta in cmd.blocks:
        w.add_block(meta, entry.time_ms)
    cover(w, cmd.blocks, entry.time_ms)
    links = w.touch({cmd.tenant}, entry.index, entry.time_ms)
    return Result(ok=True, data={"replay": False, "removed": len(cmd.sources), "added": len(cmd.blocks),
                                 "links": links})


@handles(QuarantineBlocks)
def _quarantine_blocks(w: IndexWriter, cmd: QuarantineBlocks, entry: Entry) -> Result:
    removed = []
    _own_tenant(w, cmd.block_ids, cmd.tenant)
    for block_id in cmd.block_ids:
        if w.remove_block(block_id) is not None:
            removed.append(block_id)
    if removed:
        w.touch({cmd.tenant}, entry.index, entry.time_ms)
    return Result(ok=True, data={"removed": removed})


@handles(TruncateIndex)
def _truncate_index(w: IndexWriter, cmd: TruncateIndex, entry: Entry) -> Result:
    if cmd.prepared_term != entry.term:
        raise CommandRejectedError(
            f"TruncateIndex was prepared in term {cmd.prepared_term} but committed in term {entry.term}: leadership "
            "changed in between, so the new leader prepares its own", reason="stale-term")
    missing = sorted({key.tenant for key in cmd.partitions} - set(cmd.cutoffs))
    if missing:
        raise CommandRejectedError(f"TruncateIndex names partitions of {missing} without their cutoff",
                                   reason="malformed")
    tombstoned: dict[str, list[str]] = {}
    for key in cmd.partitions:
        cutoff = cmd.cutoffs[key.tenant]
        if key.window_start + PARTITION_WINDOW_MS > cutoff:
            continue
        for block_id in w.partition_blocks(key.tenant, key.shard, key.window_start, data_until=cutoff):
            meta = w.remove_block(block_id)
            assert meta is not None
            w.add_tombstone(meta, entry.time_ms, cmd.reason)
            tombstoned.setdefault(meta.tenant, []).append(block_id)
    # Every block removed, per tenant: the bucket index delta marks exactly these (the ones its prepare marked
    # and any block added since that the same cutoffs expire).
    return Result(ok=True, data={"removed": sum(len(ids) for ids in tombstoned.values()), "tombstoned": tombstoned,
                                 "links": w.touch(set(tombstoned), entry.index, entry.time_ms)})


@handles(DeleteTombstones)
def _delete_tombstones(w: IndexWriter, cmd: DeleteTombstones, entry: Entry) -> Result:
    links = w.touch(w.tombstone_tenants(cmd.block_ids), entry.index, entry.time_ms)
    return Result(ok=True, data={"deleted": w.delete_tombstones(cmd.block_ids), "links": links})


@handles(UpdateCompactionPlan)
def _update_compaction_plan(w: IndexWriter, cmd: UpdateCompactionPlan, entry: Entry) -> Result:
    return apply_plan(w, cmd, entry.index, entry.term, entry.time_ms)


@handles(SetCompactionFailureLimit)
def _set_failure_limit(w: IndexWriter, cmd: SetCompactionFailureLimit, entry: Entry) -> Result:
    return apply_failure_limit(w, cmd)


@handles(TrimBlockChanges)
def _trim_block_changes(w: IndexWriter, cmd: TrimBlockChanges, entry: Entry) -> Result:
    return Result(ok=True, data={"trimmed": w.trim_changes(min(cmd.through, entry.index - 1))})


@handles(SetActiveGeneration)
def _set_active_generation(w: IndexWriter, cmd: SetActiveGeneration, entry: Entry) -> Result:
    if cmd.end < cmd.start:
        raise CommandRejectedError(f"the range ends ({cmd.end}) before it starts ({cmd.start})", reason="malformed")
    retiring = []
    if cmd.retire:
        partition = [m for m in w.tenant_block_metas(cmd.tenant) if m.group == "partition"]
        # what the new generation holds of this topic counts in every block of it, a block that also holds
        # another topic (a repair merge, a batch of both topics) included; only one-topic blocks are retired
        held = offsets_held([m for m in partition if m.generation == cmd.generation], cmd.topic)
        retiring = [m for m in partition if m.generation != cmd.generation
                    and all(r.topic == cmd.topic for r in m.kafka) and all(d.topic == cmd.topic for d in m.datasets)
                    and m.min_time >= cmd.start and m.max_time <= cmd.end]
        for meta in retiring:
            for r in meta.kafka:
                gap = first_gap(held.get((r.partition, r.incarnation), []), r.start, r.end)
                if gap is not None:
                    raise CommandRejectedError(
                        f"generation {cmd.generation} does not hold offsets [{gap[0]}, {gap[1]}) of "
                        f"{cmd.topic}[{r.partition}] that block {meta.id} of generation {meta.generation} holds: "
                        "retiring it would lose them; reprocess them into the new generation first, or switch "
                        "without --retire", reason="not-covered")
    added = w.add_generation_rule(cmd.tenant, cmd.topic, cmd.start, cmd.end, cmd.generation)
    pin_switch(w, cmd)  # an operator's switch binds the generations it was made among: ingestion never undoes it
    retired = []
    for meta in retiring:
        w.remove_block(meta.id)
        w.add_tombstone(meta, entry.time_ms, f"generation {cmd.generation} replaced it")
        retired.append(meta.id)
    if added or retired:
        w.touch({cmd.tenant}, entry.index, entry.time_ms)
    return Result(ok=True, data={"switched": added, "retired": retired})


_missing = set(COMMAND_KINDS) - set(HANDLERS)
if _missing:  # every declared command has its handler, or importing the state machine fails
    raise RuntimeError(f"commands without a handler: {sorted(_missing)}")


class StateMachine:
    """The index plus the handlers. ``apply`` must be called by one thread at a time (the log's)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.conn = connect(str(path))
        create(self.conn)
        self.writer = IndexWriter(self.conn)
        self.reader = IndexReader(lambda: connect(str(path)))
        self.lock = threading.RLock()

    def applied(self) -> tuple[int, int]:
        with self.lock:
            return self.writer.applied()

    def apply(self, entry: Entry, data: bytes) -> Result:
        """Apply the command in ``data`` at ``entry``; an entry at or below the applied index is skipped."""
        with self.lock:
            begin(self.conn)
            return self._apply_in_transaction(lambda _: entry, lambda: decode(data))

    def apply_next(self, term: int, time_ms: int, command: Command) -> Result:
        """Apply an already-validated command at the next index, chosen inside the write transaction (so that
        processes sharing one state file agree on the order). The single-node log's path: no bytes at all."""
        with self.lock:
            begin(self.conn)
            return self._apply_in_transaction(lambda applied: Entry(applied + 1, term, time_ms), lambda: command)

    def _apply_in_transaction(self, entry_for: Callable[[int], Entry], command_for: Callable[[], Command]) -> Result:
        try:
            applied, _ = self.writer.applied()
            entry = entry_for(applied)
            if entry.index <= applied:
                rollback(self.conn)
                return Result(ok=True, reason="already-applied", data={"index": entry.index})
            command = command_for()
            bridge_silence(self.writer, entry.time_ms)
            result = HANDLERS[command.kind](self.writer, command, entry)
            self.writer.set_applied(entry.index, entry.term)
            commit(self.conn)
            return result
        except CommandRejectedError as exc:
            rollback(self.conn)
            self.writer.forget_cache()
            begin(self.conn)
            bridge_silence(self.writer, entry.time_ms)  # the entry happened, whatever its command's outcome
            self.writer.set_applied(entry.index, entry.term)
            commit(self.conn)
            return Result(ok=False, reason=exc.reason, message=str(exc))
        except BaseException:
            if self.conn.in_transaction:
                rollback(self.conn)
            self.writer.forget_cache()
            raise

    def close(self) -> None:
        """Checkpoint the write-ahead log into the file and close (the file is then complete on its own)."""
        with self.lock:
            checkpoint(self.conn)
            self.conn.close()

    def state_hash(self, *, with_applied: bool = True) -> str:
        with self.lock:
            return self.reader.state_hash(with_applied=with_applied)

    def backup_to(self, target: Path) -> None:
        """A consistent copy of the whole state, without holding the state lock: SQLite's online backup from a
        separate read-only connection in one step, which is one read transaction, so the copy is exactly one
        committed state while commands go on being applied (WAL mode lets readers and the writer overlap). The Raft
        snapshot calls this on the thread that applies entries, so its copy is exactly the last applied entry."""
        copy_state(self.path, target)

    def restore_from(self, source: Path) -> None:
        """Replace the whole state with a backup taken by ``backup_to``; a backup of an older schema (a snapshot
        from a leader not yet upgraded) is migrated as opening it would."""
        with self.lock:
            src = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
            try:
                src.backup(self.conn)
            finally:
                src.close()
            create(self.conn)
            self.writer.forget_cache()
            self.reader.forget_cache()  # a string id of the replaced state may name another string in this one


def restore_file(backup: Path, target: Path) -> None:
    """Offline restore of a stopped node's state file, through SQLite's backup API (which also reads a
    write-ahead log the backup file may still have beside it)."""
    for suffix in ("", "-wal", "-shm"):
        Path(str(target) + suffix).unlink(missing_ok=True)
    source = sqlite3.connect(str(backup))
    dest = sqlite3.connect(str(target))
    try:
        source.backup(dest)
    finally:
        dest.close()
        source.close()

