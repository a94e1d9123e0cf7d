"""Queries on the index: blocks by tenant, data time range and label matchers; label names and values
(seed 004's two query APIs); offsets, tombstones and partitions.

A query first selects the partitions of the tenants whose data-time range overlaps the query, then the blocks
of those partitions that overlap it, then matches label sets. Blocks are returned with only the datasets whose
labels match, so a reader fetches only those objects.
"""

from __future__ import annotations

import contextlib
import hashlib
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import msgpack

from shale.block import MORE_LABEL_SETS, BlockMeta, block_prefix
from shale.errors import QueryTimeoutError
from shale.index import erasures as erasure_store
from shale.index import generations as generation_store
from shale.index import offsets as offset_store
from shale.index.changes import BlockChange, change_metas, pending_entries, published_through, read_changes
from shale.index.matchers import Matcher, match_label_sets, matching_datasets
from shale.index.records import (
    IncarnationRow,
    LossRow,
    OffsetRow,
    PartitionRow,
    SchemaVersionRow,
    TombstoneRow,
    decode_meta,
)
from shale.index.schema import PARTITION_WINDOW_MS

# SQLite calls the progress handler every this many virtual-machine instructions (well under a millisecond).
PROGRESS_STEPS = 10_000
HASHED_TABLES = ("state", "strings", "partitions", "blocks", "tombstones", "tenant_versions", "offsets", "commits",
                 "settings", "compaction_jobs", "compaction_polls", "generations", "generation_pins", "incarnations",
                 "losses", "block_changes", "ingest_leases", "ingest_shards", "restores", "block_schemas",
                 "ingest_placement", "ingest_load", "erasures", "erasure_positions", "erasure_blocks")
DERIVED_TABLES = ("tenant_digests",)
"""Tables computed from hashed ones, left out of ``state_hash``: a replica upgraded later fills them later (each
tenant's set hash is computed from its blocks at its first change after the upgrade)."""


def _tombstone(r: tuple[Any, ...]) -> TombstoneRow:
    meta = decode_meta(r[6])
    return TombstoneRow(seq=r[0], block_id=r[1], tenant=r[2], shard=r[3], created_at=r[4], reason=r[5],
                        files=[f.name for f in meta.files], prefix=block_prefix(meta), delay_ms=r[7])


class IndexReader:
    """Read-only queries. Thread-safe: each thread gets its own connection from ``connect``."""

    def __init__(self, connect: Callable[[], sqlite3.Connection]) -> None:
        self._connect = connect
        self._local = threading.local()
        self._strings: dict[int, str] = {}
        self._strings_lock = threading.Lock()

    @property
    def conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self._connect()
        assert isinstance(conn, sqlite3.Connection)
        return conn

    def forget_cache(self) -> None:
        """After the whole state was replaced (a restore), ids may name other strings."""
        with self._strings_lock:
            self._strings.clear()

    def _string(self, sid: int) -> str:
        value = self._strings.get(sid)
        if value is None:
            # Strings are never changed once written, so the cache goes stale only when the whole state is
            # replaced by another (``forget_cache``).
            row = self.conn.execute("SELECT value FROM strings WHERE id = ?", (sid,)).fetchone()
            value = str(row[0])
            with self._strings_lock:
                self._strings[sid] = value
        return value

    def _sid(self, value: str) -> int | None:
        row = self.conn.execute("SELECT id FROM strings WHERE value = ?", (value,)).fetchone()
        return int(row[0]) if row else None

    def applied(self) -> tuple[int, int]:
        rows = dict(self.conn.execute("SELECT key, value FROM state WHERE key IN ('applied_index', 'applied_term')"))
        return int(rows.get("applied_index", 0)), int(rows.get("applied_term", 0))

    @contextlib.contextmanager
    def _deadline(self, timeout: float | None) -> Iterator[Callable[[], None]]:
        """Bound one query: SQLite statements on this thread's connection are interrupted past the deadline, and
        the returned ``check`` (called once per candidate block) stops the Python loop; both raise
        ``QueryTimeoutError``. ``timeout`` None means no bound."""
        if timeout is None:
            yield lambda: None
            return
        deadline = time.monotonic() + timeout
        message = (f"the query ran longer than {timeout:g}s (metastore.query_timeout) and was stopped; narrow its "
                   "time range, tenants or selector")

        def check() -> None:
            if time.monotonic() > deadline:
                raise QueryTimeoutError(message)

        conn = self.conn
        conn.set_progress_handler(lambda: int(time.monotonic() > deadline), PROGRESS_STEPS)
        try:
            yield check
        except sqlite3.OperationalError as exc:
            if "interrupt" in str(exc):
                raise QueryTimeoutError(message) from None
            raise
        finally:
            conn.set_progress_handler(None, 0)

    # -- blocks -----------------------------------------------------------------------------------

    def _candidates(self, tenants: Sequence[str], start: int, end: int, group: str | None,
                    ) -> Iterator[tuple[str, int, bytes, bytes]]:
        sids = [s for s in (self._sid(t) for t in tenants) if s is not None]
        if not sids:
            return
        marks = ",".join("?" * len(sids))
        partitions = [r[0] for r in self.conn.execute(
            f"SELECT id FROM partitions WHERE tenant IN ({marks}) AND max_time >= ? AND min_time <= ?",
            (*sids, start, end))]
        if not partitions:
            return
        group_sql, params = "", []
        if group is not None:
            gsid = self._sid(group)
            if gsid is None:
                return
            group_sql, params = " AND grp = ?", [gsid]
        pmarks = ",".join("?" * len(partitions))
        yield from self.conn.execute(
            f"SELECT id, grp, labels, meta FROM blocks WHERE partition_id IN ({pmarks}) AND min_time <= ? "
            f"AND max_time >= ?{group_sql} ORDER BY id", (*partitions, end, start, *params))

    def _datasets(self, group_sid: int, labels_blob: bytes) -> list[tuple[int, int, int, list[dict[str, str]]]]:
        """Per dataset: (min_time, max_time, index, label sets with the implicit topic, kind and group labels)."""
        group = self._string(group_sid)
        out = []
        for i, (topic, kind, low, high, sets) in enumerate(msgpack.unpackb(labels_blob)):
            implicit = {"topic": self._string(topic), "kind": self._string(kind), "group": group}
            label_sets = [implicit | {self._string(f[j]): self._string(f[j + 1]) for j in range(0, len(f), 2)}
                          for f in sets] or [implicit]
            out.append((low, high, i, label_sets))
        return out

    def query_blocks(self, tenants: Sequence[str], start: int, end: int, matchers: Sequence[Matcher] = (),
                     group: str | None = None, timeout: float | None = None) -> list[BlockMeta]:
        """Blocks of ``tenants`` whose data overlaps ``[start, end]`` (ms, inclusive) with at least one dataset
        matching ``matchers``; each returned with only its matching datasets. Labels are matched first, from
        the compact label column; only matching blocks' metadata is decoded. Past ``timeout`` seconds the query
        stops with ``QueryTimeoutError``."""
        out: list[BlockMeta] = []
        with self._deadline(timeout) as check:
            for _, group_sid, labels_blob, meta_blob in self._candidates(tenants, start, end, group):
                check()
                keep = matching_datasets([(low, high, sets) for low, high, _, sets in
                                          self._datasets(group_sid, labels_blob)], start, end, matchers)
                if not keep:
                    continue
                meta = decode_meta(meta_blob)
                if len(keep) != len(meta.datasets):
                    meta = meta.model_copy(update={"datasets": [meta.datasets[i] for i in keep]})
                out.append(meta)
        return out

    def label_names(self, tenants: Sequence[str], start: int, end: int,
                    matchers: Sequence[Matcher] = (), timeout: float | None = None) -> list[str]:
        names: set[str] = set()
        with self._deadline(timeout) as check:
            for _, group_sid, labels_blob, _ in self._candidates(tenants, start, end, None):
                check()
                for _, _, _, sets in self._datasets(group_sid, labels_blob):
                    for ls in sets:
                        if match_label_sets([ls], matchers):
                            names.update(n for n in ls if n != MORE_LABEL_SETS)
        return sorted(names)

    def label_values(self, name: str, tenants: Sequence[str], start: int, end: int,
                     matchers: Sequence[Matcher] = (), timeout: float | None = None) -> list[str]:
        values: set[str] = set()
        with self._deadline(timeout) as check:
            for _, group_sid, labels_blob, _ in self._candidates(tenants, start, end, None):
                check()
                for _, _, _, sets in self._datasets(group_sid, labels_blob):
                    for ls in sets:
                        if name in ls and match_label_sets([ls], matchers):
                            values.add(ls[name])
        return sorted(values)

    def get_block(self, block_id: str) -> BlockMeta | None:
        row = self.conn.execute("SELECT meta FROM blocks WHERE id = ?", (block_id,)).fetchone()
        return decode_meta(row[0]) if row else None

    def tenant_block_ids(self, tenant: str) -> set[str]:
        sid = self._sid(tenant)
        return set() if sid is None else {r[0] for r in self.conn.execute("SELECT id FROM blocks WHERE tenant = ?",
                                                                           (sid,))}

    def tenant_blocks(self, tenant: str, *, after: str = "", limit: int | None = None) -> list[BlockMeta]:
        """A tenant's blocks in id order; with ``limit``, the first ``limit`` whose id sorts after ``after``."""
        sid = self._sid(tenant)
        if sid is None:
            return []
        return [decode_meta(r[0]) for r in self.conn.execute(
            "SELECT meta FROM blocks WHERE tenant = ? AND id > ? ORDER BY id LIMIT ?",
            (sid, after, -1 if limit is None else limit))]

    def tenants(self) -> list[str]:
        return sorted({self._string(r[0]) for r in self.conn.execute("SELECT DISTINCT tenant FROM partitions")})

    def count_blocks(self, tenant: str | None = None) -> int:
        if tenant is None:
            return int(self.conn.execute("SELECT count(*) FROM blocks").fetchone()[0])
        sid = self._sid(tenant)
        return 0 if sid is None else int(
            self.conn.execute("SELECT count(*) FROM blocks WHERE tenant = ?", (sid,)).fetchone()[0])

    def partitions(self, tenant: str | None = None) -> list[PartitionRow]:
        rows = self.conn.execute(
            "SELECT s.value, p.shard, p.window_start, p.min_time, p.max_time, p.blocks FROM partitions p "
            "JOIN strings s ON p.tenant = s.id ORDER BY s.value, p.shard, p.window_start")
        return [PartitionRow(tenant=r[0], shard=r[1], window_start=r[2], window_end=r[2] + PARTITION_WINDOW_MS,
                             min_time=r[3], max_time=r[4], blocks=r[5])
                for r in rows if tenant is None or r[0] == tenant]

    def partition_blocks(self, tenant: str, shard: int, window_start: int, data_until: int = 2**62) -> list[str]:
        """The partition's blocks whose data ends at or before ``data_until`` (ms; default: all of them)."""
        return [r[0] for r in self.conn.execute(
            "SELECT b.id FROM blocks b JOIN partitions p ON b.partition_id = p.id JOIN strings s ON p.tenant = s.id "
            "WHERE s.value = ? AND p.shard = ? AND p.window_start = ? AND b.max_time <= ? ORDER BY b.id",
            (tenant, shard, window_start, data_until))]

    # -- offsets and tombstones ------------------------------------------------------------------

    def offsets(self, group: str | None = None, generation: int | None = None) -> list[OffsetRow]:
        return offset_store.offset_rows(self.conn, group, generation)

    def incarnations(self, group: str | None = None, generation: int | None = None) -> list[IncarnationRow]:
        """Past incarnations of topic-partitions (the current one is in ``offsets``)."""
        return offset_store.incarnation_rows(self.conn, group, generation)

    def losses(self, group: str | None = None, generation: int | None = None) -> list[LossRow]:
        """Offset ranges acknowledged as lost."""
        return offset_store.loss_rows(self.conn, group, generation)

    def tombstones(self, created_before: int | None = None, limit: int = 1000) -> list[TombstoneRow]:
        rows = self.conn.execute(
            "SELECT seq, block_id, tenant, shard, created_at, reason, meta, delay_ms FROM tombstones "
            "WHERE created_at <= ? ORDER BY seq LIMIT ?", (created_before if created_before is not None else 2**62,
                                                             limit))
        return [_tombstone(r) for r in rows]

    def level_histogram(self, bucket_ms: int) -> list[tuple[str, int, int, int]]:
        """Live blocks counted per (tenant, level, bucket of data start time): the status page's chart."""
        rows = self.conn.execute(
            "SELECT s.value, b.level, b.min_time / ? * ?, count(*) FROM blocks b JOIN strings s ON b.tenant = s.id "
            "GROUP BY s.value, b.level, b.min_time / ? ORDER BY 1, 2, 3", (bucket_ms, bucket_ms, bucket_ms))
        return [(r[0], int(r[1]), int(r[2]), int(r[3])) for r in rows]

    def tenant_totals(self) -> list[tuple[str, int, int, int]]:
        """Per tenant: live blocks, rows and bytes."""
        rows = self.conn.execute(
            "SELECT s.value, count(*), sum(b.rows), sum(b.size) FROM blocks b JOIN strings s ON b.tenant = s.id "
            "GROUP BY s.value ORDER BY 1")
        return [(r[0], int(r[1]), int(r[2] or 0), int(r[3] or 0)) for r in rows]

    def tenant_versions(self) -> dict[str, int]:
        """Per tenant, the log index of the last change to its blocks or tombstones (for the bucket-index writer)."""
        return {r[0]: int(r[1]) for r in self.conn.execute("SELECT tenant, version FROM tenant_versions")}

    def generation_rules(self, tenant: str) -> list[tuple[str, int, int, int]]:
        """The tenant's generation switches, oldest first: (topic, start ms, end ms, generation)."""
        return generation_store.rules(self.conn, tenant)

    def schema_versions(self, tenant: str, topic: str | None = None) -> list[SchemaVersionRow]:
        """The writer schemas the tenant's live blocks were written with (typed parsers), per topic, group and
        generation (the ``block_schemas`` index, filled as blocks are added)."""
        # The record type of a topic of several (``Dataset.record``) is read from the metadata of the block's dataset
        # that holds the schema id: one schema is of one type, so it never splits a group.
        rows = self.conn.execute(
            "SELECT t.value, bs.schema_id, bs.fingerprint, g.value, b.generation, count(*), min(b.min_time), "
            "max(b.max_time), max((SELECT json_extract(d.value, '$.record') "
            "FROM json_each(CAST(b.meta AS TEXT), '$.datasets') d, json_each(d.value, '$.schema_ids') s "
            "WHERE s.value = bs.schema_id AND json_extract(d.value, '$.topic') = t.value LIMIT 1)) "
            "FROM block_schemas bs JOIN blocks b ON b.id = bs.block_id "
            "JOIN strings t ON t.id = bs.topic JOIN strings g ON g.id = b.grp "
            "WHERE bs.tenant = (SELECT id FROM strings WHERE value = ?) AND (? IS NULL OR t.value = ?) "
            "GROUP BY 1, 2, 3, 4, 5 ORDER BY 1, 2, 3, 4, 5", (tenant, topic, topic))
        return [SchemaVersionRow(topic=r[0], schema_id=r[1], fingerprint=r[2], group=r[3], generation=r[4],
                                 blocks=r[5], min_time=r[6], max_time=r[7], record=r[8] or "") for r in rows]

    def tenant_tombstones(self, tenant: str) -> list[TombstoneRow]:
        rows = self.conn.execute(
            "SELECT seq, block_id, tenant, shard, created_at, reason, meta, delay_ms FROM tombstones WHERE tenant = ? "
            "ORDER BY seq", (tenant,))
        return [_tombstone(r) for r in rows]

    def erasure_rewrites(self, block_ids: Sequence[str]) -> dict[str, str]:
        """Of ``block_ids``, those an erasure replaced while their tombstones last, each with the erasure's id (the
        tombstone's reason, ``erased by <id> into <new>``)."""
        out: dict[str, str] = {}
        for start in range(0, len(block_ids), 500):
            chunk = list(block_ids[start:start + 500])
            rows = self.conn.execute(f"SELECT block_id, reason FROM tombstones WHERE block_id IN "
                                     f"({', '.join('?' * len(chunk))}) AND reason LIKE 'erased by %'", chunk)
            out.update({r[0]: r[1].split()[2] for r in rows})
        return out

    def erasure_states(self) -> dict[str, str]:
        """Every erasure's state (requested, rewriting, rewritten, done)."""
        return erasure_store.states(self.conn)

    def erased_positions(self, erasures: Sequence[str]) -> list[tuple[str, int, int, str]]:
        """The (topic, partition, offset, incarnation) of the records ``erasures`` remove."""
        return erasure_store.positions_of(self.conn, erasures)

    def erasure_delete_delay_ms(self, erasures: Sequence[str]) -> int:
        """The shortest delete delay ``erasures`` asked for (ms); 0 if none asked for one."""
        return erasure_store.shortest_delete_delay(self.conn, erasures)

    def tenant_tombstone_ids(self, tenant: str) -> set[str]:
        return {r[0] for r in self.conn.execute("SELECT block_id FROM tombstones WHERE tenant = ?", (tenant,))}

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[None]:
        """Reads of this thread inside the block see one state (one SQLite read transaction)."""
        self.conn.execute("BEGIN")
        try:
            yield
        finally:
            self.conn.execute("COMMIT")

    # -- the change feed (shale.index.changes) --------------------------------------------------------

    def block_changes(self, after: int, through: int) -> list[BlockChange]:
        """Changes of entries ``after < index <= through``, in log order."""
        return read_changes(self.conn, after, through)

    def changes_published_through(self) -> int:
        """The feed's trim point: every change up to it is published."""
        return published_through(self.conn)

    def change_metas(self, block_ids: list[str]) -> dict[str, BlockMeta]:
        """Metadata of blocks named by changes, removed ones included while their tombstones last."""
        return change_metas(self.conn, block_ids)

    def pending_change_entries(self) -> int:
        """How many log entries have changes not yet published."""
        return pending_entries(self.conn)

    def state_hash(self, *, with_applied: bool = True) -> str:
        """SHA-256 of every table's rows in primary-key order: equal on replicas that applied the same log.
        Without ``with_applied`` the applied index and term are left out: idempotence tests compare the state
        after a command applied once and twice, which differ only there (and in the change feed, keyed by index)."""
        digest = hashlib.sha256()
        skipped = () if with_applied else ("state", "block_changes")
        for table in [t for t in HASHED_TABLES if t not in skipped]:
            digest.update(table.encode())
            columns = ", ".join(f'"{r[1]}"' for r in self.conn.execute(f"PRAGMA table_info({table})"))
            for row in self.conn.execute(f"SELECT * FROM {table} ORDER BY {columns}"):
                digest.update(repr(row).encode())
        return digest.hexdigest()
