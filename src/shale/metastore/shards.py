"""Ingest shards (issue 30): which driver of a group reads which topic-partition.

A group's generation has a **shard map**: its shard count and the map's version. A topic-partition belongs to
shard ``shard_of(topic, partition, count)``: Lamping and Veach's jump consistent hash of a fixed 64-bit hash of
``(topic, partition)``. It depends on nothing else, so a new topic or partition joins a shard without moving any
other, and every process (drivers, every metastore replica) computes the same answer. When the count grows from
``n`` to ``m`` only about ``1 - n/m`` of the partitions move, each to one of the new shards; when it shrinks, only
the partitions of the removed shards move. Offsets are per topic-partition, so a partition that moves resumes at
its committed end under its new shard's driver.

The map is stored in the index's ``ingest_shards`` table, written only here inside the apply transaction. The
first ``AcquireIngestLease`` of a group's generation seeds it with the driver's ``ingest.shards`` (version 0);
``SetIngestShards`` changes it and its version becomes that entry's log index. A lease granted before the current
version (its token, a log index, is smaller) no longer holds its shard: its commits and renewals are refused as
``resharded`` and its driver acquires a shard again under the new map. A commit whose ranges are not all of its
shard under the current map is refused as ``wrong-shard``; so two drivers can never both write one partition.
"""

from __future__ import annotations

import hashlib
import sqlite3
from dataclasses import dataclass

from shale.errors import CommandRejectedError
from shale.index import IndexWriter
from shale.metastore.commands import CommitIngestBatch, Result, SetIngestShards

_MASK = (1 << 64) - 1
MAX_SHARDS = 1024


def _key(topic: str, partition: int) -> int:
    digest = hashlib.blake2b(f"{topic}\x00{partition}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def jump_hash(key: int, buckets: int) -> int:
    """Lamping and Veach, "A Fast, Minimal Memory, Consistent Hash Algorithm" (2014): a bucket in ``[0, buckets)``
    such that growing ``buckets`` by one moves a key only to the new bucket, and only 1/buckets of the keys."""
    if buckets < 1:
        raise ValueError(f"buckets must be at least 1, not {buckets}")
    b, j = -1, 0
    while j < buckets:
        b = j
        key = (key * 2862933555777941757 + 1) & _MASK
        j = int((b + 1) * (float(1 << 31) / float((key >> 33) + 1)))
    return b


def shard_of(topic: str, partition: int, shards: int) -> int:
    """The shard that reads ``topic[partition]`` when the group has ``shards`` shards."""
    return 0 if shards == 1 else jump_hash(_key(topic, partition), shards)


@dataclass(frozen=True)
class ShardMap:
    shards: int
    version: int
    """The log index of the ``SetIngestShards`` that set this count (0: seeded by the first lease)."""


def shard_map(conn: sqlite3.Connection, group: str, generation: int) -> ShardMap | None:
    row = conn.execute("SELECT shards, version FROM ingest_shards WHERE grp = ? AND generation = ?",
                       (group, generation)).fetchone()
    return ShardMap(int(row[0]), int(row[1])) if row else None


def shard_maps(conn: sqlite3.Connection) -> dict[tuple[str, int], ShardMap]:
    return {(str(g), int(n)): ShardMap(int(s), int(v))
            for g, n, s, v in conn.execute("SELECT grp, generation, shards, version FROM ingest_shards")}


def _save(conn: sqlite3.Connection, group: str, generation: int, shards: ShardMap) -> None:
    conn.execute("INSERT OR REPLACE INTO ingest_shards (grp, generation, shards, version) VALUES (?, ?, ?, ?)",
                 (group, generation, shards.shards, shards.version))


def seed(w: IndexWriter, group: str, generation: int, shards: int) -> ShardMap:
    """The group's map, created with ``shards`` at version 0 if it has none yet."""
    current = shard_map(w.conn, group, generation)
    if current is None:
        current = ShardMap(shards, 0)
        _save(w.conn, group, generation, current)
    return current


def resize(w: IndexWriter, group: str, generation: int, shards: int, index: int) -> ShardMap:
    """Set the group's count at version ``index`` (every lease granted before it stops holding its shard)."""
    new = ShardMap(shards, index)
    _save(w.conn, group, generation, new)
    return new


def apply_set(w: IndexWriter, cmd: SetIngestShards, index: int) -> Result:
    current = shard_map(w.conn, cmd.group, cmd.generation)
    if current is not None and current.shards == cmd.shards:
        return Result(ok=True, data={"changed": False, "shards": current.shards, "version": current.version})
    new = resize(w, cmd.group, cmd.generation, cmd.shards, index)
    return Result(ok=True, data={"changed": True, "shards": new.shards, "version": new.version,
                                 "previous": current.shards if current else None})


def check_commit_shard(w: IndexWriter, cmd: CommitIngestBatch) -> None:
    """Refuse a commit with a range of another shard (under the current map; one shard if the group has none) or
    a block of another shard."""
    current = shard_map(w.conn, cmd.group, cmd.generation)
    count = current.shards if current else 1
    where = f"ingest {cmd.group} generation {cmd.generation} shard {cmd.shard}"
    if cmd.shard >= count:
        raise CommandRejectedError(f"{where}: the group has {count} shard(s)", reason="wrong-shard")
    others = sorted(f"{r.topic}[{r.partition}]" for r in cmd.ranges
                    if shard_of(r.topic, r.partition, count) != cmd.shard)
    if others:
        raise CommandRejectedError(f"{where}: {', '.join(others[:10])} belong to other shards of the group's "
                                   f"{count}: a driver commits only its own shard's partitions", reason="wrong-shard")
