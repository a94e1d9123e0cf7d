"""Ingest shards (issue 30): the assignment of topic-partitions to shards, the group's shard map in the state
machine, the refusal of a commit of another shard's partition, and the change of the count while leases are
held (``resharded``)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from tests.factories import BASE_MS
from tests.unit.metastore.helpers import meta

from shale.metastore.rules.commands import (
    AcquireIngestLease,
    Command,
    CommitIngestBatch,
    OffsetRange,
    ReleaseIngestLease,
    RenewIngestLease,
    Result,
    SetIngestShards,
    encode,
)
from shale.metastore.rules.fsm import Entry, StateMachine
from shale.metastore.rules.leases import lease_rows
from shale.metastore.rules.shards import LOAD_WINDOW_MS, jump_hash, loads, place, renumber, shard_map, shard_of

DURATION = 10_000
TOPICS = st.text(alphabet="abcxyz-._", min_size=1, max_size=12)


@given(topic=TOPICS, partition=st.integers(0, 10_000), count=st.integers(1, 64))
def test_a_partitions_shard_is_in_range_and_moves_only_to_a_new_shard_when_the_count_grows(
        topic: str, partition: int, count: int) -> None:
    before, after = shard_of(topic, partition, count), shard_of(topic, partition, count + 1)
    assert 0 <= before < count
    assert after in (before, count)  # it stays, or moves to the one new shard: never between old shards


def test_growing_the_count_moves_about_the_new_shards_share_of_the_partitions() -> None:
    keys = [("t", p) for p in range(4000)]
    for n in (1, 2, 3, 7):
        moved = sum(shard_of(t, p, n) != shard_of(t, p, n + 1) for t, p in keys)
        share = len(keys) / (n + 1)
        assert 0.8 * share < moved < 1.2 * share, (n, moved)  # ~1/(n+1): nothing like hash-modulo's n/(n+1)
    counts = [sum(shard_of(t, p, 4) == s for t, p in keys) for s in range(4)]
    assert min(counts) > 0.8 * len(keys) / 4  # balanced


def test_jump_hash_matches_the_published_test_vectors() -> None:
    # The vectors every port of Lamping and Veach's JumpConsistentHash checks (Go's dgryski/go-jump among them).
    vectors = [(1, 1, 0), (42, 57, 43), (0xDEAD10CC, 1, 0), (0xDEAD10CC, 666, 361), (256, 1024, 520),
               (1, 128, 55), (129, 128, 120), (2**64 - 1, 128, 92), (128, 100_000_000, 38172097)]
    assert [jump_hash(k, b) for k, b, _ in vectors] == [want for _, _, want in vectors]


class Log:
    def __init__(self, path: Path) -> None:
        self.sm = StateMachine(path)
        self.index = 0
        self.now = BASE_MS
        self.ends: dict[tuple[str, int], int] = {}

    def apply(self, command: Command) -> Result:
        self.index += 1
        return self.sm.apply(Entry(self.index, 1, self.now), encode(command))

    def acquire(self, holder: str, shard: int, shards: int = 1) -> Result:
        return self.apply(AcquireIngestLease(group="backup", holder=holder, shard=shard, duration_ms=DURATION,
                                             shards=shards))

    def commit(self, token: int | None, shard: int, partitions: list[int], block_shard: int | None = None) -> Result:
        ranges, blocks = [], []
        for p in partitions:
            start = self.ends.get(("app", p), 0)
            ranges.append(OffsetRange(topic="app", partition=p, start=start, end=start + 5))
            blocks.append(meta(partition=p, start=start, end=start + 5, key=f"b/{self.index}/{p}",
                               shard=shard if block_shard is None else block_shard))
        result = self.apply(CommitIngestBatch(group="backup", lease=token, shard=shard, ranges=ranges,
                                              blocks=blocks))
        if result.ok:
            for p in partitions:
                self.ends[("app", p)] = self.ends.get(("app", p), 0) + 5
        return result


def _of(shards: int, granted: dict[str, Any] | None = None) -> dict[int, list[int]]:
    """The partitions 0..15 of topic app by shard: placed as the lease ``granted`` says, else by the hash."""
    placed = {(t, p): s for t, p, s in granted["placement"]} if granted else {}
    out: dict[int, list[int]] = {s: [] for s in range(shards)}
    for p in range(16):
        out[placed.get(("app", p), shard_of("app", p, shards))].append(p)
    return out


def _by_partition(by_shard: dict[int, list[int]]) -> dict[int, int]:
    return {p: s for s, ps in by_shard.items() for p in ps}


def test_the_first_lease_seeds_the_map_and_two_drivers_commit_their_own_shards(tmp_path: Path) -> None:
    log = Log(tmp_path / "s.db")
    a = log.acquire("a", 0, shards=2).data
    b = log.acquire("b", 1, shards=5).data  # a later driver's ingest.shards does not change the map
    assert (a["granted"], b["granted"], a["shards"], b["shards"]) == (True, True, 2, 2)
    assert shard_map(log.sm.writer.conn, "backup", 1).shards == 2  # type: ignore[union-attr]
    parts = _of(2)
    assert parts[0]
    assert parts[1]
    assert log.commit(a["token"], 0, parts[0]).ok
    assert log.commit(b["token"], 1, parts[1]).ok
    assert log.acquire("c", 2).data == {**log.acquire("c", 2).data, "granted": False, "reason": "no-such-shard"}


def test_a_commit_of_another_shards_partition_or_block_is_refused(tmp_path: Path) -> None:
    log = Log(tmp_path / "s.db")
    parts = _of(2)
    a = log.acquire("a", 0, shards=2).data["token"]
    refused = log.commit(a, 0, [parts[0][0], parts[1][0]])
    assert (refused.ok, refused.reason) == (False, "wrong-shard")
    assert f"app[{parts[1][0]}]" in refused.message
    mislabelled = log.commit(a, 0, [parts[0][0]], block_shard=1)
    assert (mislabelled.ok, mislabelled.reason) == (False, "malformed")
    assert log.ends == {}


def test_an_unsharded_group_takes_only_shard_0_commits(tmp_path: Path) -> None:
    log = Log(tmp_path / "s.db")
    assert log.commit(None, 0, [0, 1]).ok  # never leased, no map: one shard, tokenless writers as before
    refused = log.commit(None, 1, [2])
    assert (refused.ok, refused.reason) == (False, "wrong-shard")


def test_changing_the_count_fences_every_older_lease_and_a_partition_resumes_at_its_committed_end(
        tmp_path: Path) -> None:
    log = Log(tmp_path / "s.db")
    old = _of(2)
    a = log.acquire("a", 0, shards=2).data["token"]
    b = log.acquire("b", 1, shards=2).data["token"]
    assert log.commit(a, 0, old[0]).ok
    assert log.commit(b, 1, old[1]).ok
    changed = log.apply(SetIngestShards(group="backup", shards=3)).data
    assert changed == {"changed": True, "shards": 3, "version": log.index, "previous": 2}
    assert log.apply(SetIngestShards(group="backup", shards=3)).data["changed"] is False  # a retry changes nothing
    for token, shard in ((a, 0), (b, 1)):  # unexpired, but granted under the old map
        refused = log.commit(token, shard, _of(3)[shard])
        assert (refused.ok, refused.reason) == (False, "resharded")
        renewal = log.apply(RenewIngestLease(group="backup", shard=shard, holder="ab"[shard], token=token,
                                             duration_ms=DURATION))
        assert (renewal.ok, renewal.reason) == (False, "resharded")
        assert log.apply(ReleaseIngestLease(group="backup", shard=shard, holder="ab"[shard],
                                            token=token)).data["released"] is False
    rows = lease_rows(log.sm.writer.conn, log.now)
    assert [(r["shard"], r["holder"]) for r in rows] == [(0, ""), (1, ""), (2, "")]  # shard 2: never leased yet
    tokens, grants = {}, {}
    taken = log.acquire("c", 0).data  # a standby takes shard 0 of the new map before its old holder asks again
    assert taken["granted"]
    late = log.apply(RenewIngestLease(group="backup", shard=0, holder="a", token=a, duration_ms=DURATION))
    assert (late.ok, late.reason) == (False, "resharded")  # not stale-lease: the old holder acquires again, it
    log.apply(ReleaseIngestLease(group="backup", shard=0, holder="c", token=taken["token"]))  # does not stop
    for shard, holder in enumerate("bca"):
        granted = log.acquire(holder, shard).data
        assert granted["granted"]
        assert granted["shards"] == 3
        assert granted["token"] > changed["version"]
        assert granted["takeovers"] == 0  # a reshard is not a takeover
        tokens[shard], grants[shard] = granted["token"], granted
    assert grants[0]["placement"] == grants[1]["placement"] == grants[2]["placement"]  # one map, one placement
    assert {p for t, p, s in grants[0]["placement"]} == set(range(16))  # every committed partition is placed
    new = _of(3, grants[0])
    for shard in range(3):  # every partition continues at its committed end, whichever shard it is in now
        assert log.commit(tokens[shard], shard, new[shard]).ok
    assert log.ends == {("app", p): 10 for p in range(16)}


def test_shrinking_the_count_removes_a_shard_and_leaves_the_others_waiting_for_a_holder(tmp_path: Path) -> None:
    log = Log(tmp_path / "s.db")
    tokens = [log.acquire(h, s, shards=3).data["token"] for s, h in enumerate("abc")]
    log.apply(SetIngestShards(group="backup", shards=2))
    assert log.commit(tokens[2], 2, _of(3)[2]).reason == "resharded"
    assert log.acquire("c", 2).data["reason"] == "no-such-shard"
    rows = {r["shard"]: (r["holder"], r["shards"]) for r in lease_rows(log.sm.writer.conn, log.now)}
    assert rows == {0: ("", 2), 1: ("", 2)}  # the removed shard is gone (no alert for it); the others wait


def _auto(log: Log, holder: str, shard: int = 0) -> dict[str, Any]:
    return log.apply(AcquireIngestLease(group="backup", holder=holder, shard=shard, duration_ms=DURATION,
                                        auto=True)).data


def _renew(log: Log, holder: str, shard: int, token: int) -> Result:
    return log.apply(RenewIngestLease(group="backup", holder=holder, shard=shard, token=token, duration_ms=DURATION,
                                      auto=True))


def test_an_automatic_group_grows_for_a_joining_driver_and_shrinks_when_one_leaves_fenced_all_the_way(
        tmp_path: Path) -> None:
    """ingest.shards = auto: a driver that finds every shard held grows the map by one and takes the new shard (only
    partitions of the new shard move); the others are fenced (``resharded``) and take their own shards back; a
    driver that leaves (released, or silent past its lease) is dropped from the count at the next renewal."""
    log = Log(tmp_path / "s.db")
    a = _auto(log, "a")
    b = _auto(log, "b")  # every shard held: the map grows to 2, b takes shard 1
    assert (a["shard"], a["shards"], b["shard"], b["shards"]) == (0, 1, 1, 2)
    assert _auto(log, "b", shard=0)["token"] == b["token"]  # a retry of b's answer: the same lease, no growth
    assert log.commit(a["token"], 0, _of(1)[0]).reason == "resharded"
    a = _auto(log, "a", shard=0)  # a acquires its own shard again under the new map
    assert (a["granted"], a["shard"], a["shards"]) == (True, 0, 2)
    assert log.commit(a["token"], 0, _of(2)[0]).ok
    assert log.commit(b["token"], 1, _of(2)[1]).ok
    c = _auto(log, "c")  # the third driver joins: 2 -> 3, c takes shard 2
    assert (c["shard"], c["shards"]) == (2, 3)
    before, after = (_by_partition(_of(2)), _by_partition(_of(3, c)))
    moved = {p for p in range(16) if before[p] != after[p]}
    assert moved == set(_of(3, c)[2])  # only partitions of the new shard moved, each to it
    assert 4 <= len(moved) <= 6  # its share of 16 equal loads (nothing is known of them yet)
    assert log.commit(b["token"], 1, _of(2)[1]).reason == "resharded"  # fenced: its batch was of the old map
    stale = [p for p in _of(2)[0] if p in moved]
    a = _auto(log, "a", shard=0)
    b = _auto(log, "b", shard=1)
    assert [(x["shard"], x["shards"]) for x in (a, b)] == [(0, 3), (1, 3)]
    if stale:  # a commit naming a partition that moved is refused under the current map
        assert log.commit(a["token"], 0, stale).reason == "wrong-shard"
    for shard, lease in enumerate((a, b, c)):
        assert log.commit(lease["token"], shard, _of(3, c)[shard]).ok
    # b stops cleanly: its release makes the next renewal shrink the map to the two drivers left
    assert log.apply(ReleaseIngestLease(group="backup", holder="b", shard=1, token=b["token"])).data["released"]
    log.now += 1000
    shrunk = _renew(log, "c", 2, c["token"])  # type: ignore[arg-type]
    assert shrunk.ok
    assert (shrunk.data["shards"], shrunk.data["version"]) == (2, log.index)  # above c's token: c acquires again
    c = _auto(log, "c", shard=2)  # shard 2 is gone: c takes the free one (b's)
    a = _auto(log, "a", shard=0)
    assert [(x["shard"], x["shards"]) for x in (a, c)] == [(0, 2), (1, 2)]
    three, two = _of(3, b), _of(2, c)
    assert set(two[0]) == set(three[0]) | (set(two[0]) & set(three[1]))  # a kept its partitions and took some of b's
    assert set(two[1]) == set(three[2]) | (set(two[1]) & set(three[1]))  # c (shard 2, now 1) kept its own too
    # c dies (silent): a's renewals leave the map alone until c's lease expired, then shrink it to one shard
    for _ in range(3):
        log.now += DURATION // 3
        assert _renew(log, "a", 0, a["token"]).data["shards"] == 2  # type: ignore[arg-type]
    log.now += DURATION // 3 + 1
    assert _renew(log, "a", 0, a["token"]).data["shards"] == 1  # type: ignore[arg-type]
    assert log.commit(c["token"], 1, _of(2, c)[1]).reason == "resharded"  # the dead driver, if it wakes: fenced
    a = _auto(log, "a", shard=0)
    assert log.commit(a["token"], 0, list(range(16))).ok  # every partition resumes at its committed end
    assert log.ends == {("app", p): 15 for p in range(16)}  # three batches each, under maps of 2, 3 and 1 shards


# -- load-aware placement: shale.metastore.rules.shards.place ----------------------------------------------------------

WEIGHTS = st.lists(st.one_of(st.integers(1, 10), st.integers(1, 1_000_000)), min_size=0, max_size=60)


def _weights(values: list[int]) -> dict[tuple[str, int], int]:
    return {(f"t{i % 3}", i): w for i, w in enumerate(values)}


def _loads(where: dict[tuple[str, int], int], weight: dict[tuple[str, int], int], shards: int) -> list[int]:
    load = [0] * shards
    for k, s in where.items():
        load[s] += weight[k]
    return load


def _within_bound(load: list[int], weight: dict[tuple[str, int], int]) -> bool:
    """The heaviest shard is within one partition of the mean: at most twice the best any placement could do
    (no placement beats the mean or the heaviest partition)."""
    return not weight or max(load) <= sum(load) / len(load) + max(weight.values())


@given(values=WEIGHTS, shards=st.integers(1, 8))
def test_a_placement_from_scratch_places_every_partition_within_one_partition_of_the_mean(
        values: list[int], shards: int) -> None:
    weight = _weights(values)
    where = place(weight, {}, 0, shards)
    assert set(where) == set(weight)
    assert all(0 <= s < shards for s in where.values())
    assert _within_bound(_loads(where, weight, shards), weight)


@given(values=WEIGHTS, shards=st.integers(1, 8), joining=st.integers(1, 3))
def test_a_joining_shard_takes_partitions_only_for_itself_and_about_its_share(
        values: list[int], shards: int, joining: int) -> None:
    weight = _weights(values)
    start = place(weight, {}, 0, shards)
    after = place(weight, start, shards, shards + joining)
    moved = {k for k in weight if after[k] != start[k]}
    assert all(after[k] >= shards for k in moved)  # nothing moves between the shards that were there
    load = _loads(after, weight, shards + joining)
    mean = sum(load) / len(load)
    assert all(load[s] <= mean + max(weight.values(), default=0) for s in range(shards, shards + joining))
    assert _within_bound(load, weight)


@given(values=WEIGHTS, shards=st.integers(2, 8), data=st.data())
def test_a_leaving_shard_gives_away_only_its_own_partitions_and_the_others_keep_theirs(
        values: list[int], shards: int, data: st.DataObject) -> None:
    weight = _weights(values)
    start = place(weight, {}, 0, shards)
    removed = data.draw(st.sets(st.integers(0, shards - 1), min_size=1, max_size=shards - 1))
    left = shards - len(removed)
    after = place(weight, start, shards, left, removed)
    numbers = renumber(shards, left, removed)
    assert sorted(numbers) == sorted(set(range(shards)) - removed)
    assert sorted(numbers.values()) == list(range(left))
    assert all(after[k] == numbers[start[k]] for k in weight if start[k] not in removed)
    assert _within_bound(_loads(after, weight, left), weight)


@given(values=WEIGHTS, shards=st.integers(1, 8), change=st.integers(-3, 3), seed=st.randoms())
def test_placement_depends_only_on_its_inputs_not_their_order(values: list[int], shards: int, change: int,
                                                              seed: random.Random) -> None:
    weight = _weights(values)
    start = place(weight, {}, 0, shards)
    target = max(1, shards + change)
    shuffled_keys = list(weight)
    seed.shuffle(shuffled_keys)
    again = place({k: weight[k] for k in shuffled_keys}, {k: start[k] for k in reversed(shuffled_keys)}, shards,
                  target)
    assert again == place(weight, start, shards, target)


def test_a_joining_driver_takes_the_heavy_partitions_the_group_measured(tmp_path: Path) -> None:
    """The loads come from the commits' bytes over log time, replicated: a third driver joining a group whose four
    partitions carry nearly all the bytes takes its share of the bytes, not of the partitions."""
    log = Log(tmp_path / "s.db")
    a = _auto(log, "a")
    b = _auto(log, "b")
    a = _auto(log, "a")
    heavy = {0, 1, 2, 3}
    grants = {0: a, 1: b}
    for _ in range(2):  # the first commit opens each partition's load window, the one a minute later closes it
        for shard, lease in grants.items():
            ranges = []
            for p in _of(2, lease)[shard]:
                start = log.ends.get(("app", p), 0)
                ranges.append(OffsetRange(topic="app", partition=p, start=start, end=start + 5,
                                          bytes=6_000_000 if p in heavy else 6_000))
                log.ends[("app", p)] = start + 5
            blocks = [meta(partition=r.partition, start=r.start, end=r.end, key=f"b/{log.index}/{r.partition}",
                           shard=shard) for r in ranges]
            assert log.apply(CommitIngestBatch(group="backup", lease=lease["token"], shard=shard, ranges=ranges,
                                               blocks=blocks)).ok
        log.now += LOAD_WINDOW_MS
    rates = loads(log.sm.writer.conn, "backup", 1, log.now)
    assert {p: r for (_, p), r in rates.items()} == {p: 100_000 if p in heavy else 100 for p in range(16)}
    c = _auto(log, "c")
    assert (c["shard"], c["shards"]) == (2, 3)
    where = {(t, p): s for t, p, s in c["placement"]}
    weight = {k: rates[k] for k in where}
    assert sum(1 for k in heavy if where[("app", k)] == 2) >= 1  # the new shard took heavy partitions
    load = _loads(where, weight, 3)
    assert _within_bound(load, weight)
    assert max(load) < 2 * 100_000 + 12 * 100  # at most two heavy partitions per shard, not all four
