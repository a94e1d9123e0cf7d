"""Changes to the index. Used only by the metastore's command handlers, inside their transaction.

Every method is deterministic: times come from the caller (the log entry), never from the clock.
"""

from __future__ import annotations

import sqlite3

import msgpack

from shale.block import BlockMeta
from shale.bucketindex import SET_HASH_MODULUS, block_id_hash, digest_of_set, set_hash
from shale.index import erasures as erasure_store
from shale.index import generations as generation_store
from shale.index.changes import PendingChanges
from shale.index.changes import trim as trim_changes
from shale.index.compaction_state import CompactionState
from shale.index.records import decode_meta, encode_meta
from shale.index.schema import PARTITION_WINDOW_MS

PACKED_CACHE = 10_000
"""Label-set combinations whose packed form a writer remembers (the cache starts over when full)."""


class IndexWriter:
    """Not thread-safe: one writer per connection, used by the thread that applies the log."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.compaction = CompactionState(conn)
        self._sids: dict[str, int] = {}
        self._partitions: dict[tuple[int, int, int], int] = {}
        self._packed: dict[tuple[tuple[tuple[str, str], ...], ...], list[list[int]]] = {}
        self.changes = PendingChanges()
        """Blocks added and removed by the command being applied: the change feed (``shale.index.changes``)."""
        self._links: dict[str, list[list[object]]] = {}
        """The links ``touch`` gave out during the command being applied, per tenant, finished by ``set_applied``."""

    # -- strings ------------------------------------------------------------------------------

    def intern(self, value: str) -> int:
        sid = self._sids.get(value)
        if sid is not None:
            return sid
        row = self.conn.execute("SELECT id FROM strings WHERE value = ?", (value,)).fetchone()
        if row is None:
            sid = int(self.conn.execute("INSERT INTO strings (value) VALUES (?)", (value,)).lastrowid or 0)
        else:
            sid = int(row[0])
        self._sids[value] = sid
        return sid

    def forget_cache(self) -> None:
        """After a rollback, ids created by the rolled-back transaction are gone."""
        self._sids.clear()
        self._packed.clear()
        self._partitions.clear()
        self.changes.clear()
        self._links.clear()

    # -- state ----------------------------------------------------------------------------------

    def applied(self) -> tuple[int, int]:
        rows = dict(self.conn.execute("SELECT key, value FROM state WHERE key IN ('applied_index', 'applied_term')"))
        return int(rows["applied_index"]), int(rows["applied_term"])

    def set_applied(self, index: int, term: int) -> None:
        """Record the applied entry, and the blocks its command added and removed (the change feed); finish the
        links its command gave out (``touch``)."""
        self._finish_links(index)
        self.changes.flush(self.conn, index)
        self.conn.executemany("UPDATE state SET value = ? WHERE key = ?",
                              [(index, "applied_index"), (term, "applied_term")])

    # -- blocks ---------------------------------------------------------------------------------

    def has_block(self, block_id: str) -> bool:
        return self.conn.execute("SELECT 1 FROM blocks WHERE id = ?", (block_id,)).fetchone() is not None

    def added_at(self, block_id: str) -> int | None:
        row = self.conn.execute("SELECT added_at FROM blocks WHERE id = ?", (block_id,)).fetchone()
        return int(row[0]) if row else None

    def get_block(self, block_id: str) -> BlockMeta | None:
        row = self.conn.execute("SELECT meta FROM blocks WHERE id = ?", (block_id,)).fetchone()
        return decode_meta(row[0]) if row else None

    def tombstoned(self, block_id: str) -> bool:
        return self.conn.execute("SELECT 1 FROM tombstones WHERE block_id = ?", (block_id,)).fetchone() is not None

    def add_block(self, meta: BlockMeta, added_at: int) -> bool:
        """Insert a block (False if it is already there)."""
        return bool(self.add_blocks([meta], added_at))

    def _ids_in(self, table_sql: str, ids: list[str]) -> set[str]:
        found: set[str] = set()
        for i in range(0, len(ids), 500):
            chunk = ids[i:i + 500]
            found.update(r[0] for r in self.conn.execute(table_sql.format(",".join("?" * len(chunk))), chunk))
        return found

    def existing(self, block_ids: list[str]) -> set[str]:
        return self._ids_in("SELECT id FROM blocks WHERE id IN ({})", block_ids)

    def tombstoned_among(self, block_ids: list[str]) -> set[str]:
        return self._ids_in("SELECT block_id FROM tombstones WHERE block_id IN ({})", block_ids)

    def _partition(self, tenant: int, shard: int, window: int, min_time: int, max_time: int) -> int:
        key = (tenant, shard, window)
        partition_id = self._partitions.get(key)
        if partition_id is None:
            self.conn.execute(
                "INSERT INTO partitions (window_start, tenant, shard, min_time, max_time, blocks) "
                "VALUES (?, ?, ?, ?, ?, 0) ON CONFLICT (tenant, shard, window_start) DO NOTHING",
                (window, tenant, shard, min_time, max_time))
            (partition_id,) = self.conn.execute(
                "SELECT id FROM partitions WHERE tenant = ? AND shard = ? AND window_start = ?", key).fetchone()
            self._partitions[key] = partition_id
        return int(partition_id)

    def add_blocks(self, metas: list[BlockMeta], added_at: int) -> list[str]:
        """Insert the blocks not yet present, in a few statements for the whole batch; return their ids.
        The caller has checked tombstones.

        Fast path: insert everything, assuming no block is present yet (the usual case); if one is, roll back
        to a savepoint and insert only the missing ones."""
        self.conn.execute("SAVEPOINT add_blocks")
        mark = self.changes.mark()
        try:
            added = self._insert(metas, added_at, set())
        except sqlite3.IntegrityError:
            self.conn.execute("ROLLBACK TO add_blocks")
            # Strings and partitions created since the savepoint are gone: their cached ids with them.
            self._sids.clear()
            self._packed.clear()
            self._partitions.clear()
            self.changes.forget_since(mark)
            added = self._insert(metas, added_at, self.existing([m.id for m in metas]))
        self.conn.execute("RELEASE add_blocks")
        return added

    def _label_sets(self, labels: list[dict[str, str]]) -> list[list[int]]:
        """A dataset's label sets as flat [name, value, name, value, ...] lists of string ids (seed 004), so a query
        matches labels without decoding the metadata. Blocks of one topic repeat the same label sets: packed once
        per writer (the ids of a rolled-back transaction are forgotten with the string cache)."""
        key = tuple([tuple(ls.items()) for ls in labels])
        packed = self._packed.get(key)
        if packed is None:
            if len(self._packed) >= PACKED_CACHE:
                self._packed.clear()
            packed = self._packed[key] = [[sid for k, v in ls for sid in (self.intern(k), self.intern(v))]
                                          for ls in key]
        return packed

    def _insert(self, metas: list[BlockMeta], added_at: int, present: set[str]) -> list[str]:
        # One pass per block over its datasets, for the blocks row (which also puts the block in the compaction
        # queue) and the change feed: this loop is most of the cost of an AddBlocks that SQLite does not account for,
        # so the caches are read inline (a string or partition id is never 0) and their methods called on a miss.
        rows = []
        schemas: list[tuple[str, int, int, int, str]] = []
        bounds: dict[int, list[int]] = {}
        record, intern, packb, label_sets = self.changes.record, self.intern, msgpack.packb, self._label_sets
        sids, partitions = self._sids, self._partitions
        for meta in metas:
            block_id = meta.id
            if block_id in present:
                continue
            present.add(block_id)
            tenant_name, shard = meta.tenant, meta.shard
            tenant = sids.get(tenant_name) or intern(tenant_name)
            time_ms, min_time, max_time = meta.time_ms, meta.min_time, meta.max_time
            window = time_ms - time_ms % PARTITION_WINDOW_MS
            pid = partitions.get((tenant, shard, window)) or self._partition(tenant, shard, window, min_time, max_time)
            b = bounds.get(pid)
            if b is None:
                bounds[pid] = [1, min_time, max_time]
            else:
                b[0] += 1
                b[1] = min(b[1], min_time)
                b[2] = max(b[2], max_time)
            # Per dataset: topic, kind, time range and label sets (packed as string ids).
            labels, n_rows, raw_bytes = [], 0, 0
            for ds in meta.datasets:
                topic, kind = ds.topic, ds.kind
                topic_id = sids.get(topic) or intern(topic)
                labels.append([topic_id, sids.get(kind) or intern(kind), ds.min_time, ds.max_time,
                               label_sets(ds.labels)])
                n_rows += ds.rows
                raw_bytes += ds.bytes
                if ds.schema_ids:
                    schemas.extend((block_id, topic_id, sid, tenant, ds.schema_fingerprint or "")
                                   for sid in ds.schema_ids)
            group = meta.group
            rows.append((block_id, pid, tenant, shard, meta.level, sids.get(group) or intern(group), meta.generation,
                         min_time, max_time, sum([f.size for f in meta.files]), n_rows, added_at, packb(labels),
                         encode_meta(meta), raw_bytes))
            record("add", tenant_name, block_id)
        self.conn.executemany(
            "INSERT INTO blocks (id, partition_id, tenant, shard, level, grp, generation, min_time, max_time, size, "
            "rows, added_at, labels, meta, raw_bytes, queued) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1)",
            rows)
        if schemas:
            self.conn.executemany("INSERT OR IGNORE INTO block_schemas (block_id, topic, schema_id, tenant, "
                                  "fingerprint) VALUES (?, ?, ?, ?, ?)", schemas)
        self.conn.executemany(
            "UPDATE partitions SET blocks = blocks + ?, min_time = min(min_time, ?), max_time = max(max_time, ?) "
            "WHERE id = ?", [(n, low, high, pid) for pid, (n, low, high) in sorted(bounds.items())])
        return [r[0] for r in rows]

    def remove_block(self, block_id: str) -> BlockMeta | None:
        row = self.conn.execute("SELECT partition_id, meta FROM blocks WHERE id = ?", (block_id,)).fetchone()
        if row is None:
            return None
        self.conn.execute("DELETE FROM blocks WHERE id = ?", (block_id,))
        meta = decode_meta(row[1])
        if any(ds.schema_ids for ds in meta.datasets):
            self.conn.execute("DELETE FROM block_schemas WHERE block_id = ?", (block_id,))
        self.changes.record("remove", meta.tenant, block_id)  # and it leaves the compaction queue with its row
        self.conn.execute("UPDATE partitions SET blocks = blocks - 1 WHERE id = ?", (row[0],))
        if self.conn.execute("DELETE FROM partitions WHERE id = ? AND blocks <= 0", (row[0],)).rowcount:
            self._partitions = {k: v for k, v in self._partitions.items() if v != row[0]}
        return meta

    def partition_blocks(self, tenant: str, shard: int, window_start: int, data_until: int = 2**62) -> list[str]:
        """The partition's blocks whose data ends at or before ``data_until`` (ms; default: all of them)."""
        return [r[0] for r in self.conn.execute(
            "SELECT b.id FROM blocks b JOIN partitions p ON b.partition_id = p.id JOIN strings s ON p.tenant = s.id "
            "WHERE s.value = ? AND p.shard = ? AND p.window_start = ? AND b.max_time <= ? ORDER BY b.id",
            (tenant, shard, window_start, data_until))]

    def touch(self, tenants: set[str], version: int, time_ms: int) -> dict[str, list[object]]:
        """Record that these tenants' blocks, tombstones or generation switches changed at ``version`` (the log
        index, at the log's ``time_ms``); return each tenant's link ``[previous version, version, time_ms]``
        (previous 0: its first change): a bucket index delta carries it, so that a reader can tell a missing
        delta from none (``shale.bucketindex.deltas``). ``set_applied`` appends the tenant's state digest and, if
        the entry changed them, its generation switches to each link it returned (the lists are filled in place),
        so the digest holds every change of the entry, including those made after this call."""
        previous = {t: self.tenant_version(t) for t in sorted(tenants)}
        self.conn.executemany(
            "INSERT INTO tenant_versions (tenant, version) VALUES (?, ?) "
            "ON CONFLICT (tenant) DO UPDATE SET version = excluded.version", [(t, version) for t in sorted(tenants)])
        links: dict[str, list[object]] = {t: [before, version, time_ms] for t, before in previous.items()}
        for tenant, link in links.items():
            self._links.setdefault(tenant, []).append(link)
        return links

    def _finish_links(self, index: int) -> None:
        """Stamp the entry's links with each tenant's state as the entry leaves it (``state_digest``: its blocks
        and generation switches) and the switches themselves if the entry changed them. A tenant whose blocks or
        switches the entry changed without a ``touch`` gets a new version all the same: no link vouches for that
        version, so every stale-tolerant reader's chain has a hole there instead of a silent gap."""
        untouched = self.changes.tenants() - self._links.keys()
        if untouched:
            self.touch(untouched, index, 0)
        switched = self.changes.tenants("generations")
        for tenant, links in self._links.items():
            rules = generation_store.rules_by_topic(self.conn, tenant)
            digest = digest_of_set(self._block_set_hash(tenant), rules)
            for link in links:
                link.extend([digest, [list(r) for r in rules] if tenant in switched else None])
        self._links.clear()

    def _block_set_hash(self, tenant: str) -> int:
        """The tenant's ``set_hash`` as the command being applied leaves it: the stored one, plus the blocks the
        command added, minus those it removed (a cost of the command's size, not of the tenant's history). A tenant
        without a stored one (a state written before they were kept) gets it from its blocks, once."""
        row = self.conn.execute("SELECT block_set FROM tenant_digests WHERE tenant = ?", (tenant,)).fetchone()
        if row is None:
            value = set_hash(self.tenant_block_ids(tenant))
        else:
            added, removed = self.changes.blocks_of(tenant)
            if not added and not removed:
                return int(row[0], 16)
            value = (int(row[0], 16) + sum(map(block_id_hash, added)) - sum(map(block_id_hash, removed))) \
                % SET_HASH_MODULUS
        self.conn.execute("INSERT INTO tenant_digests (tenant, block_set) VALUES (?, ?) ON CONFLICT (tenant) DO UPDATE "
                          "SET block_set = excluded.block_set", (tenant, f"{value:064x}"))
        return value

    def tenant_block_ids(self, tenant: str) -> list[str]:
        """The tenant's block ids (tombstoned ones are not blocks any more), by its partitions."""
        return [r[0] for r in self.conn.execute(
            "SELECT b.id FROM partitions p JOIN strings s ON p.tenant = s.id JOIN blocks b ON b.partition_id = p.id "
            "WHERE s.value = ?", (tenant,))]

    def tenant_version(self, tenant: str) -> int:
        row = self.conn.execute("SELECT version FROM tenant_versions WHERE tenant = ?", (tenant,)).fetchone()
        return int(row[0]) if row else 0

    def add_generation_rule(self, tenant: str, topic: str, start: int, end: int, generation: int) -> bool:
        """Append a switch (``shale.index.generations.add_rule``) and record it in the change feed; False (nothing
        done) if the latest switch of this topic is the same one."""
        if not generation_store.add_rule(self.conn, tenant, topic, start, end, generation):
            return False
        self.changes.record("generations", tenant, topic)
        return True

    def group_block_metas(self, group: str, *, generation: int | None = None,
                          tenant: str | None = None) -> list[BlockMeta]:
        """The live blocks of one group, of one generation and of one tenant when given (no string is created)."""
        sql = "SELECT b.meta FROM blocks b JOIN strings g ON b.grp = g.id"
        where: list[str] = ["g.value = ?"]
        args: list[str | int] = [group]
        if tenant is not None:
            sql += " JOIN strings t ON b.tenant = t.id"
            where.append("t.value = ?")
            args.append(tenant)
        if generation is not None:
            where.append("b.generation = ?")
            args.append(generation)
        return [decode_meta(r[0]) for r in self.conn.execute(f"{sql} WHERE {' AND '.join(where)} ORDER BY b.id",
                                                              args)]

    def tenant_block_metas(self, tenant: str) -> list[BlockMeta]:
        sid = self.intern(tenant)
        return [decode_meta(r[0]) for r in self.conn.execute("SELECT meta FROM blocks WHERE tenant = ? ORDER BY id",
                                                              (sid,))]

    def trim_changes(self, through: int) -> int:
        """Forget the change feed up to ``through`` (its consumer has published it)."""
        return trim_changes(self.conn, through)

    # -- tombstones -----------------------------------------------------------------------------

    def add_tombstone(self, meta: BlockMeta, created_at: int, reason: str, delay_ms: int = 0) -> None:
        """``delay_ms``: an erasure's shorter delete delay (0: ``block.delete_delay``); a block that still holds an
        erasure's records gets that erasure's delay where it is shorter (``erasures.held_delete_delay``)."""
        held = erasure_store.held_delete_delay(self.conn, meta)
        delay_ms = min(d for d in (delay_ms, held) if d) if delay_ms or held else 0
        self.conn.execute(
            "INSERT OR IGNORE INTO tombstones (block_id, tenant, shard, created_at, reason, meta, delay_ms) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (meta.id, meta.tenant, meta.shard, created_at, reason, encode_meta(meta), delay_ms))

    def tombstone_reason(self, block_id: str) -> str | None:
        row = self.conn.execute("SELECT reason FROM tombstones WHERE block_id = ?", (block_id,)).fetchone()
        return str(row[0]) if row else None

    def tombstone_tenants(self, block_ids: list[str]) -> set[str]:
        return {r[0] for i in range(0, len(block_ids), 500) for r in self.conn.execute(
            f"SELECT DISTINCT tenant FROM tombstones WHERE block_id IN ({','.join('?' * len(block_ids[i:i + 500]))})",
            block_ids[i:i + 500])}

    def delete_tombstones(self, block_ids: list[str]) -> int:
        cur = self.conn.executemany("DELETE FROM tombstones WHERE block_id = ?", [(b,) for b in block_ids])
        return cur.rowcount
