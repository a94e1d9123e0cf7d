"""The SQLite schema of the metadata index (seed 004). Each table family has a store that declares its tables beside
their reads and writes, and ``DDL`` joins them in the order the tables have always been created: the blocks family
here (``state``, ``strings``, ``partitions``, ``blocks``, ``block_schemas``, ``tombstones``, ``tenant_versions``,
read and written by ``IndexReader`` and ``IndexWriter``; and ``settings``, which holds the compaction failure
limit), the generation switches' in ``shale.index.generations``, the committed offsets' in ``shale.index.offsets``, the
ingest leases' and shard maps' in ``shale.index.leases``, the erasures' in ``shale.index.erasures``, the restore
journal's in ``shale.index.restores``, the compaction service's in ``shale.index.compaction_state`` and the change
feed's in ``shale.index.changes``.

Entries are partitioned by 6-hour window of block creation time (the ULID time), tenant and shard; each
partition keeps the data-time range of its blocks (seed 004's shard index) so a query skips partitions whose
data cannot match. Strings that repeat across entries (tenants, groups, label names and values) are stored once
in ``strings``.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from shale.index.changes import DDL as CHANGES_DDL
from shale.index.compaction_state import DDL as COMPACTION_DDL
from shale.index.compaction_state import QUEUE_INDEX
from shale.index.erasures import DDL as ERASURES_DDL
from shale.index.generations import DDL as GENERATIONS_DDL
from shale.index.leases import LEASES_DDL, SHARDS_DDL
from shale.index.offsets import DDL as OFFSETS_DDL
from shale.index.restores import DDL as RESTORES_DDL

SCHEMA_VERSION = 4
PARTITION_WINDOW_MS = 6 * 3600 * 1000

DDL = """
CREATE TABLE IF NOT EXISTS state (key TEXT PRIMARY KEY, value INTEGER NOT NULL);

CREATE TABLE IF NOT EXISTS strings (id INTEGER PRIMARY KEY, value TEXT NOT NULL UNIQUE);

CREATE TABLE IF NOT EXISTS partitions (
    id INTEGER PRIMARY KEY,
    window_start INTEGER NOT NULL,
    tenant INTEGER NOT NULL,
    shard INTEGER NOT NULL,
    min_time INTEGER NOT NULL,
    max_time INTEGER NOT NULL,
    blocks INTEGER NOT NULL DEFAULT 0,
    UNIQUE (tenant, shard, window_start)
);

CREATE TABLE IF NOT EXISTS blocks (
    id TEXT NOT NULL UNIQUE,
    partition_id INTEGER NOT NULL REFERENCES partitions(id),
    tenant INTEGER NOT NULL,
    shard INTEGER NOT NULL,
    level INTEGER NOT NULL,
    grp INTEGER NOT NULL,
    generation INTEGER NOT NULL,
    min_time INTEGER NOT NULL,
    max_time INTEGER NOT NULL,
    size INTEGER NOT NULL,
    rows INTEGER NOT NULL,
    added_at INTEGER NOT NULL,
    labels BLOB NOT NULL,
    meta BLOB NOT NULL,
    raw_bytes INTEGER NOT NULL DEFAULT 0,
    queued INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS blocks_by_partition_time ON blocks (partition_id, min_time);

-- Schema versions are data (issue 31): per live block and topic, the Schema Registry ids of the writer schemas its
-- rows were written with and the fingerprint of the schema they are stored under (typed parsers' datasets only).
CREATE TABLE IF NOT EXISTS block_schemas (
    block_id TEXT NOT NULL,
    topic INTEGER NOT NULL,
    schema_id INTEGER NOT NULL,
    tenant INTEGER NOT NULL,
    fingerprint TEXT NOT NULL,
    PRIMARY KEY (block_id, topic, schema_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS block_schemas_by_id ON block_schemas (tenant, schema_id);

CREATE TABLE IF NOT EXISTS tombstones (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    block_id TEXT NOT NULL UNIQUE,
    tenant TEXT NOT NULL,
    shard INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    reason TEXT NOT NULL,
    meta BLOB NOT NULL,
    delay_ms INTEGER NOT NULL DEFAULT 0  -- an erasure's shorter delete delay; 0: block.delete_delay
);

CREATE TABLE IF NOT EXISTS tenant_versions (
    tenant TEXT PRIMARY KEY,
    version INTEGER NOT NULL
) WITHOUT ROWID;

-- Each tenant's set hash of its block ids (shale.bucketindex.set_hash, 64 hex digits), kept by IndexWriter from what
-- each command adds and removes. Derived from blocks, so outside state_hash: a state of before has no row until its
-- tenant's next change, which computes it from the blocks once.
CREATE TABLE IF NOT EXISTS tenant_digests (
    tenant TEXT PRIMARY KEY,
    block_set TEXT NOT NULL
) WITHOUT ROWID;
""" + GENERATIONS_DDL + """
CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
""" + OFFSETS_DDL + LEASES_DDL + ERASURES_DDL + SHARDS_DDL + RESTORES_DDL + COMPACTION_DDL

# Version 1 -> 2: committed offsets learn their topic incarnation, their writer and the offsets they skipped;
# commits are keyed by incarnation. Deterministic, so every replica migrates its own copy the same way.
_MIGRATE_1_TO_2 = """
ALTER TABLE offsets ADD COLUMN incarnation TEXT NOT NULL DEFAULT '';
ALTER TABLE offsets ADD COLUMN writer TEXT NOT NULL DEFAULT '';
ALTER TABLE offsets ADD COLUMN skipped INTEGER NOT NULL DEFAULT 0;
ALTER TABLE commits RENAME TO commits_v1;
"""
_COPY_COMMITS_V1 = """
INSERT INTO commits (grp, generation, topic, partition, incarnation, start, "end", digest, committed_at)
    SELECT grp, generation, topic, partition, '', start, "end", digest, committed_at FROM commits_v1;
DROP TABLE commits_v1;
"""


def _migrate_2_to_3(conn: sqlite3.Connection) -> None:
    """Version 2 -> 3: the compaction queue becomes a flag on the blocks (one row less per block added), and blocks
    keep their uncompressed bytes (the sum over their datasets, read from the metadata JSON). Deterministic, so
    every replica migrates its own copy the same way; a state rebuilt by replaying the log reaches the same rows."""
    columns = {r[1] for r in conn.execute("PRAGMA table_info(blocks)")}
    has_queue = conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'compaction_queue'").fetchone() is not None
    conn.execute("BEGIN IMMEDIATE")
    if columns and "queued" not in columns:
        conn.execute("ALTER TABLE blocks ADD COLUMN raw_bytes INTEGER NOT NULL DEFAULT 0")
        conn.execute("ALTER TABLE blocks ADD COLUMN queued INTEGER NOT NULL DEFAULT 0")
        conn.execute("UPDATE blocks SET raw_bytes = (SELECT coalesce(sum(json_extract(d.value, '$.bytes')), 0) "
                     "FROM json_each(CAST(meta AS TEXT), '$.datasets') d)")
    if has_queue:
        conn.execute("UPDATE blocks SET queued = 1 WHERE id IN (SELECT block_id FROM compaction_queue)")
        conn.execute("DROP TABLE compaction_queue")
    conn.execute("UPDATE state SET value = 3 WHERE key = 'schema_version'")
    conn.execute("COMMIT")


_FILL_BLOCK_SCHEMAS = """
INSERT OR IGNORE INTO block_schemas (block_id, topic, schema_id, tenant, fingerprint)
    SELECT b.id, t.id, s.value, b.tenant, coalesce(json_extract(d.value, '$.schema_fingerprint'), '')
    FROM blocks b, json_each(CAST(b.meta AS TEXT), '$.datasets') d, json_each(d.value, '$.schema_ids') s
    JOIN strings t ON t.value = json_extract(d.value, '$.topic')
    WHERE json_type(d.value, '$.schema_ids') = 'array';
"""


def _migrate_3_to_4(conn: sqlite3.Connection) -> None:
    """Version 3 -> 4: the schema ids of the blocks already indexed, read from their metadata. Deterministic, so
    every replica migrates its own copy the same way."""
    conn.executescript("BEGIN IMMEDIATE;" + DDL + _FILL_BLOCK_SCHEMAS
                       + "UPDATE state SET value = 4 WHERE key = 'schema_version'; COMMIT;")


def connect(path: str, *, readonly: bool = False) -> sqlite3.Connection:
    """A connection with the settings every user of the index needs (WAL, foreign keys off, no autocommit)."""
    if readonly:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False, isolation_level=None)
    else:
        conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA busy_timeout=30000")
    conn.execute("PRAGMA cache_size=-131072")
    conn.execute("PRAGMA mmap_size=2147483648")
    return conn


def begin(conn: sqlite3.Connection) -> None:
    """Start a write transaction holding the state's write lock from its first statement (the apply transaction:
    the metastore's state machine decides where each one starts and ends)."""
    conn.execute("BEGIN IMMEDIATE")


def commit(conn: sqlite3.Connection) -> None:
    conn.execute("COMMIT")


def rollback(conn: sqlite3.Connection) -> None:
    conn.execute("ROLLBACK")


def checkpoint(conn: sqlite3.Connection) -> None:
    """Write the write-ahead log into the database file and empty it (the file is then complete on its own)."""
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def copy_state(path: Path, target: Path) -> None:
    """A consistent copy of the index at ``path``: SQLite's online backup from a separate read-only connection in
    one step, which is one read transaction, so the copy is exactly one committed state while a writer goes on
    (WAL mode lets readers and the writer overlap)."""
    target.unlink(missing_ok=True)
    source = connect(str(path), readonly=True)
    dest = sqlite3.connect(str(target))
    try:
        source.backup(dest)
    finally:
        dest.close()
        source.close()


def _add_column(conn: sqlite3.Connection, table: str, column: str) -> None:
    """A column added since the schema version last changed, to a table of before (deterministic: every replica
    adds it the same way)."""
    if column.split(maxsplit=1)[0] not in {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}:
        conn.execute(f"ALTER TABLE {table} ADD COLUMN {column}")


def create(conn: sqlite3.Connection) -> None:
    """Create the schema, or migrate an older one in place."""
    row = None
    if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'state'").fetchone():
        row = conn.execute("SELECT value FROM state WHERE key = 'schema_version'").fetchone()
    if row is not None and int(row[0]) > SCHEMA_VERSION:
        raise RuntimeError(f"the index has schema version {row[0]}; this Shale knows up to {SCHEMA_VERSION}: upgrade "
                           "Shale before opening it")
    if row is not None and int(row[0]) == 1:
        conn.executescript("BEGIN IMMEDIATE;" + _MIGRATE_1_TO_2 + DDL + _COPY_COMMITS_V1
                           + "UPDATE state SET value = 2 WHERE key = 'schema_version'; COMMIT;")
    if row is not None and int(row[0]) in (1, 2):
        _migrate_2_to_3(conn)
    if row is not None and int(row[0]) in (1, 2, 3):
        _migrate_3_to_4(conn)
    conn.executescript(DDL + CHANGES_DDL + QUEUE_INDEX)
    _add_column(conn, "erasures", "matched_by TEXT NOT NULL DEFAULT 'key'")  # rows from before: keys
    _add_column(conn, "erasures", "delete_delay_ms INTEGER NOT NULL DEFAULT 0")  # rows from before: the configured
    _add_column(conn, "tombstones", "delay_ms INTEGER NOT NULL DEFAULT 0")
    conn.execute("INSERT OR IGNORE INTO state (key, value) VALUES ('schema_version', ?)", (SCHEMA_VERSION,))
    conn.execute("INSERT OR IGNORE INTO state (key, value) VALUES ('applied_index', 0)")
    conn.execute("INSERT OR IGNORE INTO state (key, value) VALUES ('applied_term', 0)")
    conn.execute("INSERT OR IGNORE INTO settings (key, value) VALUES ('compaction_failure_limit', 3)")
