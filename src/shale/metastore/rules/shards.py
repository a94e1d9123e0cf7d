"""Ingest shards (issue 30): which driver of a group reads which topic-partition.

A group's generation has a **shard map**: its shard count and the map's version. A topic-partition belongs to
shard ``shard_of(topic, partition, count)``: Lamping and Veach's jump consistent hash of a fixed 64-bit hash of
``(topic, partition)``. It depends on nothing else, so a new topic or partition joins a shard without moving any
other, and every process (drivers, every metastore replica) computes the same answer. When the count grows from
``n`` to ``m`` only about ``1 - n/m`` of the partitions move, each to one of the new shards; when it shrinks, only
the partitions of the removed shards move. Offsets are per topic-partition, so a partition that moves resumes at
its committed end under its new shard's driver.

The map is stored in the index's ``ingest_shards`` table (``shale.index.leases``), written only from here inside
the apply transaction. The
first ``AcquireIngestLease`` of a group's generation seeds it with the driver's ``ingest.shards`` (version 0);
``SetIngestShards`` changes it and its version becomes that entry's log index. A lease granted before the current
version (its token, a log index, is smaller) no longer holds its shard: its commits and renewals are refused as
``resharded`` and its driver acquires a shard again under the new map. A commit whose ranges are not all of its
shard under the current map is refused as ``wrong-shard``; so two drivers can never both write one partition.

**Load-aware placement.** When the count changes, the state machine also places every partition the group has
committed (``ingest_placement``), by load: each commit's ranges carry the bytes their records took, and
``ingest_load`` keeps each partition's bytes per second of log time over windows of ``LOAD_WINDOW_MS``
(``record_load``). ``place`` moves as few partitions as a change needs: a shard that left (a vacant shard of an
automatic group, or one beyond the count an operator set) gives its partitions to the lightest shards, heaviest
first, and the shards left keep theirs (renumbered into the gaps, so that a driver finds its partitions again
under its own or the one free number); a new shard takes partitions from the heaviest shards, the heaviest that
still narrow the gap first, until no move would, so it ends near its share and nothing else moves. A partition the
placement does not hold (committed for the first time since) follows the hash of the current count. Both inputs
are replicated state and ``place`` depends on nothing else (ties broken by topic, partition and shard number), so
every replica computes the same placement, and a driver learns it from the answer that grants its lease (it
changes only with the map's version, which ends every lease granted before). Loads that drift while the drivers
stay are not rebalanced: partitions move only when the count changes.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Collection, Mapping

from shale.errors import CommandRejectedError
from shale.index import IndexWriter, Key, ShardMap, placement, shard_map
from shale.index import leases as store
from shale.index import offsets as offset_store
from shale.metastore.rules.commands import CommitIngestBatch, Result, SetIngestShards

_MASK = (1 << 64) - 1
MAX_SHARDS = 1024
LOAD_WINDOW_MS = 60_000
"""A partition's load is the bytes its commits brought per second of log time over a window this long."""


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


def seed(w: IndexWriter, group: str, generation: int, shards: int) -> ShardMap:
    """The group's map, created with ``shards`` at version 0 if it has none yet."""
    current = shard_map(w.conn, group, generation)
    if current is None:
        current = ShardMap(shards, 0)
        store.save_shard_map(w.conn, group, generation, current)
    return current


def resize(w: IndexWriter, group: str, generation: int, shards: int, index: int, now_ms: int,
           removed: Collection[int] = ()) -> ShardMap:
    """Set the group's count at version ``index`` (every lease granted before it stops holding its shard), and
    place the group's partitions for it (``removed``: the shards that left; by default those beyond the count)."""
    current = shard_map(w.conn, group, generation)
    before = current.shards if current else 1
    placed = placement(w.conn, group, generation)
    keys = placed.keys() | offset_store.committed_partitions(w.conn, group, generation)
    previous = {k: placed.get(k, shard_of(*k, before)) for k in keys}
    new_placement = place(weights(loads(w.conn, group, generation, now_ms), keys), previous, before, shards, removed)
    store.save_placement(w.conn, group, generation, new_placement)
    new = ShardMap(shards, index)
    store.save_shard_map(w.conn, group, generation, new)
    return new


def owner(conn: sqlite3.Connection, group: str, generation: int, topic: str, partition: int, shards: int) -> int:
    """The shard that reads ``topic[partition]`` under the group's current map of ``shards``."""
    shard = store.placed(conn, group, generation, topic, partition)
    return shard if shard is not None else shard_of(topic, partition, shards)


def record_load(w: IndexWriter, cmd: CommitIngestBatch, time_ms: int) -> None:
    """Count a commit's bytes into its partitions' load windows (a range without ``bytes``, from an older writer,
    counts nothing). A window ends at the first commit ``LOAD_WINDOW_MS`` after it began: its bytes per second
    become the partition's rate. A partition's first commit only opens its first window (it may carry a
    backlog)."""
    for r in cmd.ranges:
        if r.bytes is None or r.end <= r.start:
            continue
        key = (cmd.group, cmd.generation, r.topic, r.partition)
        row = store.load_window(w.conn, *key)
        rate, total, since = (row[0], row[1] + r.bytes, row[2]) if row else (-1, 0, time_ms)
        if time_ms - since >= LOAD_WINDOW_MS:
            rate, total, since = total * 1000 // (time_ms - since), 0, time_ms
        store.save_load_window(w.conn, *key, rate, total, since)


def loads(conn: sqlite3.Connection, group: str, generation: int, now_ms: int) -> dict[Key, int]:
    """Bytes per second of each partition whose load is known at ``now_ms``: the last whole window's rate; the
    current window's so far once it is overdue (the partition slowed down or stopped) or while no window has ended
    yet (after a second of it)."""
    known = {}
    for key, rate, total, since in store.load_windows(conn, group, generation):
        elapsed = now_ms - since
        if rate >= 0 and elapsed <= LOAD_WINDOW_MS:
            known[key] = rate
        elif elapsed >= 1000:
            known[key] = total * 1000 // elapsed
    return known


def weights(known: Mapping[Key, int], keys: Collection[Key]) -> dict[Key, int]:
    """What ``place`` balances: a partition's bytes per second, the mean of the known ones for a partition of
    unknown load, and at least 1 (with no load known at all, the partitions count alike)."""
    mean = sum(known.values()) // len(known) if known else 1
    return {k: max(1, known.get(k, mean)) for k in keys}


def renumber(before: int, shards: int, removed: Collection[int] = ()) -> dict[int, int]:
    """Where each shard of ``before`` that stays goes in a map of ``shards``: those of ``removed`` leave (and, if
    still too many stay, the highest); a shard that stays keeps its number if it is below ``shards``, else takes
    the lowest free one."""
    staying = [s for s in range(before) if s not in removed][:shards]
    kept = {s: s for s in staying if s < shards}
    free = iter(sorted(set(range(shards)) - set(kept)))
    return {**kept, **{s: next(free) for s in staying if s >= shards}}


def place(weight: Mapping[Key, int], previous: Mapping[Key, int], before: int, shards: int,
          removed: Collection[int] = ()) -> dict[Key, int]:
    """Each partition's shard among ``shards``, moving as few as the change from ``before`` shards needs and
    balancing ``weight`` (module docstring). ``previous``: each partition's shard among ``before``.

    The partitions of the shards that left go, heaviest first, each to the lightest shard. The shards no shard of
    ``before`` became (new ones) then take partitions from the others: the lightest new shard takes, from the
    heaviest old shard that has one, the heaviest partition lighter than the two shards' difference, until none
    is. Each partition moves at most once, and each move lowers the sum of the squared loads."""
    numbers = renumber(before, shards, removed)
    where = {k: numbers[previous[k]] for k in sorted(weight) if previous.get(k) in numbers}
    load = [0] * shards
    for k, s in where.items():
        load[s] += weight[k]
    for k in sorted((k for k in weight if k not in where), key=lambda k: (-weight[k], k)):
        where[k] = min(range(shards), key=lambda s: (load[s], s))
        load[where[k]] += weight[k]
    new = [s for s in range(shards) if s not in numbers.values()]
    if not new:
        return where
    held: dict[int, list[Key]] = {s: [] for s in range(shards)}
    for k in sorted(where, key=lambda k: (-weight[k], k)):
        held[where[k]].append(k)
    while True:
        to = min(new, key=lambda s: (load[s], s))
        move = next(((s, k) for s in sorted(set(range(shards)) - set(new), key=lambda s: (-load[s], s))
                     for k in held[s] if weight[k] < load[s] - load[to]), None)
        if move is None:
            return where
        s, k = move
        held[s].remove(k)
        where[k], load[s], load[to] = to, load[s] - weight[k], load[to] + weight[k]


def apply_set(w: IndexWriter, cmd: SetIngestShards, index: int, time_ms: int) -> Result:
    current = shard_map(w.conn, cmd.group, cmd.generation)
    if current is not None and current.shards == cmd.shards:
        return Result(ok=True, data={"changed": False, "shards": current.shards, "version": current.version})
    new = resize(w, cmd.group, cmd.generation, cmd.shards, index, time_ms)
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
                    if owner(w.conn, cmd.group, cmd.generation, r.topic, r.partition, count) != cmd.shard)
    if others:
        raise CommandRejectedError(f"{where}: {', '.join(others[:10])} belong to other shards of the group's "
                                   f"{count}: a driver commits only its own shard's partitions", reason="wrong-shard")
