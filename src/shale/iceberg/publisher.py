"""``IcebergPublisher``: every committed metastore change to a table's blocks becomes exactly one Iceberg snapshot.

One round (``run_once``), on the metastore leader:

1. One consistent read of the index (a single SQLite read transaction): the applied index N, the change feed
   after the published point P (``shale.index.changes``), the metadata of the blocks it names, and the
   generation switches of the tenants it touches.
2. For each log entry in order and each table it touches, unless the table's current snapshot already records
   that entry or a later one (its summary's ``shale.applied-index``): one snapshot. An ingest commit appends
   files; a compaction removes its sources' files and adds its output's in one overwrite snapshot; retention
   and retirement remove files; a generation switch replaces the table's files by those the new switches show.
   A table created after the feed was trimmed starts with one snapshot of its state at P. An erasure's block
   replacements are held back until it is rewritten and become one snapshot per table, which lists the older
   snapshots naming its records; those are expired right after (``shale.iceberg.erasure``, DESIGN 19.6).
3. ``TrimBlockChanges(through)`` once every entry up to ``through`` is published.

A crash anywhere is safe: an Iceberg commit is atomic (the catalog row points to the new metadata.json or not),
and a restarted publisher skips, per table, the entries its last snapshot already records, so no change is
published twice and none is skipped. Copies that a snapshot stops referencing are deleted ``block.delete_delay``
after it, like Shale's own objects. Not thread-safe: one loop calls ``run_once``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from functools import partial
from itertools import groupby
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from shale.block import BlockMeta, block_file_key, decode_column_types
from shale.config import ShaleConfig, granted_delete_delay
from shale.errors import NotFoundError, ShaleError
from shale.iceberg.catalog import (
    METRICS_PROPERTIES,
    SUMMARY_DELETE_DELAY,
    SUMMARY_ERASURES,
    SUMMARY_EXPIRES,
    SUMMARY_INDEX,
    SUMMARY_RELEASED,
    TABLE_OWNER,
    TABLE_PROPERTIES,
    TABLE_RECORD,
    TABLE_TOPIC,
    identifier,
    object_uri,
    open_catalog,
)
from shale.iceberg.erasure import expire, expire_listed, suspect, tainted
from shale.iceberg.failures import FailingTables
from shale.iceberg.files import block_of, copy_key, is_copy, key_of, register
from shale.iceberg.plan import (
    FileSpec,
    Rule,
    TableKey,
    blocks_at,
    desired,
    rules_at,
    table_files,
    tables_of,
)
from shale.iceberg.types import conflicts, iceberg_schema, table_schema, unrepresentable
from shale.index import BlockChange, IndexReader
from shale.metastore import Result, TrimBlockChanges
from shale.objstore import Bucket

log = logging.getLogger(__name__)
LAG_ENTRIES = Gauge("shale_iceberg_lag_entries", "Metastore log entries whose block changes are not yet published "
                    "as Iceberg snapshots.")
LAG_SECONDS = Gauge("shale_iceberg_lag_seconds", "Seconds since the publisher first saw the oldest change it has "
                    "not yet published (0 when caught up).")
SNAPSHOTS = Counter("shale_iceberg_snapshots_total", "Iceberg snapshots committed by the publisher.", ["operation"])
ROUNDS = Counter("shale_iceberg_rounds_total", "Publisher rounds, by outcome: ok or failed.", ["outcome"])
COPIES = Counter("shale_iceberg_copies_total", "Data objects copied because a table shows only some of their rows "
                 "or they hold millisecond timestamps.")
PUBLISH_SECONDS = Histogram("shale_iceberg_publish_seconds", "From the publisher first seeing a change to its "
                            "snapshot being committed.", buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300))
REFUSED = Counter("shale_iceberg_refused_files_total", "Data files left out of an Iceberg table because a column's "
                  "type conflicts with the table's (the log names the column and both types; shale query still "
                  "serves the rows).")
CONFLICTS = Gauge("shale_iceberg_table_name_conflicts", "Tables the publisher does not write because their name is "
                  "taken by a table of another topic or record type (the log and the status name both).")
RETRIES = Counter("shale_iceberg_commit_retries_total", "Iceberg commits the catalog did not accept because another "
                  "writer advanced the table first (or whose outcome was unknown), planned again and retried.")
COMMIT_ATTEMPTS = 5
EXPIRED = Counter("shale_iceberg_snapshots_expired_total", "Snapshots of Shale's tables expired (metadata only: no "
                  "data file is deleted).")
STOPPED = Gauge("shale_iceberg_tables_stopped", "Shale's tables the publisher has stopped writing because a "
                "snapshot it did not write changed their rows (the log and the status name the snapshot).")
LAST_SUCCESS = Gauge("shale_iceberg_last_success_timestamp_seconds", "When a publisher round last succeeded.")


class TableNameConflictError(ShaleError):
    """The table a topic (or record type) would be published to belongs to another one (``<topic>__<record>``
    names can meet a topic of that very name, and records ``a.b`` and ``a_b`` meet each other)."""


class ForeignChangeError(ShaleError):
    """Another writer changed the rows of one of Shale's tables (a DELETE's delete files, a rewrite of its data
    files, an INSERT): Shale stops publishing into it rather than commit over that change."""


NOT_WRITTEN = (TableNameConflictError, ForeignChangeError)
"""A table the publisher leaves as it is (logged once, in the status; its topic's rows stay readable)."""


@dataclass
class _Table:
    """A table as its current snapshot holds it: the data files by URI, and which block each comes from."""

    table: Any
    last_index: int
    files: dict[str, Any] = field(default_factory=dict)
    blocks: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    swept_ms: int = 0
    swept_early: set[int] = field(default_factory=set)
    """Erasure snapshots past their shorter delete delay whose copies are deleted already (``_sweep``)."""


@dataclass
class _Read:
    applied: int
    published: int
    changes: list[BlockChange]
    metas: dict[str, BlockMeta]
    rules: dict[str, list[Rule]]
    live: dict[str, dict[str, BlockMeta]]
    """Every live block of the tenants read whole (those with a generation switch, an erasure's rewrite or a table
    to bootstrap)."""
    replaced: dict[str, str] = field(default_factory=dict)
    """Blocks the feed removes that an erasure replaced, with the erasure's id."""
    erasures: dict[str, str] = field(default_factory=dict)
    """Every erasure's state."""


@dataclass
class _Fold:
    """The entries ``first`` to ``last`` of the feed hold the rewrites of ``erasures``: the tables they touch get
    one snapshot, at ``last``, of what they hold as of it (``_erasure_folds``)."""

    first: int
    last: int
    erasures: set[str]
    tables: set[TableKey] = field(default_factory=set)
    held: bool = False


class IcebergPublisher:
    def __init__(self, config: ShaleConfig, reader: IndexReader, submit: Callable[[TrimBlockChanges], Result],
                 bucket: Bucket, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.reader = reader
        self.submit = submit
        self.bucket = bucket
        self.clock = clock
        self._catalog: Any = None
        self._tables: dict[TableKey, _Table] = {}
        self._started = False
        self._first_seen: dict[int, float] = {}
        self.last_error = ""
        self.refused = 0
        self.conflicts: dict[TableKey, str] = {}
        """Tables whose name another topic's or record type's table holds: not written (``_load``)."""
        self.stopped: dict[TableKey, str] = {}
        """Tables whose rows another writer's snapshot changed: not written until a full sync finds them Shale's."""
        self.published_through = 0
        self.expired = 0
        self._expired_at = 0.0
        self._holding: set[int] = set()
        """Feed entries the publisher holds back at (an erasure rewriting), each logged once."""
        self.applied = 0
        self.failing = FailingTables()
        """Tables whose publish failed for a reason of their own (``_fail``): retried with a backoff."""
        self._lock = threading.Lock()  # the loop and an HTTP-triggered sync take turns

    # -- one round --------------------------------------------------------------------------------

    def run_once(self) -> int:
        """Publish what the feed holds (at most ``max_entries_per_round`` log entries); return the snapshots
        committed. Without ``iceberg.enabled`` the feed is only trimmed, so it never grows."""
        with self._lock:
            return self._guarded_round()

    def _guarded_round(self) -> int:
        try:
            committed = self._round()
        except Exception as exc:
            ROUNDS.labels("failed").inc()
            LAG_SECONDS.set(self.clock() - min(self._first_seen.values()) if self._first_seen else 0)
            self.last_error = f"{type(exc).__name__}: {exc}"[:500]
            self._tables.clear()  # reload every table from the catalog: a failed commit leaves ours stale
            self._started = False
            raise
        ROUNDS.labels("ok").inc()
        LAST_SUCCESS.set(self.clock())
        self.last_error = ""
        return committed

    def _round(self) -> int:
        enabled = self.config.iceberg.enabled
        due = self.failing.due(self.clock()) if enabled else []
        read = self._read(whole_tenants=not self._started and enabled, also={k.tenant for k in due})
        self.applied, self.published_through = read.applied, read.published
        now = self.clock()
        for index in sorted({c.index for c in read.changes}):
            self._first_seen.setdefault(index, now)
        through = min(read.applied, read.published + self.config.iceberg.max_entries_per_round)
        committed = 0
        if enabled:
            folds, through = self._erasure_folds(read, through)
            if not self._started:
                committed += self._start(read)
            committed += self._publish(read, through, folds)
            committed += self._retry(read, through, due)
            self._sweep()
            self._expire()
            self._expire_erased()
        if any(c.index <= through for c in read.changes):
            self.submit(TrimBlockChanges(through=through)).raise_for_rejection()
            self.published_through = through
        for index in [i for i in self._first_seen if i <= through]:
            if enabled:
                PUBLISH_SECONDS.observe(self.clock() - self._first_seen[index])
            del self._first_seen[index]
        pending = self.reader.pending_change_entries()
        LAG_ENTRIES.set(pending)
        LAG_SECONDS.set(self.clock() - min(self._first_seen.values()) if self._first_seen else 0)
        return committed

    def _read(self, *, whole_tenants: bool, also: AbstractSet[str] = frozenset()) -> _Read:
        reader = self.reader
        with reader.snapshot():
            applied, _ = reader.applied()
            published = reader.changes_published_through()
            changes = reader.block_changes(published, applied)
            metas = reader.change_metas(sorted({c.subject for c in changes if c.change != "generations"}))
            tenants = {c.tenant for c in changes}
            replaced = reader.erasure_rewrites(sorted({c.subject for c in changes if c.change == "remove"}))
            erasures = reader.erasure_states() if replaced else {}
            whole = set(reader.tenants()) if whole_tenants else {
                c.tenant for c in changes if c.change == "generations" or c.subject in replaced} | also
            rules = {t: reader.generation_rules(t) for t in sorted(tenants | whole)}
            live = {t: {m.id: m for m in reader.tenant_blocks(t)} for t in sorted(whole)}
        return _Read(applied, published, changes, metas, rules, live, replaced, erasures)

    def _erasure_folds(self, read: _Read, through: int) -> tuple[list[_Fold], int]:
        """The runs of entries holding erasures' rewrites (overlapping runs joined), and how far to publish: not
        past the entry before a run whose erasure is still rewriting (held at most ``iceberg.erasure_hold``, so a
        table gets one snapshot per erasure), and through the end of a run it starts."""
        spans: dict[str, list[int]] = {}
        for c in read.changes:
            erasure = read.replaced.get(c.subject) if c.change == "remove" else None
            if erasure is not None:
                span = spans.setdefault(erasure, [c.index, c.index])
                span[1] = c.index
        folds: list[_Fold] = []
        for erasure, (first, last) in sorted(spans.items(), key=lambda kv: kv[1]):
            held = read.erasures.get(erasure) in ("requested", "rewriting") and (
                self.clock() - self._first_seen.get(first, self.clock()) < self.config.iceberg.erasure_hold)
            if folds and first <= folds[-1].last:
                fold = folds[-1]
                fold.last, fold.held = max(fold.last, last), fold.held or held
                fold.erasures.add(erasure)
            else:
                folds.append(_Fold(first, last, {erasure}, held=held))
        for fold in folds:
            if fold.held and fold.first <= through:
                if fold.first not in self._holding:  # once per hold, not every round
                    self._holding.add(fold.first)
                    log.info("iceberg: holding snapshots back until erasures %s are rewritten",
                             sorted(fold.erasures))
                through = fold.first - 1
                break
            if fold.first <= through:
                through = max(through, fold.last)
        for fold in folds:
            for c in read.changes:
                if fold.first <= c.index <= fold.last and read.replaced.get(c.subject) in fold.erasures:
                    meta = read.metas.get(c.subject)
                    fold.tables |= set(tables_of(meta) if meta is not None else
                                       self._tables_holding(c.tenant, c.subject))
        return [f for f in folds if f.last <= through], through

    # -- tables -------------------------------------------------------------------------------------

    @property
    def catalog(self) -> Any:
        if self._catalog is None:
            self._catalog = open_catalog(self.config)
        return self._catalog

    def _load(self, key: TableKey) -> _Table | None:
        if key in self._tables:
            return self._tables[key]
        from pyiceberg.exceptions import NoSuchTableError

        if key in self.conflicts:
            raise TableNameConflictError(self.conflicts[key])
        if key in self.stopped:
            raise ForeignChangeError(self.stopped[key])
        name = identifier(key.tenant, key.topic, key.record or None)
        try:
            table = self.catalog.load_table(name)
        except NoSuchTableError:
            return None
        if table.properties.get(TABLE_OWNER) != TABLE_PROPERTIES[TABLE_OWNER]:
            message = (f"Iceberg table {'.'.join(name)} was not created by Shale (no {TABLE_OWNER}=shale property), "
                       f"so topic {key.topic!r} of tenant {key.tenant!r} is not published into it (Shale never writes "
                       "a table it does not own); its rows stay readable through shale query. Drop or rename that "
                       "table, or publish under another catalog.")
            self._conflict(key, message)
        holds = (table.properties.get(TABLE_TOPIC, name[1]), table.properties.get(TABLE_RECORD, ""))
        if holds != (key.topic, key.record):
            message = (f"Iceberg table {'.'.join(name)} holds topic {holds[0]!r}"
                       f"{f' record type {holds[1]!r}' if holds[1] else ''}, so topic {key.topic!r}"
                       f"{f' record type {key.record!r}' if key.record else ''} of tenant {key.tenant!r}, whose "
                       "table would have the same name, is not published (never mixed into it); its rows stay "
                       "readable through shale query. Rename the topic, or publish it under another catalog.")
            self._conflict(key, message)
        foreign = _foreign_change(table)
        if foreign:
            self._stop(key, f"Iceberg table {'.'.join(name)} {foreign}; Shale stops publishing topic {key.topic!r}"
                       f"{f' record type {key.record!r}' if key.record else ''} of tenant {key.tenant!r} into it "
                       "rather than commit over that change, and leaves the snapshot as it is; the topic's rows stay "
                       "readable through shale query. To hand the table back to Shale, roll it back to Shale's "
                       "newest snapshot (Spark: CALL <catalog>.system.rollback_to_snapshot) or drop it without "
                       "purge, then run shale iceberg sync --full.")
        snapshot = table.current_snapshot()
        state = _Table(table, _last_index(table))
        if snapshot is not None:
            for task in table.scan().plan_files():
                state.files[task.file.file_path] = task.file
                state.blocks[block_of(task.file.file_path)].add(task.file.file_path)
        self._tables[key] = state
        return state

    def _conflict(self, key: TableKey, message: str) -> None:
        self.conflicts[key] = message
        CONFLICTS.set(len(self.conflicts))
        log.error("iceberg table name taken", extra={"tenant": key.tenant, "topic": key.topic,
                                                    "record": key.record, "error": message})
        raise TableNameConflictError(message)

    def _stop(self, key: TableKey, message: str) -> None:
        self.stopped[key] = message
        STOPPED.set(len(self.stopped))
        log.error("iceberg table changed by another writer", extra={"tenant": key.tenant, "topic": key.topic,
                                                                   "record": key.record, "error": message})
        raise ForeignChangeError(message)

    def _create(self, key: TableKey) -> _Table:
        """A table of the base columns; each commit adds the parser's columns its files hold (``_evolve``)."""
        namespace, name = identifier(key.tenant, key.topic, key.record or None)
        self.catalog.create_namespace_if_not_exists(namespace)
        named = {TABLE_TOPIC: key.topic, TABLE_RECORD: key.record} if key.record else {}
        table = self.catalog.create_table((namespace, name), schema=table_schema([]),
                                          properties={**TABLE_PROPERTIES, **named})
        from pyiceberg.table import TableProperties

        with table.transaction() as tx:  # a name mapping: Shale's Parquet objects carry no Iceberg field ids
            tx.set_properties({TableProperties.DEFAULT_NAME_MAPPING: table.schema().name_mapping.model_dump_json()})
        state = _Table(table, 0)
        self._tables[key] = state
        log.info("iceberg table created", extra={"tenant": key.tenant, "topic": key.topic, "record": key.record})
        return state

    def _start(self, read: _Read) -> int:
        """First round: every table of every live block exists, created with its state at the published point
        when the feed no longer holds its history."""
        keys = sorted({k for blocks in read.live.values() for m in blocks.values() for k in tables_of(m)})
        committed = 0
        for key in keys:
            before = [c for c in read.changes if c.tenant == key.tenant]
            try:
                state = self._load(key)
                if state is not None:
                    if state.last_index < read.published:  # it may have missed trimmed entries (a failing table)
                        committed += self._repair(read, key, read.published, before)
                    continue
                blocks = blocks_at(read.live[key.tenant], read.metas, before)
                files = desired(blocks.values(), key, rules_at(read.rules.get(key.tenant, []), key.topic, before),
                                self.config.ingest.generation)
                self._create(key)
                specs = [s for f in files.values() for s in f]
                if specs:
                    committed += self._commit_retried(key, read.published, partial(_not_held, specs))
            except NOT_WRITTEN:
                continue  # logged once; its blocks are left out
            except Exception as exc:
                self._fail(key, read.published, exc)
        self._started = True
        return committed

    # -- publishing -----------------------------------------------------------------------------------

    def _publish(self, read: _Read, through: int, folds: Sequence[_Fold] = ()) -> int:
        committed = 0
        entries = [(i, list(g)) for i, g in groupby(read.changes, key=lambda c: c.index)]
        for n, (index, changes) in enumerate(entries):
            if index > through:
                break
            after = [c for _, g in entries[n + 1:] for c in g]
            touched = self._touched(read, changes)
            erasing: dict[TableKey, _Fold] = {}
            for fold in folds:  # a table an erasure rewrites: one snapshot at the run's last entry
                for key in fold.tables:
                    if fold.first <= index < fold.last:
                        touched.pop(key, None)
                    elif index == fold.last:
                        touched[key] = ([], [], True)
                        erasing[key] = fold
            for key, (removed, added, switched) in sorted(touched.items()):
                if key in self.failing:  # brought up to date by its repair at its next try (_retry)
                    if key in erasing:
                        self.failing.missed(key, erasing[key].erasures)
                    continue
                later = [c for c in after if c.tenant == key.tenant]
                rules = rules_at(read.rules.get(key.tenant, []), key.topic, later)

                def plan(state: _Table, key: TableKey = key, removed: list[str] = removed,
                         added: list[BlockMeta] = added, switched: bool = switched, rules: list[Rule] = rules,
                         later: list[BlockChange] = later) -> tuple[list[str], list[FileSpec]]:
                    if switched:
                        return self._rediff(read, key, state, rules, later)
                    return (sorted(u for b in removed for u in state.blocks.get(b, ())),
                            [s for m in added if m.id not in state.blocks
                             for s in table_files(m, key.topic, rules, self.config.ingest.generation, key.record)])

                try:
                    committed += self._commit_retried(key, index, plan, erased=self._erased(read, erasing.get(key)))
                except NOT_WRITTEN:
                    continue  # logged once; its blocks are left out
                except Exception as exc:
                    self._fail(key, index, exc, erasing[key].erasures if key in erasing else set())
        return committed

    # -- one table's failure ----------------------------------------------------------------------------

    def _fail(self, key: TableKey, index: int, exc: Exception, erasures: AbstractSet[str] = frozenset()) -> None:
        """Entry ``index`` could not be published to ``key``: the table is set aside (logged, counted, in the status)
        and retried with a backoff, while every other table is published and the feed trimmed. Unless the catalog
        itself does not answer: then no table can be published, and the round fails as a whole (nothing trimmed)."""
        try:
            self.catalog.list_namespaces()
        except Exception:
            raise exc from None  # the catalog's own failure: every table's, so the round's
        self._tables.pop(key, None)  # reloaded from the catalog at its retry
        failure = self.failing.record(key, index, exc, self.clock(), erasures)
        log.error("iceberg: table %s/%s%s not published from entry %d (%s); the other tables go on, this one is "
                  "tried again in %.0f s (failure %d in a row)", key.tenant, key.topic,
                  f" record {key.record}" if key.record else "", failure.since, failure.error, failure.delay,
                  failure.failures, exc_info=exc, extra={"tenant": key.tenant, "topic": key.topic,
                                                         "record": key.record, "index": index, "error": failure.error})

    def _retry(self, read: _Read, through: int, due: Sequence[TableKey]) -> int:
        """Bring each failing table whose retry is due to the index's state as of ``through``, in one snapshot."""
        committed = 0
        for key in due:
            if key not in self.failing:
                continue
            later = [c for c in read.changes if c.index > through and c.tenant == key.tenant]
            try:
                committed += self._repair(read, key, through, later)
            except NOT_WRITTEN:
                self.failing.clear(key)
                continue
            except Exception as exc:
                self._fail(key, through, exc)
                continue
            failure = self.failing.clear(key)
            log.info("iceberg: table %s/%s published again after %d failures", key.tenant, key.topic,
                     failure.failures if failure else 0, extra={"tenant": key.tenant, "topic": key.topic})
        return committed

    def _repair(self, read: _Read, key: TableKey, index: int, later: list[BlockChange]) -> int:
        """One snapshot at ``index`` that makes the table hold what the index shows as of it (``later``: the feed's
        changes after it), naming the erasures it missed while failing. Nothing is committed when it already does."""
        failure = self.failing.get(key)
        missed = failure.erasures if failure else set()
        rules = rules_at(read.rules.get(key.tenant, []), key.topic, later)
        erased = None
        if missed:
            def meta(block_id: str) -> BlockMeta | None:
                live = read.live.get(key.tenant, {})
                return live[block_id] if block_id in live else self.reader.change_metas([block_id]).get(block_id)

            state = self._load(key) or self._create(key)
            erased = (sorted(missed), suspect(missed, self.reader.erasure_rewrites(sorted(state.blocks)), meta,
                                              self.reader.erased_positions(sorted(missed))))
        return self._commit_retried(key, index, partial(self._rediff_plan, read, key, rules, later), erased=erased)

    def _rediff_plan(self, read: _Read, key: TableKey, rules: list[Rule], later: Sequence[BlockChange],
                     state: _Table) -> tuple[list[str], list[FileSpec]]:
        return self._rediff(read, key, state, rules, later)

    def _erased(self, read: _Read, fold: _Fold | None) -> tuple[list[str], Callable[[str], bool]] | None:
        """For a table's snapshot that publishes erasures: their ids, and which blocks' files may hold one of
        their records (``shale.iceberg.erasure.suspect``)."""
        if fold is None:
            return None
        known = {i: m for blocks in read.live.values() for i, m in blocks.items()}

        def meta(block_id: str) -> BlockMeta | None:
            if block_id not in known:
                known[block_id] = self.reader.change_metas([block_id]).get(block_id)  # type: ignore[assignment]
            return known[block_id]

        positions = self.reader.erased_positions(sorted(fold.erasures))
        return sorted(fold.erasures), suspect(fold.erasures, read.replaced, meta, positions)

    def _commit_retried(self, key: TableKey, index: int,
                        plan: Callable[[_Table], tuple[list[str], list[FileSpec]]], repair: bool = False,
                        erased: tuple[list[str], Callable[[str], bool]] | None = None) -> int:
        """Commit entry ``index``'s change to a table: ``plan`` gives the files to remove and add, from the table as
        loaded. Another writer advancing the table between our load and our commit (a REST catalog answers 409, a
        SQL catalog finds its row moved: ``CommitFailedException``) commits nothing of ours, so the table is loaded
        again and the change planned again against it; a commit whose outcome is unknown (the catalog answered 5xx)
        is checked the same way, and if the table already records the entry (``shale.applied-index`` in its
        snapshots) nothing more is committed. Either way the change is at most one snapshot. A ``repair`` (a full
        sync) is planned against the table whatever it records."""
        from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException

        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            state = self._load(key) or self._create(key)
            if not repair and index and index <= state.last_index:
                return 0  # published before a crash, by a previous leader, or by our own unanswered commit
            remove, add = plan(state)
            if not remove and not add:
                if erased is not None:  # the table shows none of the erasure's blocks; older snapshots still may
                    current = state.table.current_snapshot()
                    self._expired_now(key, expire(state.table, [
                        i for i in tainted(state.table, erased[1]) if current is None or i != current.snapshot_id]))
                return 0
            try:
                return self._commit(key, state, index, remove, add, erased)
            except (CommitFailedException, CommitStateUnknownException) as exc:
                self._tables.pop(key, None)
                RETRIES.inc()
                if attempt == COMMIT_ATTEMPTS:
                    raise
                log.warning("iceberg commit of entry %d to %s/%s not accepted (%s: %s); reloading the table and "
                            "trying again (%d of %d)", index, key.tenant, key.topic, type(exc).__name__, exc,
                            attempt + 1, COMMIT_ATTEMPTS,
                            extra={"tenant": key.tenant, "topic": key.topic, "index": index})
        raise AssertionError("unreachable")

    def _touched(self, read: _Read, changes: list[BlockChange],
                 ) -> dict[TableKey, tuple[list[str], list[BlockMeta], bool]]:
        """Per table: blocks removed, blocks added, and whether its generation switches changed."""
        out: dict[TableKey, tuple[list[str], list[BlockMeta], bool]] = {}

        def entry(key: TableKey) -> tuple[list[str], list[BlockMeta], bool]:
            return out.setdefault(key, ([], [], False))

        for c in changes:
            if c.change == "generations":  # every table of the topic: one per record type it holds
                for key in self._topic_tables(read, c.tenant, c.subject):
                    removed, added, _ = entry(key)
                    out[key] = (removed, added, True)
                continue
            meta = read.metas.get(c.subject)
            keys = tables_of(meta) if meta is not None else self._tables_holding(c.tenant, c.subject)
            for key in keys:
                if c.change == "add" and meta is not None:
                    entry(key)[1].append(meta)
                elif c.change == "remove":
                    entry(key)[0].append(c.subject)
        return out

    def _topic_tables(self, read: _Read, tenant: str, topic: str) -> list[TableKey]:
        """The tables of a tenant's topic: its one table, or one per record type its live blocks or loaded tables
        hold."""
        keys = {k for m in read.live.get(tenant, {}).values() for k in tables_of(m) if k.topic == topic}
        keys |= {k for k in self._tables if k.tenant == tenant and k.topic == topic}
        return sorted(keys) or [TableKey(tenant, topic)]

    def _catalog_tables(self, tenant: str) -> list[TableKey]:
        """Every table of the tenant in the catalog, each loaded, by what it holds (a record type's table says so
        in its properties)."""
        keys = []
        for namespace, name in self.catalog.list_tables(tenant):
            key = next((k for k in self._tables if identifier(k.tenant, k.topic, k.record or None) ==
                        (namespace, name)), None)
            if key is None:
                properties = self.catalog.load_table((namespace, name)).properties
                key = TableKey(namespace, properties.get(TABLE_TOPIC, name), properties.get(TABLE_RECORD, ""))
                with contextlib.suppress(*NOT_WRITTEN):
                    self._load(key)
            keys.append(key)
        return keys

    def _tables_holding(self, tenant: str, block_id: str) -> list[TableKey]:
        """Tables holding a block whose metadata is gone (the publisher lagged past the delete delay)."""
        self._catalog_tables(tenant)
        return [k for k, t in self._tables.items() if k.tenant == tenant and block_id in t.blocks]

    def _rediff(self, read: _Read, key: TableKey, state: _Table, rules: list[Rule],
                later: Sequence[BlockChange]) -> tuple[list[str], list[FileSpec]]:
        """After a generation switch: the files to remove and to add so that the table shows what the switches
        show, as of this entry."""
        blocks = blocks_at(read.live[key.tenant], read.metas, [c for c in later if c.tenant == key.tenant])
        want = desired(blocks.values(), key, rules, self.config.ingest.generation)
        remove: list[str] = []
        add: list[FileSpec] = []
        for block_id in sorted(set(state.blocks) | set(want)):
            have = state.blocks.get(block_id, set())
            specs = want.get(block_id, [])
            if have and specs and all(have & self._uris(s) for s in specs) and len(have) == len(specs):
                continue
            remove += sorted(have)
            add += specs
        return remove, add

    def _uris(self, spec: FileSpec) -> set[str]:
        """The URIs that hold exactly ``spec``'s rows: its object (when whole) or its copy."""
        uris = {object_uri(self.config.bucket, copy_key(spec.block.tenant, spec.copy_name()))}
        if spec.intervals is None:
            uris.add(object_uri(self.config.bucket, block_file_key(spec.block, spec.dataset.file)))
        return uris

    def _commit(self, key: TableKey, state: _Table, index: int, remove: list[str], add: list[FileSpec],
                erased: tuple[list[str], Callable[[str], bool]] | None = None) -> int:
        """One snapshot: ``remove`` and ``add`` at log entry ``index`` (schema evolved first, same commit). With
        ``erased`` (erasures, and which blocks may hold their records), the snapshot names the erasures and the
        older snapshots naming such a block's file, which are then expired (``shale.iceberg.erasure``)."""
        table = state.table
        # pyiceberg retries a commit the catalog refused by replaying the change onto whatever the other writer
        # committed; were that writer a previous leader that published this very entry, the replay would publish it
        # twice. Shale retries itself (_commit_retried), so pyiceberg's retry is off for its commits: a property of
        # the in-memory metadata only (the catalog applies the updates to its own copy of the table).
        table.metadata = table.metadata.model_copy(
            update={"properties": {**table.metadata.properties, "commit.retry.num-retries": "0"}})
        released = [key_of(self.config.bucket, u) for u in remove if is_copy(u)]
        properties = {SUMMARY_INDEX: str(index)}
        if erased is not None:
            doomed = tainted(table, erased[1])
            properties[SUMMARY_ERASURES] = json.dumps(erased[0])
            properties[SUMMARY_EXPIRES] = json.dumps(doomed)
            if delay := self.reader.erasure_delete_delay_ms(erased[0]):
                properties[SUMMARY_DELETE_DELAY] = str(delay)
            released += [k for s in table.metadata.snapshots if s.snapshot_id in doomed
                         and s.timestamp_ms > state.swept_ms for k in json.loads(_summary(s, SUMMARY_RELEASED) or "[]")
                         if isinstance(k, str) and k not in released]
        if released:
            properties[SUMMARY_RELEASED] = json.dumps(released)
        with table.transaction() as tx:
            stale = {k: v for k, v in METRICS_PROPERTIES.items() if tx.table_metadata.properties.get(k) != v}
            if stale:  # a table created before them: files registered from now on keep no content bounds
                tx.set_properties(stale)
            add = self._evolve(key, tx, add)
            if not remove and not add:
                return 0  # every file refused (logged): nothing to commit
            registered = [register(self.bucket, self.config.bucket, tx.table_metadata, s) for s in add]
            COPIES.inc(sum(1 for r in registered if r.copy))
            update = tx.update_snapshot(snapshot_properties=properties)
            with (update.overwrite() if remove else update.merge_append()) as producer:
                for uri in remove:
                    producer.delete_data_file(state.files[uri])
                for r in registered:
                    producer.append_data_file(r.data_file)
        for uri in remove:
            del state.files[uri]
            state.blocks[block_of(uri)].discard(uri)
            if not state.blocks[block_of(uri)]:
                del state.blocks[block_of(uri)]
        for r in registered:
            state.files[r.uri] = r.data_file
            state.blocks[block_of(r.uri)].add(r.uri)
        state.last_index = index
        if erased is not None:
            self._expire_erased()
        SNAPSHOTS.labels("overwrite" if remove and add else "delete" if remove else "append").inc()
        log.info("iceberg snapshot committed", extra={"tenant": key.tenant, "topic": key.topic, "index": index,
                                                      "added": len(add), "removed": len(remove)})
        return 1

    def _evolve(self, key: TableKey, tx: Any, add: list[FileSpec]) -> list[FileSpec]:
        """Evolve the table's schema (in ``tx``) so it holds each file's columns with their types, oldest file
        first, by name (pyiceberg's ``union_by_name``: field ids kept, new ones fresh, the name mapping updated);
        return the files the table can take. A file whose column types conflict with the table's is left out,
        logged and counted (``shale_iceberg_refused_files_total``): the table stays readable and unchanged for it.
        So is a file holding a type Iceberg has none for (a decimal of more than 38 digits: ``unrepresentable``)."""
        taken: list[FileSpec] = []
        for spec in sorted(add, key=lambda s: (s.dataset.min_time, s.block.id)):
            d = spec.dataset
            arrow = table_schema(d.columns, decode_column_types(d.column_types))
            problems = unrepresentable(arrow)
            wanted = None if problems else iceberg_schema(arrow)
            problems = problems or conflicts(tx.table_metadata.schema(), wanted)
            if problems:
                REFUSED.inc()
                self.refused += 1
                log.error("iceberg: block %s of %s/%s left out of the table, its column types do not fit it: %s",
                          spec.block.id, key.tenant, key.topic, "; ".join(problems),
                          extra={"tenant": key.tenant, "topic": key.topic, "block": spec.block.id})
                continue
            with tx.update_schema() as evolve:  # no change when the table already holds these types
                evolve.union_by_name(wanted)
            taken.append(spec)
        return taken

    def _sweep(self) -> None:
        """Delete copies released by snapshots older than the delete delay (idempotent: a delete of a missing
        object is a no-op). A released key is deleted only when it is one of its tenant's copies and no table's
        current snapshot holds it: a copy released and added again (a switch A -> B -> A within the delay) stays,
        and a summary written by another catalog writer can name nothing else for deletion. An erasure's snapshot
        that asked for a shorter delay (never below ``erasure_delay_floor``) is swept after that one."""
        now, default = self.clock(), self.config.block.delete_delay
        horizon = int((now - default) * 1000)
        held = {key_of(self.config.bucket, uri) for state in self._tables.values() for uri in state.files}
        for table_key, state in self._tables.items():
            copies = copy_key(table_key.tenant, "")
            for snapshot in state.table.metadata.snapshots:
                asked = int(_summary(snapshot, SUMMARY_DELETE_DELAY) or 0) / 1000
                delay = granted_delete_delay(asked, self.config.erasure_delay_floor, default)
                if not state.swept_ms < snapshot.timestamp_ms <= int((now - delay) * 1000) \
                        or snapshot.snapshot_id in state.swept_early:
                    continue
                if delay < default:
                    state.swept_early.add(snapshot.snapshot_id)
                for key in json.loads(_summary(snapshot, SUMMARY_RELEASED) or "[]"):
                    if not isinstance(key, str) or not key.startswith(copies) or key in held:
                        continue
                    with contextlib.suppress(NotFoundError):
                        self.bucket.delete(key)
            state.swept_ms = max(state.swept_ms, horizon)

    def _expire(self) -> None:
        """Every ``expire_interval``, expire each table's snapshots older than ``snapshot_retention`` that the copy
        sweep has passed (so every copy they released is already deleted), except the newest snapshot Shale wrote
        (it records the published point, 16.4) and every branch or tag head. pyiceberg's expiry removes snapshots
        from the metadata only: no data file is deleted (the catalog's metadata.json shrinks, the blocks stay). A
        refused commit (another writer came first) is tried again at the next expiry."""
        from pyiceberg.exceptions import CommitFailedException

        retention, now = self.config.iceberg.snapshot_retention, self.clock()
        if not retention or now - self._expired_at < self.config.iceberg.expire_interval:
            return
        self._expired_at = now
        for key, state in list(self._tables.items()):
            table = state.table
            keep = {ref.snapshot_id for ref in table.metadata.refs.values()} | {
                getattr(_newest_own(table), "snapshot_id", None)}
            horizon = min(int((now - retention) * 1000), state.swept_ms)
            old = [s.snapshot_id for s in table.metadata.snapshots
                   if s.timestamp_ms < horizon and s.snapshot_id not in keep]
            if not old:
                continue
            try:
                table.maintenance.expire_snapshots().by_ids(old).commit()
            except CommitFailedException:
                self._tables.pop(key, None)  # reloaded at its next change
                continue
            EXPIRED.inc(len(old))
            self.expired += len(old)
            log.info("iceberg snapshots expired", extra={"tenant": key.tenant, "topic": key.topic,
                                                         "snapshots": len(old)})

    def _expire_erased(self) -> None:
        """Expire the snapshots each table's erasure snapshots list and it still holds (right after the erasure's
        snapshot, and at every round until gone: a crash between the two commits leaves none behind)."""
        from pyiceberg.exceptions import CommitFailedException

        for key, state in list(self._tables.items()):
            try:
                self._expired_now(key, expire_listed(state.table))
            except CommitFailedException:
                self._tables.pop(key, None)  # reloaded, and tried again, at its next change

    def _expired_now(self, key: TableKey, gone: list[int]) -> None:
        if gone:
            EXPIRED.inc(len(gone))
            self.expired += len(gone)
            log.info("iceberg snapshots naming erased records expired",
                     extra={"tenant": key.tenant, "topic": key.topic, "snapshots": gone})

    # -- repair -------------------------------------------------------------------------------------

    def sync(self, *, full: bool = False) -> dict[str, Any]:
        """Publish everything pending; with ``full``, then compare every table with the index and commit one
        repair snapshot where they differ (a table rolled back or edited by hand, a catalog restored)."""
        with self._lock:
            return self._sync(full)

    def _sync(self, full: bool) -> dict[str, Any]:
        if full:  # a stopped table is looked at again: written if it is Shale's once more (rolled back, dropped)
            self.stopped.clear()
            STOPPED.set(0)
        committed = 0
        while True:
            before = self.published_through
            committed += self._guarded_round()
            if self.reader.pending_change_entries() == 0 or self.published_through == before:
                break  # published, or held back until an erasure is rewritten (``_erasure_folds``)
        repaired = 0
        if full and self.config.iceberg.enabled:
            read = self._read(whole_tenants=True)
            keys = {k for blocks in read.live.values() for m in blocks.values() for k in tables_of(m)}
            for tenant in read.live:
                keys |= set(self._catalog_tables(tenant))
            for key in sorted(keys):
                try:
                    state = self._load(key) or self._create(key)
                    remove, add = self._rediff(read, key, state, read.rules.get(key.tenant, []), [])
                    if remove or add:
                        repaired += self._commit(key, state, max(read.applied, state.last_index), remove, add)
                except NOT_WRITTEN:
                    continue
                except Exception as exc:
                    self._fail(key, read.applied, exc)
                    continue
                failure = self.failing.get(key)
                if failure is not None and not failure.erasures:
                    self.failing.clear(key)  # repaired
        return {"snapshots": committed + repaired, "repaired": repaired, "published_through": self.published_through,
                "tables": len(self._tables)}

    def status(self) -> dict[str, Any]:
        return {"enabled": self.config.iceberg.enabled, "published_through": self.published_through,
                "applied_index": self.applied, "tables": len(self._tables), "last_error": self.last_error,
                "refused_files": self.refused, "expired_snapshots": self.expired,
                "table_name_conflicts": sorted(self.conflicts.values()),
                "stopped_tables": sorted(self.stopped.values()),
                "failing_tables": self.failing.rows(self.clock()),
                "lag_seconds": self.clock() - min(self._first_seen.values()) if self._first_seen else 0.0}

    def loop(self, stop: threading.Event, is_leader: Callable[[], bool] = lambda: True) -> None:
        """Run rounds every ``iceberg.interval`` while leader, until ``stop``. A follower forgets its tables (the
        next leadership reloads them from the catalog, which another leader may have changed) and its failing ones
        (a leader's first round repairs every table older than the published point)."""
        while not stop.is_set():
            try:
                if is_leader():
                    self.run_once()
                else:
                    self._tables.clear()
                    self._started = False
                    self.failing = FailingTables()  # the next leader repairs them at its start (_start)
            except Exception:
                log.exception("iceberg publisher round failed; retrying next period")
            stop.wait(self.config.iceberg.interval)


def _not_held(specs: list[FileSpec], state: _Table) -> tuple[list[str], list[FileSpec]]:
    """A plan adding those of ``specs`` whose block the table does not hold yet."""
    return [], [s for s in specs if s.block.id not in state.blocks]


def _newest_own(table: Any) -> Any:
    """The newest snapshot Shale wrote among the current snapshot and its ancestors (None if there is none)."""
    from pyiceberg.table.snapshots import ancestors_of

    for snapshot in ancestors_of(table.current_snapshot(), table.metadata):
        if _summary(snapshot, SUMMARY_INDEX) is not None:
            return snapshot
    return None


def _foreign_change(table: Any) -> str:
    """What snapshots Shale did not write, on top of its newest one, changed in the table's rows ('' if nothing:
    an empty commit, manifests rewritten, properties set). Rows are changed by delete files (position or equality
    deletes, deletion vectors: Shale writes none) and by data files other than those Shale's snapshot held (an
    engine's copy-on-write DELETE, ``rewrite_data_files``, an INSERT)."""
    current = table.current_snapshot()
    if current is None or _summary(current, SUMMARY_INDEX) is not None:
        return ""
    own = _newest_own(table)
    data, deletes = _contents(table, current)
    held = _contents(table, own)[0] if own is not None else set()
    if not deletes and data == held:
        return ""
    from pyiceberg.table.snapshots import ancestors_between_ids

    theirs = list(ancestors_between_ids(own and own.snapshot_id, current.snapshot_id, table.metadata))
    described = ", ".join(f"{s.snapshot_id} ({_what(s)})" for s in theirs[:3])
    if len(theirs) > 3:
        described += f" and {len(theirs) - 3} more"
    changes = [f"{deletes} delete file{'s' * (deletes != 1)}"] if deletes else []
    if data - held or held - data:
        changes.append(f"data files: {len(data - held)} added, {len(held - data)} of Shale's removed")
    return (f"has snapshots Shale did not write that change its rows: {described}, on top of Shale's "
            f"{own.snapshot_id if own else 'none'} ({' and '.join(changes)})")


def _what(snapshot: Any) -> str:
    """A snapshot's operation and the engine that wrote it, when its summary says."""
    operation = snapshot.summary.operation.value if snapshot.summary else "?"
    engine = _summary(snapshot, "engine-name")
    return f"{operation}, {engine}" if engine else operation


def _contents(table: Any, snapshot: Any) -> tuple[set[str], int]:
    """A snapshot's live data files (their URIs) and how many delete files it holds, from its manifests (a scan's
    plan would refuse equality deletes)."""
    from pyiceberg.manifest import ManifestContent

    data: set[str] = set()
    deletes = 0
    for manifest in snapshot.manifests(table.io):
        entries = manifest.fetch_manifest_entry(table.io, discard_deleted=True)
        if manifest.content == ManifestContent.DELETES:
            deletes += len(entries)
        else:
            data |= {e.data_file.file_path for e in entries}
    return data, deletes


def _last_index(table: Any) -> int:
    """The newest log entry the table's snapshots record: its current snapshot's, or, when another writer's
    snapshot came after Shale's (a user's maintenance, say), that of the newest of its ancestors Shale wrote."""
    own = _newest_own(table)
    return 0 if own is None else int(_summary(own, SUMMARY_INDEX) or 0)


def _summary(snapshot: Any, key: str) -> str | None:
    """A snapshot summary property (pyiceberg's ``Summary.get`` ignores a default)."""
    summary = snapshot.summary
    return None if summary is None else summary.additional_properties.get(key)
