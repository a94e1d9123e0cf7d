"""The generation switches' store: the ``generations`` and ``generation_pins`` tables, their reads and their writes.
A switch makes a generation the one read for a topic's data over a time range (each topic's switches in order, the
later one winning where they overlap); a pin is an operator's switch and the newest generation it binds. When
ingestion switches a generation in, and what an operator's switch binds, is decided by
``shale.metastore.rules.generations`` inside the apply transaction; ``IndexWriter.add_generation_rule`` records a
switch in the change feed with it. The reads also run on read connections."""

from __future__ import annotations

import sqlite3

DDL = """
CREATE TABLE IF NOT EXISTS generations (
    tenant TEXT NOT NULL,
    topic TEXT NOT NULL,
    seq INTEGER NOT NULL,
    start INTEGER NOT NULL,
    "end" INTEGER NOT NULL,
    generation INTEGER NOT NULL,
    PRIMARY KEY (tenant, topic, seq)
) WITHOUT ROWID;

-- An operator's switch (SetActiveGeneration) over [start, end], and the newest generation of the topic it binds
-- (``binds``: every generation that had committed offsets of the topic when it was made): ingestion never switches
-- one of those generations in over it (``shale.metastore.rules.generations``). A table of its own, created on open, so
-- a state of the same schema version gains it empty (no switch of before was recorded as an operator's).
CREATE TABLE IF NOT EXISTS generation_pins (
    tenant TEXT NOT NULL,
    topic TEXT NOT NULL,
    seq INTEGER NOT NULL,
    start INTEGER NOT NULL,
    "end" INTEGER NOT NULL,
    generation INTEGER NOT NULL,
    binds INTEGER NOT NULL,
    PRIMARY KEY (tenant, topic, seq)
) WITHOUT ROWID;
"""


def rules(conn: sqlite3.Connection, tenant: str) -> list[tuple[str, int, int, int]]:
    """The tenant's switches, oldest first: (topic, start ms, end ms, generation)."""
    return [(r[0], r[1], r[2], r[3]) for r in conn.execute(
        'SELECT topic, start, "end", generation FROM generations WHERE tenant = ? ORDER BY seq', (tenant,))]


def rules_by_topic(conn: sqlite3.Connection, tenant: str) -> list[tuple[str, int, int, int]]:
    """The tenant's switches, each topic's oldest first: (topic, start ms, end ms, generation)."""
    return [(r[0], r[1], r[2], r[3]) for r in conn.execute(
        'SELECT topic, start, "end", generation FROM generations WHERE tenant = ? ORDER BY topic, seq', (tenant,))]


def rules_by_tenant(conn: sqlite3.Connection, topic: str) -> dict[str, list[tuple[int, int, int]]]:
    """Every tenant's switches of ``topic``, oldest first: (start ms, end ms, generation); one query."""
    found: dict[str, list[tuple[int, int, int]]] = {}
    for tenant, start, end, generation in conn.execute(
            'SELECT tenant, start, "end", generation FROM generations WHERE topic = ? ORDER BY tenant, seq', (topic,)):
        found.setdefault(str(tenant), []).append((int(start), int(end), int(generation)))
    return found


def add_rule(conn: sqlite3.Connection, tenant: str, topic: str, start: int, end: int, generation: int) -> bool:
    """Append a switch; False (nothing done) if the latest switch of this topic is the same one."""
    last = conn.execute(
        'SELECT start, "end", generation FROM generations WHERE tenant = ? AND topic = ? ORDER BY seq DESC LIMIT 1',
        (tenant, topic)).fetchone()
    if last is not None and tuple(last) == (start, end, generation):
        return False
    (seq,) = conn.execute("SELECT coalesce(max(seq), 0) + 1 FROM generations WHERE tenant = ? AND topic = ?",
                          (tenant, topic)).fetchone()
    conn.execute('INSERT INTO generations (tenant, topic, seq, start, "end", generation) VALUES (?, ?, ?, ?, ?, ?)',
                 (tenant, topic, seq, start, end, generation))
    return True


def pins(conn: sqlite3.Connection, tenant: str, topic: str) -> list[tuple[int, int, int]]:
    """The operator's switches of the topic, oldest first: (start ms, end ms, newest generation it binds)."""
    return [(r[0], r[1], r[2]) for r in conn.execute(
        'SELECT start, "end", binds FROM generation_pins WHERE tenant = ? AND topic = ? ORDER BY seq',
        (tenant, topic))]


def add_pin(conn: sqlite3.Connection, tenant: str, topic: str, start: int, end: int, generation: int,
            binds: int) -> bool:
    """Record an operator's switch; False (nothing done) if the latest one of this topic is the same."""
    last = conn.execute(
        'SELECT start, "end", generation, binds FROM generation_pins WHERE tenant = ? AND topic = ? '
        "ORDER BY seq DESC LIMIT 1", (tenant, topic)).fetchone()
    if last is not None and tuple(last) == (start, end, generation, binds):
        return False
    conn.execute(
        'INSERT INTO generation_pins (tenant, topic, seq, start, "end", generation, binds) SELECT ?, ?, '
        "coalesce(max(seq), 0) + 1, ?, ?, ?, ? FROM generation_pins WHERE tenant = ? AND topic = ?",
        (tenant, topic, start, end, generation, binds, tenant, topic))
    return True
